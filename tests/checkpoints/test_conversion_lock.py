"""The shared conversion under its lock in Cloud Storage, and the training record at train_rl's execute.

Two DAG runs are driven the way Airflow drives a deferrable task: ``execute`` submits or defers, the
trigger is rebuilt from its serialized form (as the triggerer does) and run to its event, and the method
it names resumes the task. Everything in Cloud Storage is real (fake-gcs-server): the lock object with its
generation preconditions, the checkpoint checks, the training record.

What is replaced, and why: the Kubernetes API (``conversion_fakes.InMemoryJobSets``; the JobSet operator
against a real API server is tested in tests/jobset), and the conversion pod itself: where the JobSet
would write the checkpoint, the test writes it into the emulator, then resumes the task with the event
``JobSetTrigger`` fires when a JobSet ends.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import time
from datetime import timedelta

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, TaskDeferralTimeout, TaskDeferred
from checkpoint_writers import put, write_orbax_step
from conversion_fakes import InMemoryJobSets, context, jobset_event, layout

from tpu_rl.operators.jobset import JobSetFailedError
from tpu_rl.operators.workloads import HfToMaxTextOperator, TrainRlOperator
from tpu_rl.output_checks import ConversionLockWait
from tpu_rl.triggers.jobset import JobSetTrigger

pytestmark = pytest.mark.checkpoints

RUN_A, RUN_B = "manual__2026-11-29T10:00:00+00:00", "backfill__2026-11-29T10:00:01+00:00"


class Run:
    """One DAG run's hf_to_maxtext task instance: its operator, context and cluster."""

    def __init__(self, bucket, run_id: str, cluster: InMemoryJobSets, try_number: int = 1) -> None:
        self.bucket, self.cluster = bucket, cluster
        self.context = context(bucket.name, run_id, "hf_to_maxtext", try_number)
        self.op = HfToMaxTextOperator(
            task_id="hf_to_maxtext", execution_timeout=timedelta(hours=4), lock_poll_interval=0.2
        )
        self.op.hook = cluster  # The JobSetOperator's hook, replaced by the in-memory API (see the module doc).

    def execute(self) -> TaskDeferred:
        with pytest.raises(TaskDeferred) as deferred:
            self.op.execute(self.context)
        return deferred.value

    def resume(self, deferred: TaskDeferred, event: dict):
        return self.op.resume_execution(deferred.method_name, {**(deferred.kwargs or {}), "event": event}, self.context)


def rebuilt(trigger):
    """The trigger as the triggerer builds it: from its serialized form."""
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))


def lock_holder(bucket) -> dict | None:
    blob = bucket.get_blob(layout(bucket.name).conversion_lock_object)
    return json.loads(blob.download_as_bytes()) if blob else None


def step(bucket) -> str:
    return layout(bucket.name).converted_step_prefix


async def test_two_runs_at_once_convert_once_and_the_second_skips(bucket):
    a, b = Run(bucket, RUN_A, InMemoryJobSets()), Run(bucket, RUN_B, InMemoryJobSets())

    a_deferred = await asyncio.to_thread(a.execute)  # A takes the lock and submits its JobSet.
    assert isinstance(a_deferred.trigger, JobSetTrigger)
    holder = lock_holder(bucket)
    assert {k: holder[k] for k in ("dag_id", "run_id", "task_id", "try_number")} == {
        "dag_id": "maxtext_rl_tpu",
        "run_id": RUN_A,
        "task_id": "hf_to_maxtext",
        "try_number": 1,
    }
    assert holder["stale_after_seconds"] == 4 * 3600 + 30 * 60 and holder["created"]

    b_deferred = await asyncio.to_thread(b.execute)  # B finds A's lock: it waits, without submitting anything.
    assert isinstance(b_deferred.trigger.check, ConversionLockWait) and b_deferred.method_name == "lock_wait_complete"
    assert b.cluster.created == []
    waiting = asyncio.ensure_future(anext(rebuilt(b_deferred.trigger).run()))
    await asyncio.sleep(0.6)
    assert not waiting.done()

    # A's conversion pod writes the checkpoint (here: the test), its JobSet completes, A resumes.
    await asyncio.to_thread(write_orbax_step, bucket, step(bucket))
    result = await asyncio.to_thread(a.resume, a_deferred, jobset_event(a.op.tracked, "success"))
    assert result["state"] == "Completed"
    assert lock_holder(bucket) is None  # Released once the JobSet completed.

    event = (await asyncio.wait_for(waiting, timeout=10)).payload
    assert event["status"] == "complete"
    with pytest.raises(AirflowSkipException, match=re.escape(f"was converted by run {RUN_A} (DAG maxtext_rl_tpu")):
        await asyncio.to_thread(b.resume, b_deferred, event)
    assert a.cluster.created == ["qwen-hf2mt-" + a.op.tracked["name"].rsplit("-", 1)[1]] and b.cluster.created == []


async def test_a_failed_conversion_releases_the_lock_and_the_waiting_run_converts(bucket):
    a, b = Run(bucket, RUN_A, InMemoryJobSets()), Run(bucket, RUN_B, InMemoryJobSets())
    a_deferred = await asyncio.to_thread(a.execute)
    b_deferred = await asyncio.to_thread(b.execute)
    waiting = asyncio.ensure_future(anext(rebuilt(b_deferred.trigger).run()))

    await asyncio.to_thread(write_orbax_step, bucket, step(bucket), commit=False)  # A's converter died mid-save.
    a.cluster.finish(a.op.tracked["name"], "default", "Failed")
    with pytest.raises(JobSetFailedError):
        await asyncio.to_thread(a.resume, a_deferred, jobset_event(a.op.tracked, "failed", "pod OOMKilled"))
    assert lock_holder(bucket) is None  # The failed JobSet writes no more: its try let go.

    event = (await asyncio.wait_for(waiting, timeout=10)).payload
    assert event["status"] == "released" and event["holder"]["run_id"] == RUN_A
    converting = await asyncio.to_thread(lambda: pytest.raises(TaskDeferred, b.resume, b_deferred, event).value)
    assert isinstance(converting.trigger, JobSetTrigger) and len(b.cluster.created) == 1
    assert lock_holder(bucket)["run_id"] == RUN_B

    # A's retry now waits for B.
    retry = Run(bucket, RUN_A, a.cluster, try_number=2)
    assert isinstance((await asyncio.to_thread(retry.execute)).trigger.check, ConversionLockWait)


async def test_a_stale_lock_is_taken_over(bucket, capfd):
    lock = layout(bucket.name).conversion_lock_object
    put(
        bucket,
        lock,
        {
            "dag_id": "maxtext_rl_tpu",
            "run_id": "crashed-run",
            "task_id": "hf_to_maxtext",
            "try_number": 3,
            "created": "2026-11-29T09:00:00+00:00",
            "stale_after_seconds": 2,
        },
    )
    b = Run(bucket, RUN_B, InMemoryJobSets())
    b_deferred = await asyncio.to_thread(b.execute)  # Fresh for two more seconds: wait.
    started = time.monotonic()
    event = (await asyncio.wait_for(anext(rebuilt(b_deferred.trigger).run()), timeout=15)).payload
    assert event["status"] == "stale" and 1.5 < time.monotonic() - started
    converting = await asyncio.to_thread(lambda: pytest.raises(TaskDeferred, b.resume, b_deferred, event).value)
    assert isinstance(converting.trigger, JobSetTrigger)
    assert lock_holder(bucket)["run_id"] == RUN_B
    log = capfd.readouterr().out
    assert "Took over" in log and "run 'crashed-run' of DAG 'maxtext_rl_tpu' (task hf_to_maxtext, try 3" in log


def test_a_retry_re_enters_its_own_lock_and_adopts_the_running_jobset(bucket):
    cluster = InMemoryJobSets()
    first = Run(bucket, RUN_A, cluster)
    first.execute()
    retry = Run(bucket, RUN_A, cluster, try_number=2)  # The worker was lost; Airflow retries.
    assert isinstance(retry.execute().trigger, JobSetTrigger)
    assert len(cluster.created) == 1  # Adopted, not resubmitted.
    assert lock_holder(bucket)["try_number"] == 2


def test_a_timed_out_conversion_deletes_its_jobset_and_releases_the_lock(bucket):
    from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason

    a = Run(bucket, RUN_A, InMemoryJobSets())
    a.execute()
    resumed = Run(bucket, RUN_A, a.cluster)  # A fresh operator, as after a deferral.
    resumed.context["ti"].xcoms = a.context["ti"].xcoms
    with pytest.raises(TaskDeferralTimeout):
        resumed.op.resume_execution(TRIGGER_FAIL_REPR, {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, resumed.context)
    assert a.cluster.jobsets == {} and lock_holder(bucket) is None


def test_complete_checkpoint_is_skipped_and_half_written_one_is_converted(bucket):
    write_orbax_step(bucket, step(bucket), commit=False)
    a = Run(bucket, RUN_A, InMemoryJobSets())
    a_deferred = a.execute()  # Half-written: converted again.
    write_orbax_step(bucket, step(bucket))
    a.resume(a_deferred, jobset_event(a.op.tracked, "success"))
    with pytest.raises(AirflowSkipException, match="0/ is already a complete checkpoint: skipping the conversion"):
        Run(bucket, RUN_B, InMemoryJobSets()).op.execute(context(bucket.name, RUN_B, "hf_to_maxtext"))
    assert lock_holder(bucket) is None


# --- the training record at train_rl's execute -------------------------------------------------


def train(bucket, cluster, try_number=1, **changes):
    op = TrainRlOperator(task_id="train_rl")
    op.hook = cluster
    ctx = context(bucket.name, RUN_A, "train_rl", try_number, **changes)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    return op, deferred.value


def test_train_rl_records_typed_parameters_and_refuses_a_changed_num_batches(bucket):
    record = layout(bucket.name, RUN_A).training_record_object
    cluster = InMemoryJobSets()
    op, _ = train(bucket, cluster)
    assert json.loads(bucket.blob(record).download_as_bytes())["parameters"]["num_batches"] == 50

    cluster.finish(op.tracked["name"], "default", "Failed")  # The trainer crashed; the user changes num_batches.
    with pytest.raises(AirflowFailException) as error:
        train(bucket, cluster, try_number=2, num_batches=60)
    assert "num_batches: 50 -> 60" in str(error.value) and "train_steps: 50 -> 60" in str(error.value)
    assert len(cluster.created) == 1  # Nothing submitted.

    train(bucket, cluster, try_number=2)  # The same parameters resume.
    assert len(cluster.created) == 2


def test_train_rl_adopting_a_running_jobset_does_not_check(bucket):
    cluster = InMemoryJobSets()
    train(bucket, cluster)
    bucket.blob(layout(bucket.name, RUN_A).training_record_object).delete()
    train(bucket, cluster, try_number=2, num_batches=60)  # Adopts the running JobSet; no record read or written.
    assert len(cluster.created) == 1 and not bucket.get_blob(layout(bucket.name, RUN_A).training_record_object)


def test_the_dag_task_and_train_rl_record_the_same_typed_parameters(bucket):
    from tpu_rl.layout import training_record
    from tpu_rl.operators.training_record import RunTrainingRecordCheckOperator

    ctx = context(bucket.name, RUN_A, "check_training_record")
    check = RunTrainingRecordCheckOperator(task_id="check_training_record")
    check.render_template_fields(ctx)
    assert check.parameters["num_batches"] == 50 and check.parameters["train_steps"] == 50
    assert check.execute(ctx) == f"gs://{bucket.name}/{layout(bucket.name, RUN_A).training_record_object}"
    recorded = json.loads(bucket.blob(layout(bucket.name, RUN_A).training_record_object).download_as_bytes())
    assert recorded["parameters"] == training_record(layout(bucket.name).config)
    train(bucket, InMemoryJobSets())  # train_rl's own check accepts the task's record.
