"""prune_checkpoints against a real GCS emulator: what keep_checkpoints removes once the run's export is published and
verified, and what it never touches (another run's steps, anything while the published export is not whole)."""

from __future__ import annotations

import pytest
from checkpoint_writers import put, write_hf_export, write_orbax_step

from tpu_rl.operators.retention import PruneCheckpointsOperator
from tpu_rl.operators.workloads import TrainRlOperator
from tpu_rl_testing import TUTORIAL_CONF, TaskInstanceStandIn, task_context

pytestmark = pytest.mark.checkpoints

RUN_ID = "manual__2026-12-01T10:00:00+00:00"
ASIDE = "50-20261201T100000Z/"


def prune_context(bucket, run_id=RUN_ID, published=True, **conf):
    ti = TaskInstanceStandIn("maxtext_rl_tpu", run_id, "prune_checkpoints")
    ctx = task_context(ti, {**TUTORIAL_CONF, "gcs_bucket": bucket.name, **conf})
    operator = PruneCheckpointsOperator(task_id="prune_checkpoints")
    layout = operator.bind_scope(ctx).layout
    ti.xcoms["verify_training", "return_value"] = 50
    if published:
        ti.xcoms["publish_export", "return_value"] = layout.uri(layout.export_prefix)
    return operator, ctx, layout


def write_run(bucket, layout, steps=(10, 20, 50)):
    """The run's saves, a folder set aside before a resume, its published export and its training record."""
    for step in steps:
        write_orbax_step(bucket, f"{layout.actor_checkpoints_prefix}{step}/", items=TrainRlOperator.items)
    put(bucket, f"{layout.set_aside_prefix}{ASIDE}model_params/_METADATA", {})
    write_hf_export(bucket, layout.export_prefix, shards=2)
    put(bucket, layout.training_record_object, {"parameters": {}})


def names(bucket, prefix):
    return {b.name[len(prefix) :] for b in bucket.list_blobs(prefix=prefix)}


def step_folders(bucket, layout):
    return sorted({name.split("/")[1] for name in names(bucket, layout.checkpoints_prefix)} - {""})


def test_exported_keeps_only_the_step_exported_and_never_another_runs(bucket):
    operator, ctx, layout = prune_context(bucket, keep_checkpoints="exported")
    _, _, other = prune_context(bucket, run_id=RUN_ID + "-other")
    write_run(bucket, layout)
    write_run(bucket, other)

    result = operator.execute(ctx)

    assert result["removed"] == ["actor/10/", "actor/20/", f"_set_aside/{ASIDE}"] and result["kept"] == ["actor/50/"]
    assert step_folders(bucket, layout) == ["50"]
    assert "commit_success.txt" in names(bucket, f"{layout.actor_checkpoints_prefix}50/")
    assert step_folders(bucket, other) == ["10", "20", "50", ASIDE.rstrip("/")]
    assert names(bucket, layout.export_prefix) == names(bucket, other.export_prefix)
    assert bucket.blob(layout.training_record_object).exists()


def test_none_removes_every_step_once_the_export_is_verified(bucket):
    operator, ctx, layout = prune_context(bucket, keep_checkpoints="none")
    write_run(bucket, layout)
    assert operator.execute(ctx)["kept"] == []
    assert names(bucket, layout.checkpoints_prefix) == set()
    assert bucket.blob(layout.training_record_object).exists()  # the record and the export stay


def test_nothing_goes_while_the_published_export_is_not_whole(bucket):
    operator, ctx, layout = prune_context(bucket, keep_checkpoints="none")
    write_run(bucket, layout)
    bucket.blob(f"{layout.export_prefix}generation_config.json").delete()  # the model's repository has one
    assert operator.execute(ctx)["removed"] == []
    assert step_folders(bucket, layout) == ["10", "20", "50", ASIDE.rstrip("/")]


def test_nothing_goes_when_this_run_did_not_publish(bucket):
    operator, ctx, layout = prune_context(bucket, published=False, keep_checkpoints="none")
    write_run(bucket, layout)
    assert operator.execute(ctx)["removed"] == []
    assert step_folders(bucket, layout) == ["10", "20", "50", ASIDE.rstrip("/")]


def test_all_lists_and_removes_nothing(bucket):
    operator, ctx, layout = prune_context(bucket)
    write_run(bucket, layout)
    assert operator.execute(ctx) == {"removed": [], "kept": [], "freed_gb": 0.0}
    assert step_folders(bucket, layout) == ["10", "20", "50", ASIDE.rstrip("/")]
