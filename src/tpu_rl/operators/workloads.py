"""The pipeline's three workloads: the JobSet operator, aimed at the run's cluster, with its manifest built
once per task execution from the run's scope; and the guards plugged into its extension points (the
cross-run lock on the shared conversion, the training record checked before every training submission)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from tpu_rl import checkpoints, manifests, preemption, watchdog
from tpu_rl import jobset_status as st
from tpu_rl.compat import AirflowException, AirflowFailException, AirflowSkipException
from tpu_rl.contract import (
    CAPACITY_CANDIDATES,
    XCOM_ATTEMPT_PREFIX,
    XCOM_CAPACITY,
    XCOM_EVALUATION,
    XCOM_PREEMPTIONS,
    XCOM_SUBMITTED_AT,
    XCOM_TRAINER_COMPLETED,
)
from tpu_rl.failover import Attempt, GiveUp, Outcome, next_candidate
from tpu_rl.hooks.gcs import (
    GcsLock,
    TrainingState,
    training_state,
)
from tpu_rl.operators.jobset import XCOM_JOBSET, JobSetOperator
from tpu_rl.operators.tpu_pools import TpuPoolPass
from tpu_rl.operators.training_record import (
    add_capacity_attempt,
    check_training_record,
    record_baseline,
    record_preemption,
    record_stall,
    recorded_preemptions,
)
from tpu_rl.output_checks import ConversionLockWait, OrbaxStep
from tpu_rl.preemption import PreemptionRecord
from tpu_rl.run_scope import RunScope, RunScoped
from tpu_rl.timestamps import parse_optional_time
from tpu_rl.training_metrics import (
    Evaluation,
    Score,
    describe_evaluation,
    parse_evaluation,
    restored_a_step,
    trainer_completed,
)
from tpu_rl.vocabulary import ANNOTATION_SUBMITTED_TRY
from tpu_rl.watchdog import Windows


class RunJobSetOperator(RunScoped, JobSetOperator):
    """A JobSet stage of the run: aimed at the cluster its params name (a Kubernetes connection, or GKE), in
    their namespace, with the manifest :meth:`stage_manifest` builds from its scope, once per task
    execution (the Rendered Template view shows both)."""

    def stage_manifest(self, scope: RunScope, context: Any) -> dict:
        raise NotImplementedError

    def resolve_scope(self, scope: RunScope, context: Any) -> None:
        self.namespace, self.cluster = scope.config.namespace, scope.cluster_target
        self.manifest = self.stage_manifest(scope, context)

    def trigger_kwargs(self) -> dict[str, Any]:
        """The JobSet keeps how far its trigger logged the workload's log, for a triggerer that takes over; the
        watchdog bounds how long its pods may take to run (a conversion's CPU node may come from the autoscaler:
        only the time from a pod's node counts)."""
        windows = Windows(start_seconds=self.scope.config.start_timeout_minutes * 60)
        return {**super().trigger_kwargs(), "log_cursor": True, "watchdog": windows.to_dict()}


class HfToMaxTextOperator(RunJobSetOperator):
    """Converts the Hugging Face checkpoint into the base checkpoint that runs of the same model and
    conversion settings share, unless it is already complete; at most one DAG run converts at a time.

    - The step folder ``.../0/`` is complete: skip (the reason is in the task log).
    - Else take the lock ``<converted_prefix>_tpu_rl_conversion.lock`` (:class:`~tpu_rl.hooks.gcs.GcsLock`;
      re-entrant for later tries of the same run and task), then submit or adopt this run's JobSet as
      any JobSetOperator does. The lock is released once that JobSet has ended: Completed, Failed or
      deleted (a kill or ``execution_timeout`` deletes it first). While the JobSet may still run, it stays.
    - Another run holds the lock: wait deferred until the step is complete (skip: converted by that run),
      the lock is released (try again) or it is stale (older than its holder's ``execution_timeout`` plus
      ``lock_stale_margin``: take it over).

    :param lock_poll_interval: seconds between checks while another run converts.
    :param lock_stale_margin: added to ``execution_timeout`` (or to a day without one) to make the age
        after which this task's lock counts as abandoned.
    :param items: item folders of the converted step.
    """

    def __init__(
        self,
        *,
        lock_poll_interval: float = 60,
        lock_stale_margin: timedelta = timedelta(minutes=30),
        items: Sequence[str] = ("items",),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.lock_poll_interval = lock_poll_interval
        self.lock_stale_margin = lock_stale_margin
        self.items = list(items)

    def stage_manifest(self, scope: RunScope, context: Any) -> dict:
        return manifests.hf_to_maxtext_jobset(scope.config, scope.run)

    def resolve_scope(self, scope: RunScope, context: Any) -> None:
        super().resolve_scope(scope, context)
        self.__dict__.pop("lock", None)  # Held by the task instance of the previous scope.

    # -- the lock ---------------------------------------------------------------------------------

    @property
    def stale_after(self) -> float:
        limit = self.execution_timeout or timedelta(days=1)
        return (limit + self.lock_stale_margin).total_seconds()

    @cached_property
    def lock(self) -> GcsLock:
        """The conversion lock, held by this task instance (one GCS client per task execution)."""
        scope = self.scope
        owner = {
            "dag_id": scope.run.dag_id,
            "run_id": scope.run.run_id,
            "task_id": scope.task_id,
            "try_number": scope.try_number,
        }
        return GcsLock(scope.bucket.json_object(scope.layout.conversion_lock_object), owner, self.stale_after, self.log)

    def _step(self) -> tuple[str, Any]:
        """The converted step folder's URI and verdict, now."""
        config, prefix = self.scope.config, self.scope.layout.converted_step_prefix
        verdict, _ = self.scope.storage_reads.run_now(config.gcs_bucket, OrbaxStep(prefix=prefix, items=self.items))
        return f"gs://{config.gcs_bucket}/{prefix}", verdict

    def _skip(self, reason: str) -> None:
        self.lock.release()  # An earlier try of ours converted it, then died before releasing.
        raise AirflowSkipException(reason)

    # -- the JobSetOperator's extension points ------------------------------------------------------

    def before_jobset(self, context: Any) -> None:
        """Skip a complete checkpoint; else hold the lock (or wait deferred for the run holding it)."""
        self._convert_or_wait(context, previous_holder=None)

    def after_jobset_ended(self, context: Any) -> None:
        self.lock.release()

    def on_abandon(self, deleted: bool) -> None:
        """Release the lock once this try's JobSet writes no more; while it may still run, keep it (a retry
        re-enters it, or it goes stale)."""
        if deleted:
            self._release_once_gone()
        else:
            self._release_unless_running()

    # -- execution --------------------------------------------------------------------------------

    def _convert_or_wait(self, context: Any, previous_holder: dict | None) -> None:
        """Returns holding the lock, with the step still to build; else skips or defers."""
        uri, verdict = self._step()
        if verdict.complete:
            self._skip(self._skip_reason(uri, previous_holder))
        self.log.info("%s must be (re)built: %s", uri, verdict.describe())
        acquired, state = self.lock.acquire()
        if not acquired:
            self.log.info(
                "%s is held by %s: waiting (deferred) until that conversion ends; this lock counts as stale "
                "%.0f s after it was written",
                self.lock.uri,
                state.describe(),
                state.stale_after(self.stale_after),
            )
            self._wait_for_holder(context, state.holder)
        try:
            uri, verdict = self._step()  # Completed by another run between the first check and the lock?
        except Exception:
            self.lock.release()
            raise
        if verdict.complete:
            self._skip(self._skip_reason(uri, previous_holder))

    def _skip_reason(self, uri: str, holder: dict | None) -> str:
        if holder:
            return (
                f"{uri} was converted by run {holder.get('run_id')} (DAG {holder.get('dag_id')}, task "
                f"{holder.get('task_id')}, try {holder.get('try_number')}) while this run waited for its lock: "
                "skipping the conversion"
            )
        return f"{uri} is already a complete checkpoint: skipping the conversion"

    def _wait_for_holder(self, context: Any, holder: dict) -> None:
        from tpu_rl.triggers.checkpoints import GcsOutputTrigger

        scope, remaining = self.scope, self._remaining_time(context)
        # The trigger gives up a minute before the task's own limit, with a message naming the holder.
        deadline = time.time() + (remaining.total_seconds() - 60 if remaining else 10 * 365 * 86400)
        self.defer(
            trigger=GcsOutputTrigger(
                scope.config.gcs_bucket,
                ConversionLockWait(
                    prefix=scope.layout.converted_step_prefix,
                    items=self.items,
                    lock_object=self.lock.object.name,
                    holder=holder,
                    stale_after=self.stale_after,
                ),
                deadline=deadline,
                poll_interval=self.lock_poll_interval,
                gcp_conn_id=scope.config.gcp_conn_id,
            ),
            method_name="lock_wait_complete",
            timeout=remaining,
        )

    def lock_wait_complete(self, context: Any, event: dict[str, Any]) -> dict | None:
        holder = event.get("holder") or {}
        if event["status"] == "complete":
            self._skip(self._skip_reason(event["uri"], holder))
        if event["status"] == "incomplete":
            raise AirflowException(
                f"Gave up waiting for the conversion of run {holder.get('run_id')} (task {holder.get('task_id')}, "
                f"try {holder.get('try_number')}) before this try's execution_timeout; a retry waits again, and "
                f"takes the lock over once it is stale. Last check: {event.get('message')}"
            )
        self.log.info("The lock of run %s is %s: trying again", holder.get("run_id"), event["status"])
        self._convert_or_wait(context, previous_holder=holder)
        return self.run_jobset(context)

    def _release_unless_running(self) -> None:
        """After a failed submit/adopt: release unless this run's JobSet may still be writing."""
        try:
            meta = self.manifest["metadata"]
            jobset = self.hook.get_jobset(meta["name"], meta.get("namespace") or self.namespace)
        except Exception as error:  # Cannot tell: keep the lock (a retry re-enters it; else it goes stale).
            self.log.warning("Keeping the conversion lock: could not read this run's JobSet (%s)", error)
            return
        if jobset is None or st.terminal_condition(jobset) is not None:
            self.lock.release()
        else:
            self.log.warning("Keeping the conversion lock: JobSet %s still runs", jobset["metadata"]["name"])

    def _release_once_gone(self) -> None:
        """Killed or timed out: the JobSetOperator deleted the JobSet; once it is gone, release the lock."""
        t = self.tracked
        try:
            self.hook.wait_until_gone(t["name"], t["namespace"], t["uid"], timeout=min(self.deletion_timeout, 30))
            self.lock.release()
        except Exception as error:
            self.log.warning("Keeping the conversion lock: JobSet %s is not gone yet (%s)", t["name"], error)


class TrainRlOperator(TpuPoolPass, RunJobSetOperator):
    """Trains; before it submits a new JobSet (not when it adopts a running or Completed one) it checks the
    run's training record, so a retry or a clear of ``train_rl`` never resumes with changed parameters.

    A training that fails because it was preempted (``jobset_status.preemption``: a Spot VM reclaimed, TPU host
    maintenance, a lost host) is resumed in the same try, deferred again: the step folders that are not whole
    are set aside, the failed JobSet is replaced, and the trainer restores the newest complete step. Up to
    ``max_preemptions`` per run (counted in the training record); beyond, the task fails without a retry.
    Any other failure fails the try, as Airflow's retries expect. Every end pushes the XCom
    ``preemptions`` (:func:`tpu_rl.preemption.accounting`) for the run's summary.

    With several ``capacity_candidates`` each try first brings the run's pools to the candidate the run is on
    (:class:`~tpu_rl.operators.tpu_pools.TpuPoolPass`: adopting what create_tpu_pools or an earlier try made), and
    a preemption counts against ``max_preemptions_per_candidate`` too: past it, the JobSet is deleted, the pools
    move to the next candidate (deleted, created there; past the last the task fails) and the training is
    resubmitted there, resuming from its newest complete checkpoint as after any preemption.

    While it waits, its trigger logs the training's progress from the event files in the bucket. Once the
    JobSet Completed it pushes the trainer's evaluation (XCom ``evaluation``: the before and after figures,
    None when the log showed none), for the quality gate, the published Asset event and the run's summary.
    """

    #: The Orbax items of a training step (MaxText 0.2.4; maxtext.md).
    items = ("model_params", "optimizer_state")

    def stage_manifest(self, scope: RunScope, context: Any) -> dict:
        return manifests.training_jobset(scope.config, scope.run)

    def execute(self, context: Any) -> dict | None:
        if len(self.bind_scope(context).config.candidates) > 1:
            return self.pass_from_resume_point(context)  # then pools_ready: the JobSet
        return super().execute(context)

    def pools_ready(self, context: Any, candidate: int, attempts: list[dict[str, Any]]) -> dict | None:
        """The pools are RUNNING on the run's candidate: XCom ``capacity`` says which (it stands for
        create_tpu_pools's once pushed), and the training's JobSet is adopted or submitted."""
        super().pools_ready(context, candidate, attempts)
        return self.run_jobset(context)

    def trigger_kwargs(self) -> dict[str, Any]:
        config, layout = self.scope.config, self.scope.layout
        windows = Windows(
            start_seconds=config.start_timeout_minutes * 60,
            first_step_seconds=config.first_step_timeout_minutes * 60,
            stall_seconds=config.stall_timeout_minutes * 60,
            bound_scheduling=config.slice_is_the_runs_own,
        )
        return {
            **super().trigger_kwargs(),
            "training": {
                "bucket": config.gcs_bucket,
                "prefix": layout.tensorboard_prefix,
                "train_steps": config.train_steps,
                "gcp_conn_id": config.gcp_conn_id,
            },
            "watchdog": windows.to_dict(),
        }

    def after_stuck(self, context: Any, event: dict[str, Any]) -> None:
        """Records the stall in the run's training record; the same stall again (its kind, at the same step) fails
        the task for good: a retry would spend its slice time stalling there once more."""
        scope, stuck = self.scope, event.get("stuck") or {}
        earlier = record_stall(scope.bucket, scope.layout.training_record_object, stuck)[:-1]
        if watchdog.repeated(earlier, stuck):
            message = watchdog.repeated_message(stuck, self.scope.config)
            raise AirflowFailException(f"{message}\n{event['message']}")
        self.log.warning("The watchdog ended the training; a retry resumes from the newest complete checkpoint")

    def after_completed(self, context: Any, event: dict[str, Any]) -> None:
        kept = event.get("evaluation_lines") or []
        evaluation = self._with_baseline(parse_evaluation(kept), restored_a_step(kept))
        self.log.info("%s", describe_evaluation(evaluation, self.scope.config))
        context["ti"].xcom_push(key=XCOM_EVALUATION, value=evaluation.to_dict() if evaluation else None)
        # verify_training reads it: a run that ended on a checkpoint boundary before its planned steps is done
        # only if the trainer said so (the line is kept however long the evaluation after it printed).
        context["ti"].xcom_push(key=XCOM_TRAINER_COMPLETED, value=trainer_completed(kept))

    def _with_baseline(self, evaluation: Evaluation | None, restored: bool) -> Evaluation | None:
        """The attempt's evaluation with the run's figures before training: those of its first attempt, kept in
        the training record. An attempt that ``restored`` a step (a retry, a clear, a preemption: its ``Pre``
        line evaluates trained weights) never provides them, even when the first attempt's were lost (a
        triggerer restarted after the kubelet rotated the log): then there are none, rather than wrong ones."""
        layout = self.scope.layout
        before = evaluation.before if evaluation and not restored else None
        if evaluation and restored:
            evaluation = Evaluation(before=None, after=evaluation.after)
        try:
            recorded = record_baseline(
                self.scope.bucket, layout.training_record_object, asdict(before) if before else None
            )
        except Exception as error:  # The figures inform the gate: without the record, the attempt's own.
            self.log.warning("Could not keep the evaluation before training in the run's record: %s", error)
            return evaluation
        if not recorded or (before and asdict(before) == recorded):
            return evaluation
        self.log.info(
            "Evaluation before training: the run's first attempt's figures, from %s (this attempt's "
            "own Pre line evaluated the weights it resumed from)",
            layout.uri(layout.training_record_object),
        )
        return Evaluation(before=Score(**recorded), after=evaluation.after if evaluation else None)

    def before_submit(self, context: Any) -> None:
        scope = self.scope
        check_training_record(scope.bucket, scope.layout.training_record_object, scope.training_record, self.log)

    def after_failed(self, context: Any, event: dict[str, Any]) -> dict | None:
        """A later attempt resumes: keep this one's figures before training. A preempted training is resumed
        (or, when its final save was already done, is complete)."""
        kept = event.get("evaluation_lines") or []
        self._with_baseline(parse_evaluation(kept), restored_a_step(kept))
        return self._resume_after_preemption(context, event) if event.get("preemption") else None

    def after_jobset_ended(self, context: Any) -> None:
        self._push_accounting(context, None)

    def _resume_after_preemption(self, context: Any, event: dict[str, Any]) -> dict | None:
        """Applies what :func:`tpu_rl.preemption.decide` makes of the preemption: a training preempted after its
        final save (during the evaluation after training, say) is complete (resubmitting it would reload the model
        and evaluate twice for nothing); else what is not whole is set aside, the preemption recorded, and the
        training resubmitted, deferred, or the task failed once the run's budget is spent."""
        scope, config = self.scope, self.scope.config
        state, now = self._training_state(), datetime.now(UTC)
        started = (context["ti"].xcom_pull(task_ids=self.task_id, key=XCOM_JOBSET) or {}).get("created")
        decision = preemption.decide(
            steps=state.steps,
            committed_at=state.committed_at,
            last_step=state.last_step,
            attempt_started=parse_optional_time(started),
            trainer_completed=trainer_completed(event.get("evaluation_lines") or []),
            recorded=len(recorded_preemptions(scope.bucket, scope.layout.training_record_object)),
            cause=event["preemption"],
            now=now,
            train_steps=config.train_steps,
            checkpoint_period=config.checkpoint_period,
            max_preemptions=config.max_preemptions,
            set_aside_root=scope.layout.uri(scope.layout.set_aside_prefix),
            candidate=self._serving_candidate(context),
        )
        if isinstance(decision, preemption.TrainingComplete):
            self.log.warning(
                "Preempted after its final save (actor/%d/ is the run's last step): the training is complete, not "
                "resubmitted.\n%s",
                decision.step,
                event["message"],
            )
            return self.succeed(context, {**event, "message": f"training complete at step {decision.step}"})
        self._apply_moves(decision.moves, decision.doubted)
        records = record_preemption(scope.bucket, scope.layout.training_record_object, decision.record)
        attempts = self._count_on_candidate(decision.record)
        if isinstance(decision, preemption.BudgetSpent):
            message = preemption.budget_spent_message(decision.record, config.max_preemptions, decision.newest_complete)
            raise AirflowFailException(f"{message}\n{event['message']}")
        self.log.warning("%s", preemption.resume_message(decision.record, config.max_preemptions))
        self.log.info("The preempted attempt:\n%s", event["message"])
        self._push_accounting(context, records)
        name, namespace, uid = event["name"], event["namespace"], event["uid"]
        self.hook.delete_jobset(name, namespace, uid=uid)
        self.hook.wait_until_gone(name, namespace, uid, self.deletion_timeout)
        if attempts is not None:
            return self._resume_on_candidate(context, attempts)
        return self.run_jobset(context)  # Submits the resumed training and defers.

    def _resume_on_candidate(self, context: Any, attempts: list[Attempt]) -> dict | None:
        """Resumes where ``failover.next_candidate`` says after this preemption: on the same candidate, as with one
        candidate (the pools are left to GKE's repair, the JobSet waits for their nodes), or, past
        ``max_preemptions_per_candidate`` there, on the next once the pools moved; past the last candidate the task
        fails, the checkpoints kept."""
        config = self.scope.config
        decision = next_candidate(config.candidates, attempts, config.max_preemptions_per_candidate)
        if isinstance(decision, GiveUp):
            raise AirflowFailException(
                f"{decision.message()}\nThe training's checkpoints are kept: clearing train_rl resumes from its "
                "newest complete step on the candidate its pools are RUNNING on."
            )
        self.log.warning("%s", decision.why)
        made = [attempt.to_json() for attempt in attempts]
        if decision.leaving is None:
            return self.pools_ready(context, decision.index, made)
        return self.pass_on(context, decision.index, made)

    def _serving_candidate(self, context: Any) -> int | None:
        """The capacity candidate the run's slices came from (this try's XCom ``capacity``, else
        create_tpu_pools's); None with one candidate."""
        if len(self.scope.config.candidates) == 1:
            return None
        ti = context["ti"]
        pulled = ti.xcom_pull(task_ids=self.task_id, key=XCOM_CAPACITY) or ti.xcom_pull(
            task_ids=CAPACITY_CANDIDATES.task, key=CAPACITY_CANDIDATES.key
        )
        return (pulled or {}).get("serving", 0)

    def _count_on_candidate(self, record: PreemptionRecord) -> list[Attempt] | None:
        """With several candidates, the preemption is also one of the run's capacity attempts: the candidate's
        preemptions are counted against ``max_preemptions_per_candidate`` (``failover.next_candidate``), by this
        try and by a later one, from the record. Returns the run's attempts (None: one candidate)."""
        if record.candidate is None:
            return None
        attempt = Attempt(record.candidate, Outcome.PREEMPTED, record.reason, record.preempted_at)
        return add_capacity_attempt(self.scope.bucket, self.scope.layout.training_record_object, attempt)

    def _training_state(self) -> TrainingState:
        """What the preempted training left in the bucket."""
        config, layout = self.scope.config, self.scope.layout
        return self.scope.storage_reads.run_now(
            config.gcs_bucket,
            lambda reader: training_state(
                reader, layout.actor_checkpoints_prefix, layout.tensorboard_prefix, self.items
            ),
        )

    def _apply_moves(self, moves: Sequence[tuple[int, str, str]], doubted: Sequence[tuple[int, str]]) -> None:
        """Moves each step folder out of the checkpoint manager's view (copied, then removed), logging both places;
        warns of the committed steps the trainer restores though their leaves fail the check."""
        layout = self.scope.layout
        for step, why in doubted:
            self.log.warning(
                "actor/%d/ is committed (%s) but %s: Orbax restores a committed step, so the trainer resumes from it "
                "(the leaf layout of Pathways' persistence is not documented)",
                step,
                checkpoints.COMMIT_SUCCESS,
                why,
            )
        for step, why, folder in moves:
            source, destination = f"{layout.actor_checkpoints_prefix}{step}/", layout.set_aside_prefix + folder
            count = self.scope.bucket.move_folder(source, destination)
            self.log.warning(
                "actor/%d/ is not a complete step (%s): set aside, %d objects moved from %s to %s",
                step,
                why,
                count,
                layout.uri(source),
                layout.uri(destination),
            )

    def _push_accounting(self, context: Any, records: list[PreemptionRecord] | None) -> None:
        """The run's preemptions so far, as XCom ``preemptions``; read from the record unless just written."""
        config = self.scope.config
        if records is None:
            try:
                records = recorded_preemptions(self.scope.bucket, self.scope.layout.training_record_object)
            except Exception as error:  # The accounting informs; it never decides the task's outcome.
                self.log.warning("Could not read the run's preemptions from its training record: %s", error)
                return
        context["ti"].xcom_push(key=XCOM_PREEMPTIONS, value=preemption.accounting(records, config.max_preemptions))


class MaxTextToHfOperator(RunJobSetOperator):
    """Exports the step the final-checkpoint sensor resolved, into a fresh prefix per submitting try."""

    def __init__(self, *, step_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_task_id = step_task_id

    def stage_manifest(self, scope: RunScope, context: Any) -> dict:
        step = context["ti"].xcom_pull(task_ids=self.step_task_id)
        if step is None:
            raise ValueError(f"No final training step from task {self.step_task_id}")
        prefix = scope.layout.export_attempt_prefix(scope.try_number)
        return manifests.maxtext_to_hf_jobset(scope.config, scope.run, int(step), prefix)

    def on_tracked(self, context: Any, jobset: dict) -> None:
        """An adopted JobSet writes where the try that submitted it told it to: publish that prefix."""
        meta = jobset["metadata"]
        submitted_try = int((meta.get("annotations") or {}).get(ANNOTATION_SUBMITTED_TRY) or context["ti"].try_number)
        context["ti"].xcom_push(key=XCOM_ATTEMPT_PREFIX, value=self.scope.layout.export_attempt_prefix(submitted_try))
        context["ti"].xcom_push(key=XCOM_SUBMITTED_AT, value=meta.get("creationTimestamp"))
