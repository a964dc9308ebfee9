"""Checkpoint/export sensors, triggers and output operators against a real GCS emulator.

Sensors are driven the way Airflow drives them: ``execute`` defers, the trigger is rebuilt from its
serialized form (as the triggerer does) and run to its event, and ``execute_complete`` decides.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from datetime import UTC, datetime

import pytest
from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout, TaskDeferred
from airflow.sdk.execution_time.context import OutletEventAccessors
from checkpoint_writers import put, write_hf_export, write_orbax_step

from tpu_rl.operators.publish import PublishHfExportOperator
from tpu_rl.operators.training_record import TrainingRecordCheckOperator
from tpu_rl.output_checks import OrbaxStep
from tpu_rl.sensors.checkpoints import FinalTrainingCheckpointSensor, HfExportSensor, OrbaxCheckpointSensor
from tpu_rl.triggers.checkpoints import GcsOutputTrigger

pytestmark = pytest.mark.checkpoints

CONVERTED = "qwen3-30b-a3b/max-text-format/qwen3-30b-a3b-instruct-2507-scanned/"
ACTOR = "qwen3-30b-a3b/trained/manual-run-1a2b3c4d/rl/checkpoints/actor/"
STAGING = "qwen3-30b-a3b/hf-staging/manual-run-1a2b3c4d/attempt-1/"
FINAL = "qwen3-30b-a3b/hf-trained/manual-run-1a2b3c4d/"


async def run_sensor(sensor, expect_deferral=None):
    """execute (its first check is synchronous: in a thread); when it defers, the (re-serialized) trigger to its
    first event, and the sensor resumed with it. ``expect_deferral``: whether it must defer (None: either)."""
    try:
        result = await asyncio.to_thread(sensor.execute, {})
    except TaskDeferred as deferred:
        assert expect_deferral in (None, True), "deferred although the output was complete"
        classpath, kwargs = deferred.trigger.serialize()
        module, _, name = classpath.rpartition(".")
        trigger = getattr(importlib.import_module(module), name)(**kwargs)
        event = await anext(trigger.run())
        return getattr(sensor, deferred.method_name)({}, event=event.payload)
    assert expect_deferral in (None, False), "returned at once although the output was not complete"
    return result


def converted_sensor(bucket, **kwargs):
    return OrbaxCheckpointSensor(
        task_id="verify_converted", bucket=bucket.name, prefix=f"{CONVERTED}0/", timeout=0, **kwargs
    )


def training_sensor(bucket, train_steps=50, checkpoint_period=20):
    return FinalTrainingCheckpointSensor(
        task_id="verify_training",
        bucket=bucket.name,
        prefix=ACTOR,
        train_steps=train_steps,
        checkpoint_period=checkpoint_period,
        timeout=0,
    )


# --- Orbax step --------------------------------------------------------------------------------


async def test_complete_orbax_step_is_accepted(bucket):
    write_orbax_step(bucket, f"{CONVERTED}0/", custom={"scan_layers": True})
    # Already whole: accepted by the first check, without a deferral.
    assert await run_sensor(converted_sensor(bucket), expect_deferral=False) == f"gs://{bucket.name}/{CONVERTED}0/"


async def test_step_without_commit_success_fails_naming_it(bucket):
    write_orbax_step(bucket, f"{CONVERTED}0/", commit=False)
    with pytest.raises(AirflowSensorTimeout) as error:
        await run_sensor(converted_sensor(bucket), expect_deferral=True)
    assert "no commit_success.txt in 0/" in str(error.value)
    assert "0/_CHECKPOINT_METADATA has no commit_timestamp_nsecs" in str(error.value)


async def test_step_with_missing_leaf_fails_naming_the_leaf(bucket):
    write_orbax_step(bucket, f"{CONVERTED}0/", drop_leaf="params.decoder.layers.mlp.wi_0.kernel")
    with pytest.raises(AirflowSensorTimeout) as error:
        await run_sensor(converted_sensor(bucket))
    assert "leaf 0/items/params.decoder.layers.mlp.wi_0.kernel/ has no .zarray" in str(error.value)
    assert "decoder_norm" not in str(error.value)


async def test_empty_items_folder_proves_nothing(bucket):
    put(bucket, f"{CONVERTED}0/items/_sharding", "{}")
    with pytest.raises(AirflowSensorTimeout) as error:
        await run_sensor(converted_sensor(bucket))
    assert "no _METADATA in 0/items/" in str(error.value)


async def test_trigger_waits_until_the_commit_lands(bucket):
    """The trigger keeps polling an unfinished step and fires once Orbax writes its last marker."""
    write_orbax_step(bucket, f"{CONVERTED}0/", commit=False)
    trigger = GcsOutputTrigger(
        bucket.name, OrbaxStep(prefix=f"{CONVERTED}0/"), deadline=time.time() + 30, poll_interval=0.2
    )
    first_event = asyncio.ensure_future(anext(trigger.run()))
    await asyncio.sleep(0.6)
    assert not first_event.done()
    await asyncio.to_thread(write_orbax_step, bucket, f"{CONVERTED}0/")
    event = await asyncio.wait_for(first_event, timeout=10)
    assert event.payload["status"] == "complete"


def test_poke_mode_uses_the_same_check(bucket):
    sensor = converted_sensor(bucket, deferrable=False)
    assert sensor.poke({}) is False
    write_orbax_step(bucket, f"{CONVERTED}0/")
    assert sensor.poke({}).xcom_value == f"gs://{bucket.name}/{CONVERTED}0/"


# --- Final training checkpoint -----------------------------------------------------------------


async def test_run_whose_highest_step_is_periodic_is_not_final(bucket):
    for step in (20, 40):
        write_orbax_step(bucket, f"{ACTOR}{step}/", ("model_params", "optimizer_state"))
    write_orbax_step(bucket, f"{ACTOR}50/", ("model_params", "optimizer_state"), commit=False)  # Crashed mid-save.
    with pytest.raises(AirflowSensorTimeout) as error:
        await run_sensor(training_sensor(bucket))
    assert "highest committed step 40 of 50 is a periodic save (checkpoint_period 20)" in str(error.value)
    assert "no commit_success.txt in actor/50/" in str(error.value)


async def test_early_ended_run_resolves_its_last_step(bucket):
    for step in (20, 40, 47):
        write_orbax_step(bucket, f"{ACTOR}{step}/", ("model_params", "optimizer_state"))
    assert await run_sensor(training_sensor(bucket)) == 47


async def test_full_run_resolves_train_steps_and_checks_both_items(bucket):
    write_orbax_step(bucket, f"{ACTOR}50/", ("model_params",))  # optimizer_state never written
    with pytest.raises(AirflowSensorTimeout) as error:
        await run_sensor(training_sensor(bucket, checkpoint_period=50))
    assert "no _METADATA in actor/50/optimizer_state/" in str(error.value)
    write_orbax_step(bucket, f"{ACTOR}50/", ("model_params", "optimizer_state"))
    assert await run_sensor(training_sensor(bucket, checkpoint_period=50)) == 50


async def test_run_without_checkpoints(bucket):
    with pytest.raises(AirflowSensorTimeout, match="no committed step under checkpoints/actor/"):
        await run_sensor(training_sensor(bucket))


# --- Hugging Face export -----------------------------------------------------------------------


def export_sensor(bucket, **kwargs):
    return HfExportSensor(task_id="verify_export", bucket=bucket.name, prefix=STAGING, timeout=0, **kwargs)


async def test_complete_export_is_accepted(bucket):
    started = datetime.now(UTC).isoformat()
    write_hf_export(bucket, STAGING, shards=3)
    assert await run_sensor(export_sensor(bucket, not_before=started)) == f"gs://{bucket.name}/{STAGING}"


async def test_single_shard_export_has_no_index(bucket):
    write_hf_export(bucket, STAGING, shards=1, index=False)
    bucket.rename_blob(bucket.blob(f"{STAGING}model-00001-of-00001.safetensors"), f"{STAGING}model.safetensors")
    assert await run_sensor(export_sensor(bucket)) == f"gs://{bucket.name}/{STAGING}"


async def test_missing_shard_is_named(bucket):
    write_hf_export(bucket, STAGING, shards=3, skip_shard=2)
    with pytest.raises(AirflowSensorTimeout) as error:
        await run_sensor(export_sensor(bucket))
    assert "shard 2 of 3 missing (model-00002-of-00003.safetensors)" in str(error.value)


async def test_shard_shorter_than_its_header_says(bucket):
    write_hf_export(bucket, STAGING, shards=3, truncate_shard=3)
    with pytest.raises(AirflowSensorTimeout) as error:
        await run_sensor(export_sensor(bucket))
    message = str(error.value)
    assert "model-00003-of-00003.safetensors: header accounts for" in message
    assert "model-00001" not in message


async def test_export_without_index_yet(bucket):
    write_hf_export(bucket, STAGING, shards=3, index=False)
    with pytest.raises(AirflowSensorTimeout, match=r"no model.safetensors.index.json \(3 shards present"):
        await run_sensor(export_sensor(bucket))


async def test_stale_index_from_an_earlier_attempt(bucket):
    write_hf_export(bucket, STAGING, shards=3)  # The earlier attempt.
    await asyncio.sleep(0.05)
    started = datetime.now(UTC).isoformat()
    write_hf_export(bucket, STAGING, shards=3, index=False)  # This attempt died before the index.
    with pytest.raises(AirflowSensorTimeout) as error:
        await run_sensor(export_sensor(bucket, not_before=started))
    message = str(error.value)
    assert "model.safetensors.index.json was written at" in message
    assert "stale from an earlier attempt" in message
    assert "config.json was written" not in message


async def test_export_without_the_models_generation_config(bucket):
    """MaxText 0.2.4's converter writes none; the export's copy adds it, and the check requires it when told."""
    write_hf_export(bucket, STAGING, shards=2, generation_config=False)
    assert await run_sensor(export_sensor(bucket)) == f"gs://{bucket.name}/{STAGING}"
    with pytest.raises(AirflowSensorTimeout, match="no generation_config.json"):
        await run_sensor(export_sensor(bucket, also_required=["generation_config.json"]))
    write_hf_export(bucket, STAGING, shards=2)
    required = export_sensor(bucket, also_required=["generation_config.json"])
    assert await run_sensor(required) == f"gs://{bucket.name}/{STAGING}"


def test_export_sensor_refuses_an_unrendered_attempt(bucket):
    """A missing XCom renders as "None": fail at once rather than wait 30 minutes on gs://<bucket>/None."""
    with pytest.raises(ValueError, match="prefix 'None' is not a folder"):
        HfExportSensor(task_id="verify_export", bucket=bucket.name, prefix="None").execute({})
    with pytest.raises(ValueError, match="not_before 'None' is not an ISO 8601 time"):
        export_sensor(bucket, not_before="None").execute({})


# --- Record, publish (the conversion's skip and lock: test_conversion_lock.py) ----------------------


def test_resume_with_changed_num_batches_is_refused(bucket):
    record = "qwen3-30b-a3b/trained/manual-run-1a2b3c4d/rl/tpu_rl_training_record.json"
    parameters = {"num_batches": 4, "batch_size": 1, "dataset": "openai/gsm8k", "model": "qwen3-30b-a3b"}

    def check(**changes):
        return TrainingRecordCheckOperator(
            task_id="check_training_record",
            bucket=bucket.name,
            record_object=record,
            parameters={**parameters, **changes},
        ).execute({})

    assert check() == f"gs://{bucket.name}/{record}"
    assert json.loads(bucket.blob(record).download_as_bytes())["parameters"] == parameters
    check()  # A retry with the same parameters resumes.
    with pytest.raises(AirflowFailException) as error:
        check(num_batches=8)
    assert "num_batches: 4 -> 8" in str(error.value)
    assert "batch_size" not in str(error.value)


def test_record_from_before_typed_parameters_still_resumes(bucket):
    """Records written while the DAG rendered the parameters with Jinja hold "50", not 50."""
    record = "qwen3-30b-a3b/trained/manual-run-1a2b3c4d/rl/tpu_rl_training_record.json"
    put(bucket, record, {"parameters": {"num_batches": "50", "batch_size": "4", "dataset": "openai/gsm8k"}})

    def check(**parameters):
        return TrainingRecordCheckOperator(
            task_id="check_training_record", bucket=bucket.name, record_object=record, parameters=parameters
        ).execute({})

    check(num_batches=50, batch_size=4, dataset="openai/gsm8k")
    with pytest.raises(AirflowFailException, match="num_batches: '50' -> 60"):
        check(num_batches=60, batch_size=4, dataset="openai/gsm8k")


def test_the_evaluation_before_training_is_the_runs_first_even_after_a_resume(bucket):
    """A resumed attempt's Pre line evaluates the checkpoint it restored; the gate compares the trained model
    with the model the run started from, kept in the training record by the first attempt's end."""

    from tpu_rl.operators.jobset import JobSetFailedError
    from tpu_rl.operators.workloads import TrainRlOperator
    from tpu_rl_testing import TUTORIAL_CONF, TaskInstanceStandIn, task_context

    def line(when, correct):
        return (
            f"{when} RL Training: corr={correct}, total=20, accuracy={correct * 5:.1f}%, partial_accuracy=50.0%, "
            f"format_accuracy=95.0%, mean_reward=0.5000"
        )

    ti = TaskInstanceStandIn("maxtext_rl_tpu", "manual__2026-12-01T10:00:00+00:00", "train_rl")
    ctx = task_context(ti, {**TUTORIAL_CONF, "gcs_bucket": bucket.name})
    train = TrainRlOperator(task_id="train_rl")
    record = train.bind_scope(ctx).layout.training_record_object
    put(bucket, record, {"parameters": {"num_batches": 50}})

    # The first attempt crashed after its Pre line (8/20); the retry resumed and evaluated its checkpoint (11/20).
    with pytest.raises(JobSetFailedError):  # retried by Airflow
        train.execute_complete(
            ctx,
            {
                "status": "failed",
                "message": "exited 3",
                "evaluation_lines": [line("Pre", 8)],
                "name": "j",
                "namespace": "default",
                "uid": "u",
            },
        )
    train.after_completed(ctx, {"evaluation_lines": [line("Pre", 11), line("Post", 12)]})

    evaluation = ti.pushed("evaluation")
    assert (evaluation["before"]["correct"], evaluation["after"]["correct"]) == (8, 12)
    stored = json.loads(bucket.blob(record).download_as_bytes())
    assert stored["evaluation_before"]["correct"] == 8 and stored["parameters"] == {"num_batches": 50}

    # Another run whose first attempt's Pre line was never seen (a triggerer restarted after the kubelet rotated
    # the log): the resumed attempt, which restored step 20, must not become "before".
    ctx["run_id"] = "manual__2026-12-02T10:00:00+00:00"
    train = TrainRlOperator(task_id="train_rl")
    record = train.bind_scope(ctx).layout.training_record_object
    put(bucket, record, {"parameters": {"num_batches": 50}})
    with pytest.raises(JobSetFailedError):
        train.execute_complete(
            ctx,
            {
                "status": "failed",
                "message": "exited 3",
                "evaluation_lines": [],
                "name": "j",
                "namespace": "default",
                "uid": "u",
            },
        )
    train.after_completed(
        ctx,
        {
            "evaluation_lines": [
                "I1202 11:00:00.1 1 checkpoint_manager.py:293] Restored params from step: 20 in 12.345 seconds",
                line("Pre", 11),
                line("Post", 12),
            ]
        },
    )
    evaluation = ti.pushed("evaluation")
    assert evaluation["before"] is None and evaluation["after"]["correct"] == 12
    assert "evaluation_before" not in json.loads(bucket.blob(record).download_as_bytes())


def test_a_stall_the_watchdog_ended_is_retried_once_and_the_same_stall_again_fails_for_good(bucket):
    """The first stall at step 30 fails the try for Airflow's retry (which resumes from the newest complete
    checkpoint) and is kept in the training record; the same stall in the retry fails the task without another: each
    try would hold the slice for the window, to stall there again. A stall at another step is retried again."""
    from tpu_rl.operators.jobset import JobSetFailedError
    from tpu_rl.operators.workloads import TrainRlOperator
    from tpu_rl_testing import TUTORIAL_CONF, TaskInstanceStandIn, task_context

    ti = TaskInstanceStandIn("maxtext_rl_tpu", "manual__2026-12-07T10:00:00+00:00", "train_rl")
    ctx = task_context(ti, {**TUTORIAL_CONF, "gcs_bucket": bucket.name})
    train = TrainRlOperator(task_id="train_rl")
    record = train.bind_scope(ctx).layout.training_record_object
    put(bucket, record, {"parameters": {"num_batches": 50}})

    def stuck(step):
        return {
            "status": "stuck",
            "stuck": {"kind": "stall", "step": step},
            "message": f"JobSet default/j was deleted by the watchdog: the training stalled at step {step}",
            "evaluation_lines": [],
            "log_tail": [],
            "name": "j",
            "namespace": "default",
            "uid": "u",
        }

    with pytest.raises(JobSetFailedError, match="stalled at step 30"):  # retried by Airflow
        train.execute_complete(ctx, stuck(30))
    with pytest.raises(JobSetFailedError, match="stalled at step 40"):
        train.execute_complete(ctx, stuck(40))
    with pytest.raises(AirflowFailException, match=r"stuck at step 30 \(stall\) in an earlier try too: not retried"):
        train.execute_complete(ctx, stuck(30))
    stalls = json.loads(bucket.blob(record).download_as_text())["stalls"]
    assert stalls == [{"kind": "stall", "step": s} for s in (30, 40, 30)]


def test_a_preemption_after_an_early_end_on_a_save_boundary_completes_the_training_without_a_resume(bucket):
    """The trainer dropped prompts and ended at step 40 of 50, a multiple of checkpoint_period, saved it, printed
    its success line, and lost its host in the evaluation after training: the training is complete."""
    from tpu_rl.operators.workloads import TrainRlOperator
    from tpu_rl_testing import TUTORIAL_CONF, TaskInstanceStandIn, task_context

    ti = TaskInstanceStandIn("maxtext_rl_tpu", "manual__2026-12-03T10:00:00+00:00", "train_rl")
    ctx = task_context(ti, {**TUTORIAL_CONF, "gcs_bucket": bucket.name, "checkpoint_period": 20})
    train = TrainRlOperator(task_id="train_rl")
    layout = train.bind_scope(ctx).layout
    put(bucket, layout.training_record_object, {"parameters": {"num_batches": 50}})
    for step in (20, 40):
        write_orbax_step(bucket, f"{layout.actor_checkpoints_prefix}{step}/", items=TrainRlOperator.items)
    preempted = {
        "status": "failed",
        "preemption": {"reason": "DisruptionTarget TerminationByKubelet", "pod": "head"},
        "message": "JobSet failed: the host is shutting down",
        "evaluation_lines": ["RL Training Completed Successfully!"],
        "log_tail": [],
        "name": "qwen-train-1a2b3c4d",
        "namespace": "default",
        "uid": "u",
    }

    result = train.execute_complete(ctx, preempted)  # neither resubmitted (a TaskDeferred) nor failed

    assert result["name"] == "qwen-train-1a2b3c4d" and ti.pushed("trainer_completed") is True
    assert "preemptions" not in json.loads(bucket.blob(layout.training_record_object).download_as_bytes())


def test_publish_replaces_stale_files_and_emits_the_asset_event(bucket):
    write_hf_export(bucket, STAGING, shards=2)
    put(bucket, f"{FINAL}model-00003-of-00003.safetensors", b"old")  # From an earlier, bigger export.
    put(bucket, f"{FINAL}model.safetensors.index.json", "{}")
    asset = Asset(name="qwen3-30b-a3b-rl", uri="gs://models/qwen3-30b-a3b/hf-trained/")
    publish = PublishHfExportOperator(
        task_id="publish_export",
        bucket=bucket.name,
        source_prefix=STAGING,
        destination_prefix=FINAL,
        asset=asset,
        final_step="47",
        source_run=f"gs://{bucket.name}/qwen3-30b-a3b/trained/manual-run-1a2b3c4d/rl/",
    )
    assert publish.outlets == [asset]
    events = OutletEventAccessors()
    assert publish.execute({"outlet_events": events}) == f"gs://{bucket.name}/{FINAL}"

    published = {b.name[len(FINAL) :]: b.size for b in bucket.list_blobs(prefix=FINAL)}
    staged = {b.name[len(STAGING) :]: b.size for b in bucket.list_blobs(prefix=STAGING)}
    assert published == staged
    assert "model-00003-of-00003.safetensors" not in published
    assert events[asset].extra == {
        "uri": f"gs://{bucket.name}/{FINAL}",
        "final_step": 47,
        "source_run": f"gs://{bucket.name}/qwen3-30b-a3b/trained/manual-run-1a2b3c4d/rl/",
    }
