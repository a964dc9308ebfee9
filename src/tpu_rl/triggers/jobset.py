"""Trigger that waits for a JobSet to finish, in the triggerer, without holding a worker slot.

It keeps three long-lived requests open: a watch of the JobSet, a watch of its pods, and the followed
log of the workload container. Progress and log lines go to the task's log; the pods' last state
and the log's tail stay in memory, because a finished JobSet's pods can vanish before anyone reads them.
So do the trainer's evaluation lines, which a long log would scroll out of the tail. For the training it
also reads the trainer's TensorBoard event files at most once a minute and logs its progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from tpu_rl import jobset_status as st
from tpu_rl import watchdog
from tpu_rl.hooks.gcs import GcsReadHook
from tpu_rl.hooks.in_thread import in_thread
from tpu_rl.hooks.kubernetes import AsyncKubernetesApiHook, ClusterTarget
from tpu_rl.timestamps import posix_time
from tpu_rl.triggers.training_progress import TrainingProgress
from tpu_rl.triggers.wait_progress import Progress
from tpu_rl.triggers.workload_log import (
    JobSetLogRecord,
    LogPrinter,
    WorkloadLogFollower,
    carried_through,
    remote_logging,
    wait_event,
)

#: After the JobSet finished, how long the training's last progress read may take.
TRAINING_LAST_READ_SECONDS = 30
#: Once the JobSet finished, how long the wait's helpers (pods, log, progress) may take to stop when cancelled.
HELPERS_STOP_SECONDS = 30
#: Once cancelled, how long the trigger may take to read its task's state and delete the JobSet (Airflow 3.3
#: gives ``on_kill`` 30 s by default).
CANCEL_DECISION_SECONDS = 30
#: Seconds between two looks of the watchdog (``watchdog.check``) while the workload runs.
WATCHDOG_INTERVAL_SECONDS = 15
#: A wait starts within this many seconds, at random: a triggerer that takes many waits at once (another one's, on
#: its death or stall; its own, on a restart) would otherwise start them in one pass of its event loop, each with its
#: first requests' TLS set-ups, and stall every trigger it runs (make bench-triggerer: 0.3 s at 25 at once).
START_SPREAD_SECONDS = 5.0


class JobSetTrigger(BaseTrigger):
    """Fires once the JobSet ``namespace/name`` (that incarnation: ``uid``) is Completed, Failed or gone.

    :param cluster: the cluster (a :class:`~tpu_rl.hooks.kubernetes.ClusterTarget`, or its ``to_dict()``), a GKE
        cluster with its endpoint resolved.
    :param progress_interval: seconds between progress lines when nothing changes (changes are
        logged when they happen).
    :param log_tail_lines: how many last lines of the workload log the event carries.
    :param delete_on_kill: delete the JobSet when the task leaves the deferral while the trigger waits (a user
        marks it failed or clears it, its timeout expires); never when the wait goes to another triggerer.
    :param training: for the training, where its event files are (see
        :class:`~tpu_rl.triggers.training_progress.TrainingProgress`): its progress is logged at most once
        per interval, and once more when it ended if the trainer wrote more since (the step it got to).
    :param log_cursor: record on the JobSet how far the workload's log was logged (the annotation
        ``tpu-rl.dev/log-cursor``), so that the wait taken over by another triggerer goes on after the last line
        logged (see :class:`~tpu_rl.triggers.workload_log.LogPrinter`); lines are then logged once a minute.
        Without it, lines are logged as they come, and a takeover logs the log again from its start.
    :param watchdog: the windows of :mod:`tpu_rl.watchdog` (``Windows.to_dict()``): a workload whose pods do not
        all run, whose trainer writes no first step, or that stalls, past its window, has its JobSet deleted and
        the wait ends with ``status`` ``stuck``. None (a trigger of an earlier release): no watchdog.
    :param older: what triggers serialised by earlier versions hold instead (:func:`_upgraded`), read so that a
        task deferred across a deploy resumes its wait.
    """

    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        uid: str,
        log_replicated_job: str,
        log_container: str,
        cluster: ClusterTarget | Mapping[str, Any] | None = None,
        progress_interval: float = 300,
        log_tail_lines: int = 100,
        delete_on_kill: bool = True,
        training: Mapping[str, Any] | None = None,
        log_cursor: bool | Mapping[str, Any] | None = None,
        watchdog: Mapping[str, Any] | None = None,
        **older: Any,
    ) -> None:
        super().__init__()
        self.name = name
        self.namespace = namespace
        self.uid = uid
        self.log_replicated_job = log_replicated_job
        self.log_container = log_container
        self.cluster, self.log_cursor = _upgraded(cluster, log_cursor, older)
        self.progress_interval = progress_interval
        self.log_tail_lines = log_tail_lines
        self.delete_on_kill = delete_on_kill
        self.training = dict(training) if training else None
        self.watchdog = dict(watchdog) if watchdog else None

    #: Serialised as they are; ``cluster`` as its ``to_dict()``.
    _SERIALIZED = (
        "name",
        "namespace",
        "uid",
        "log_replicated_job",
        "log_container",
        "progress_interval",
        "log_tail_lines",
        "delete_on_kill",
        "training",
        "log_cursor",
        "watchdog",
    )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {key: getattr(self, key) for key in self._SERIALIZED}
        return f"{type(self).__module__}.{type(self).__qualname__}", {**kwargs, "cluster": self.cluster.to_dict()}

    def hook(self) -> AsyncKubernetesApiHook:
        return AsyncKubernetesApiHook(self.cluster)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self.hook()
        try:
            await asyncio.sleep(random.uniform(0, START_SPREAD_SECONDS))
            await hook.ready()
        except asyncio.CancelledError:  # a task that left the wait before it started still has its JobSet deleted
            await self._cancelled_with_the_task(hook)
            raise
        async with contextlib.AsyncExitStack() as sessions:
            progress, follower = Progress(self.log_tail_lines), self.log_follower(await self._log_printer(hook))
            progress.evaluation.update(follower.printer.kept)  # what the log may no longer show; it reads again
            waits = [self._watch_pods, follower.follow, self._report]
            if follower.printer.store is not None:
                waits.append(follower.log_batches)
            helpers = [asyncio.create_task(self._keep_running(fn, hook, progress)) for fn in waits]
            windows = watchdog.Windows.from_dict(self.watchdog)
            if windows.on:
                helpers.insert(0, asyncio.create_task(self._keep_running(self._watchdog, hook, progress)))
            if self.training:
                helpers.append(asyncio.create_task(self._report_training(progress, sessions)))
            printer: LogPrinter | None = follower.printer
            try:
                final = await self._watch_jobset_or_watchdog(hook, progress)
                if final:
                    await WorkloadLogFollower.drain(progress)
                if self.training:
                    progress.finished.set()
                    await asyncio.wait(helpers[-1:], timeout=TRAINING_LAST_READ_SECONDS)
                if progress.stuck is not None:
                    event = await self._stuck_event(hook, progress)
                else:
                    event = await self._event(hook, progress, final)
            except asyncio.CancelledError:
                if not await self._cancelled_with_the_task(hook):
                    printer = None  # the wait goes on elsewhere: its successor logs what this one has not
                raise
            finally:
                await carried_through(self._stop(helpers, printer, follower.printer))
        yield TriggerEvent(event)

    async def _cancelled_with_the_task(self, hook: AsyncKubernetesApiHook) -> bool:
        """:meth:`_decide_on_cancel`, carried to its end when Airflow cancels the trigger again meanwhile (its loop
        cancels a trigger it no longer holds on each pass until the trigger is done): cut short, the decision would
        neither say where the wait went nor delete a JobSet whose task left it. Bounded by its own timeout."""
        return await carried_through(self._decide_on_cancel(hook))

    async def _decide_on_cancel(self, hook: AsyncKubernetesApiHook) -> bool:
        """Whether the task left this wait (and the JobSet, with ``delete_on_kill``, was deleted).

        Airflow cancels a trigger when its task left the deferral (a user marked it or cleared it, or its
        timeout expired), but also when the wait went to another triggerer (this one's heartbeat lapsed: a pause,
        CPU throttling, a network cut) and when this triggerer stops. Airflow 3.3 then calls ``on_kill`` for the
        first two alike (``TriggerRunner.cancel_triggers``; apache/airflow PR 73454), and before 3.3 for neither:
        only the task's state tells them apart, as the provider triggers' ``safe_to_cancel`` reads it. A JobSet
        is deleted only when that state says the task left; unknown keeps it (the run's teardown deletes its
        pools). Bounded, as Airflow bounds ``on_kill``."""
        try:
            async with asyncio.timeout(CANCEL_DECISION_SECONDS):
                state = await self._task_state()
                if state is None or state == "deferred":
                    self.log.info(
                        "The wait for JobSet %s (uid %s) was cancelled while its task is %s: another triggerer "
                        "goes on with it (or this one stops); the JobSet keeps running",
                        self.ref,
                        self.uid,
                        state or "of unknown state",
                    )
                    return False
                if self.delete_on_kill:
                    self.log.info(
                        "The task left the wait (it is %s): deleting JobSet %s (uid %s)", state, self.ref, self.uid
                    )
                    await hook.delete_jobset(self.name, self.namespace, self.uid)
                return True
        except Exception as e:
            self.log.warning(
                "The wait for JobSet %s was cancelled; the JobSet is kept (%s: %s)",
                self.ref,
                type(e).__name__,
                str(e)[:300],
            )
            return False

    async def _task_state(self) -> str | None:
        """The state of the deferred task instance, read through the triggerer's supervisor (None: no task)."""
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        ti = self.task_instance
        if ti is None:
            return None
        # A supervisor request: never cut short, even by the decision's own bound (``in_thread``'s module says why).
        states = await in_thread(
            RuntimeTaskInstance.get_task_states,
            dag_id=ti.dag_id,
            task_ids=[ti.task_id],
            run_ids=[ti.run_id],
            map_index=ti.map_index,
        )
        return states.get(ti.run_id, {}).get(ti.task_id)

    async def _stop(self, helpers: list[asyncio.Task], printer: LogPrinter | None, own: LogPrinter) -> None:
        """Cancels the wait's helpers, logs what ``printer`` holds (None: the wait goes on elsewhere, which logs
        it) and confirms the upload of this trigger's log (``own`` printer's record). Bounded: the event must fire
        even if a helper failed to stop (it would hold the slice)."""
        for task in helpers:
            task.cancel()
        _, running = await asyncio.wait(helpers, timeout=HELPERS_STOP_SECONDS)
        if running:
            self.log.warning("%d helper(s) of the wait did not stop when cancelled", len(running))
        if printer is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await printer.flush(final=True)
        await own.confirm_upload()

    def log_follower(self, printer: LogPrinter | None = None) -> WorkloadLogFollower:
        """The follower of the workload's log, logging into the task log through ``printer`` (as lines come)."""
        return WorkloadLogFollower(
            self.log, self.namespace, self.log_container, self.log_replicated_job, printer or LogPrinter(self.log)
        )

    async def _log_printer(self, hook: AsyncKubernetesApiHook) -> LogPrinter:
        """The printer of the workload's log, with what an earlier trigger of this wait logged of it."""
        if not self.log_cursor:
            return LogPrinter(self.log)
        record = JobSetLogRecord(hook, self.name, self.namespace, self.uid)
        return await LogPrinter.resumed(self.log, record, recover=remote_logging())

    async def _keep_running(self, fn, hook: AsyncKubernetesApiHook, progress: Progress) -> None:
        """Pods, log and progress only inform: an API error there is logged and retried, never fatal."""
        while True:
            try:
                await fn(hook, progress)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.log.warning("%s failed (%s: %s); retrying in 10 s", fn.__name__, type(e).__name__, str(e)[:300])
                await asyncio.sleep(10)

    async def _watch_jobset(self, hook: AsyncKubernetesApiHook, progress: Progress) -> dict | None:
        """The JobSet once finished, or None once deleted (or replaced by another of the same name)."""
        first = await hook.get_jobset(self.name, self.namespace)
        if first is None or first["metadata"]["uid"] != self.uid:
            return None
        seen = False
        async for kind, jobset in hook.watch_jobset(self.name, self.namespace):
            if jobset["metadata"]["uid"] != self.uid or kind == "DELETED":
                if kind == "DELETED" or seen:
                    return None
                continue
            seen = True
            before = progress.jobset
            progress.jobset = jobset
            if st.restarts(jobset) > st.restarts(before or jobset):
                self.log.warning("JobSet %s restarted: restart %d", self.ref, st.restarts(jobset))
            if st.terminal_condition(jobset):
                return jobset
        return None

    async def _watch_jobset_or_watchdog(self, hook: AsyncKubernetesApiHook, progress: Progress) -> dict | None:
        """:meth:`_watch_jobset`, or None as soon as the watchdog found the workload stuck (``progress.stuck``)."""
        watch = asyncio.create_task(self._watch_jobset(hook, progress))
        stuck = asyncio.create_task(progress.stuck_found.wait())
        try:
            await asyncio.wait({watch, stuck}, return_when=asyncio.FIRST_COMPLETED)
            return watch.result() if watch.done() and progress.stuck is None else None
        finally:
            for task in (watch, stuck):
                task.cancel()
            await asyncio.gather(watch, stuck, return_exceptions=True)

    async def _watchdog(self, hook: AsyncKubernetesApiHook, progress: Progress) -> None:
        """Looks every few seconds whether the workload is past a window of the watchdog; sets ``progress.stuck``
        when it is. Only informs the wait: an error is logged and retried (``_keep_running``)."""
        windows = watchdog.Windows.from_dict(self.watchdog)
        while True:  # never returns: the wait cancels it (a helper that returned would be called again at once)
            await asyncio.sleep(WATCHDOG_INTERVAL_SECONDS)
            if not progress.jobset or progress.stuck is not None:
                continue
            now = time.time()
            expected = st.expected_pods(progress.jobset)
            progress.note_running(expected, now)
            seen = watchdog.Seen(
                created=_created(progress.jobset),
                pods=progress.attempt_pods(),
                expected_pods=expected,
                all_running_since=progress.all_running_since,
                last_step=progress.last_step,
                last_step_seen=progress.last_step_seen,
                last_log_line=progress.last_log_line,
                suspended=st.is_suspended(progress.jobset),
                training=bool(self.training) and progress.steps_read,
            )
            if (stuck := watchdog.check(windows, seen, now)) is not None:
                self.log.warning("JobSet %s is stuck: %s", self.ref, stuck.message)
                progress.stuck = stuck
                progress.stuck_found.set()

    async def _stuck_event(self, hook: AsyncKubernetesApiHook, progress: Progress) -> dict[str, Any]:
        """The watchdog's end of the wait: the JobSet is deleted (its pods free the nodes, the slice), and the event
        says why, with the pods' states and the log's last lines."""
        stuck = progress.stuck
        await hook.delete_jobset(self.name, self.namespace, self.uid)
        message = f"JobSet {self.ref} was deleted by the watchdog: {stuck.message}"
        if progress.tail:
            message += "\nLast lines of the workload log:\n" + "\n".join(f"  | {x}" for x in progress.tail)
        return {
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
            "log_tail": list(progress.tail),
            "log_pod": progress.log_pod,
            "evaluation_lines": list(progress.evaluation.values()),
            "status": "stuck",
            "stuck": {"kind": stuck.kind, "step": stuck.step},
            "message": message,
        }

    async def _watch_pods(self, hook: AsyncKubernetesApiHook, progress: Progress) -> None:
        async for kind, pod in hook.watch_pods(self.name, self.namespace, self.uid):
            progress.record_pod(kind, pod)

    async def _report(self, hook: AsyncKubernetesApiHook, progress: Progress) -> None:
        """Log progress when it changes (checked every few seconds) and every progress_interval anyway."""
        last_line, last_time, started, kueue_checked = "", 0.0, time.monotonic(), 0.0
        while True:
            await asyncio.sleep(5)
            if not progress.jobset:
                continue
            now = time.monotonic()
            if st.is_suspended(progress.jobset) and now - kueue_checked > 60:
                kueue_checked = now
                try:
                    progress.kueue_note = st.kueue_note(await hook.kueue_workloads(self.namespace, self.uid))
                except Exception as e:
                    progress.kueue_note = f"Kueue Workload unreadable: {str(e)[:100]}"
            line = progress.line()
            if line != last_line or now - last_time >= self.progress_interval:
                elapsed = int(now - started)
                self.log.info("JobSet %s after %dm%02ds: %s", self.ref, elapsed // 60, elapsed % 60, line)
                last_line, last_time = line, now

    async def _report_training(self, progress: Progress, sessions: contextlib.AsyncExitStack) -> None:
        """The training's progress line at most once per interval while it runs, and once more when it ended if
        the event files grew since the last line (the step it got to). A failed read is logged and tried at the
        next one: progress only informs. One HTTP session for the whole wait."""
        training = TrainingProgress(self.training)
        try:
            reader = await sessions.enter_async_context(GcsReadHook(training.gcp_conn_id).reader(training.bucket))
        except Exception as e:  # No reader (credentials, network): the wait goes on without progress lines.
            self.log.warning(
                "No training progress: cannot read gs://%s (%s: %s)", training.bucket, type(e).__name__, str(e)[:300]
            )
            return
        while True:
            ended = progress.finished.is_set()
            if ended or training.due():
                try:
                    await training.report(
                        reader, self.log, _created(progress.jobset), only_news=ended and not training.due()
                    )
                    progress.note_step(training.step(_created(progress.jobset)), time.time())
                except Exception as e:
                    self.log.warning(
                        "Could not read the training's event files under gs://%s/%s (%s: %s)",
                        training.bucket,
                        training.prefix,
                        type(e).__name__,
                        str(e)[:300],
                    )
            if ended:
                return
            await wait_event(progress.finished, training.interval)

    async def _event(self, hook: AsyncKubernetesApiHook, progress: Progress, final: dict | None) -> dict[str, Any]:
        event: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
            "log_tail": list(progress.tail),
            "log_pod": progress.log_pod,
            "evaluation_lines": list(progress.evaluation.values()),
        }
        if final is None:
            return {**event, "status": "deleted", "message": self._deleted_message(progress)}
        condition = st.terminal_condition(final) or {}
        event.update(
            condition={k: condition.get(k, "") for k in ("type", "reason", "message")},
            restarts=st.restarts(final),
        )
        if condition.get("type") == st.COMPLETED:
            return {
                **event,
                "status": "success",
                "message": f"JobSet {self.ref} completed: {condition.get('message', '')}",
            }
        lost = await self._lost_nodes(hook, progress)
        message = st.explain_failure(final, progress.pods.values(), lost, event["log_tail"], progress.log_pod)
        preemption = st.preemption(final, progress.pods.values(), lost)
        return {**event, "status": "failed", "message": message, "preemption": preemption}

    def _deleted_message(self, progress: Progress) -> str:
        message = (
            f"JobSet {self.ref} (uid {self.uid}) was deleted while the task waited for it "
            f"(by someone or something outside this task, or its TTL). Last progress: "
            f"{progress.line() if progress.jobset else 'none seen'}."
        )
        if progress.tail:
            message += "\nLast lines of the workload log:\n" + "\n".join(f"  | {x}" for x in progress.tail)
        return message

    async def _lost_nodes(self, hook: AsyncKubernetesApiHook, progress: Progress) -> list[str]:
        nodes = {p.node for p in progress.pods.values() if p.node and (p.failed() or p.deleted)}
        lost = []
        for node in sorted(nodes)[:20]:
            if await hook.node_exists(node) is False:
                lost.append(node)
        return lost


def _upgraded(
    cluster: ClusterTarget | Mapping[str, Any] | None, log_cursor: Any, older: dict[str, Any]
) -> tuple[ClusterTarget, bool]:
    """The cluster and the log cursor of a trigger, from what any earlier version serialised; the shims for the
    older forms go in 3.0.0 (a major version: a task deferred across that upgrade is cleared, not resumed).

    - Before the distribution (1.0.0; the package was then in ``plugins/``) the cluster was the keywords
      ``kubernetes_conn_id``, or ``cluster_url``, ``ssl_ca_cert``, ``gcp_conn_id``, ``use_dns_endpoint`` (and
      ``impersonation_chain``, always None), in ``older``.
    - In 2.0.0 ``log_cursor`` was an object in the run's bucket (a mapping): it counts as true, that object is
      not read, so a wait taken over after the upgrade logs the log once more from its start.
    """
    if cluster is None:
        if older.get("impersonation_chain") is None:
            older.pop("impersonation_chain", None)
        target = ClusterTarget(**older)
    elif older:
        raise TypeError(f"Give the cluster as cluster=, not also {sorted(older)}")
    else:
        target = ClusterTarget.from_dict(cluster) if isinstance(cluster, Mapping) else cluster
    return target, bool(log_cursor)


def _created(obj: dict) -> float | None:
    """When a Kubernetes object was created (POSIX seconds), or None before it was read."""
    return posix_time((obj.get("metadata") or {}).get("creationTimestamp"))
