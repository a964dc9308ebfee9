"""What a run reports of its training, decided without a cluster: the progress read from the bucket (and what
it costs in requests), the evaluation train_rl pushes, the quality gate before the export, the TPU time
delete_tpu_pools counts from GKE's operations, the Asset event's extra and the summary of the last task."""

from __future__ import annotations

import asyncio
import logging
import re
import struct
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from sim.maxtext_outputs import tensorboard_event_file, training_scalars
from tpu_rl import gke
from tpu_rl import training_metrics as tm
from tpu_rl.checkpoints import StoredObject
from tpu_rl.compat import AirflowFailException
from tpu_rl.config import ConfigError, RunConfig
from tpu_rl.operators.publish import RunPublishHfExportOperator
from tpu_rl.operators.run_report import QualityGateOperator, RunSummaryOperator
from tpu_rl.operators.workloads import TrainRlOperator
from tpu_rl.run import RunIdentity
from tpu_rl.triggers.jobset import JobSetTrigger
from tpu_rl.triggers.training_progress import TrainingProgress
from tpu_rl_testing import TUTORIAL_CONF, TaskInstanceStandIn, jobset_trigger, task_context

DAG_ID, RUN_ID = "maxtext_rl_tpu", "manual__2026-12-01T10:00:00+00:00"
PRE = (
    "Pre RL Training: corr=8, total=20, accuracy=40.0%, partial_accuracy=50.0%, format_accuracy=95.0%, "
    "mean_reward=0.4950"
)
POST = (
    "Post RL Training: corr=5, total=20, accuracy=25.0%, partial_accuracy=30.0%, format_accuracy=90.0%, "
    "mean_reward=0.3400"
)
SLICES = [{"pool": "tpu-0", "nodes_from": "2026-12-01T10:00:00+00:00", "nodes_gone": "2026-12-01T11:30:00+00:00"}]


def context(task_id: str, xcoms: dict | None = None, **params: Any) -> dict[str, Any]:
    """A task's context in the run, the run's XComs by (task id, key)."""
    return task_context(TaskInstanceStandIn(DAG_ID, RUN_ID, task_id, xcoms=xcoms), {**TUTORIAL_CONF, **params})


def evaluation_xcom(*lines: str) -> dict:
    return tm.parse_evaluation(lines).to_dict()


# --- progress while training --------------------------------------------------------------------------------


def records(data: bytes) -> list[int]:
    """Where each TFRecord of an event file ends (length, its CRC, the data, its CRC)."""
    ends, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        offset += 8 + 4 + length + 4
        ends.append(offset)
    return ends


class GrowingBucket:
    """One event file the trainer appends to, as Cloud Storage serves it; counts the requests."""

    def __init__(self, data: bytes, name: str) -> None:
        self.full, self.name, self.size = data, name, 0
        self.updated = datetime(2026, 12, 1, tzinfo=UTC)
        self.lists, self.reads, self.bytes_read = 0, 0, 0

    def flush_to(self, size: int) -> None:
        self.size, self.updated = size, self.updated + timedelta(minutes=1)

    async def list(self, prefix: str, delimiter: str | None = None):
        self.lists += 1
        return ({self.name: StoredObject(self.name, self.size, self.updated)} if self.size else {}), []

    async def read(self, name: str, first: int | None = None, last: int | None = None) -> bytes:
        self.reads += 1
        data = self.full[: self.size][first or 0 : None if last is None else last + 1]
        self.bytes_read += len(data)
        return data


def test_progress_reads_only_what_the_trainer_added_at_most_two_requests_a_minute(caplog):
    """The API load of the progress: one listing a minute, plus one ranged read when the file grew. The ETA comes
    from the times of the steps read so far (a step a minute), whatever the read cut off."""
    _, data = tensorboard_event_file(
        training_scalars("gs://b/run", 30, range(1, 31)), lambda step: 1_800_000_600 + 60 * step
    )
    bucket = GrowingBucket(data, "events.out.tfevents.1800000000.head-0")
    progress = TrainingProgress({"bucket": "b", "prefix": "run/tensorboard/", "train_steps": 30})
    log = logging.getLogger("progress")
    ends = records(data)
    minutes = 30
    with caplog.at_level(logging.INFO, "progress"):
        for minute in range(minutes):
            if minute % 2 == 1:  # the writer flushes every 2 minutes (tensorboardX's 120 s)
                bucket.flush_to(ends[min(len(ends) - 1, (minute + 1) * len(ends) // minutes)])
            asyncio.run(progress.report(bucket, log))

    assert bucket.lists == minutes and bucket.reads == minutes // 2
    assert (bucket.lists + bucket.reads) / minutes == 1.5
    assert bucket.bytes_read == len(data)  # each byte read once
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == minutes - 1  # nothing before the first flush
    assert lines[-1].startswith("Training progress: step 30/30 (100%), ")
    for line in lines[:-1]:  # the steps left at a minute a step
        step = int(re.search(r"step (\d+)/30", line)[1])
        eta = "ETA after the second logged step" if step < 2 else f"ETA {30 - step}m"
        assert f", {eta}" in line if step < 30 else "ETA" not in line, line


def test_the_training_trigger_serialises_where_its_event_files_are():
    training = {"bucket": "b", "prefix": "m/trained/r/rl/tensorboard/", "train_steps": 50, "gcp_conn_id": "g"}
    trigger = jobset_trigger(name="t", namespace="default", training=training)

    path, kwargs = trigger.serialize()
    again = JobSetTrigger(**kwargs)

    assert kwargs["training"] == training and again.training == training
    old_kwargs = {k: v for k, v in kwargs.items() if k != "training"}  # serialised before progress existed
    assert JobSetTrigger(**old_kwargs).training is None


def test_train_rl_points_its_trigger_at_the_runs_event_files_and_pushes_the_evaluation():
    train = TrainRlOperator(task_id="train_rl")
    ctx = context("train_rl")
    scope = train.bind_scope(ctx)

    assert train.trigger_kwargs()["training"] == {
        "bucket": scope.config.gcs_bucket,
        "prefix": scope.layout.tensorboard_prefix,
        "train_steps": 50,
        "gcp_conn_id": "google_cloud_default",
    }
    train.after_completed(ctx, {"evaluation_lines": [PRE, POST]})
    assert ctx["ti"].xcoms["train_rl", "evaluation"] == evaluation_xcom(PRE, POST)
    train.after_completed(ctx, {})  # an adopted Completed JobSet: nothing was watched
    assert ctx["ti"].xcoms["train_rl", "evaluation"] is None


# --- the quality gate ---------------------------------------------------------------------------------------


#: The same fall in accuracy as PRE -> POST, on 200 test prompts: beyond chance.
PRE_200 = (
    "Pre RL Training: corr=80, total=200, accuracy=40.0%, partial_accuracy=50.0%, format_accuracy=95.0%, "
    "mean_reward=0.4950"
)
POST_200 = (
    "Post RL Training: corr=50, total=200, accuracy=25.0%, partial_accuracy=30.0%, format_accuracy=90.0%, "
    "mean_reward=0.3400"
)


def test_a_regression_fails_the_gate_without_retry_with_both_sets_of_figures():
    gate = QualityGateOperator(task_id="quality_gate")
    ctx = context(
        "quality_gate", {("train_rl", "evaluation"): evaluation_xcom(PRE_200, POST_200)}, require_no_regression=True
    )

    with pytest.raises(AirflowFailException) as failure:
        gate.execute(ctx)

    message = str(failure.value)
    assert "not exported or published" in message and "checkpoints stay under gs://" in message
    assert "accuracy 40.0% (80/200)" in message and "accuracy 25.0% (50/200)" in message
    assert "beyond chance" in message


def test_a_fall_within_chance_on_few_prompts_passes_the_gate_and_says_why(capsys):
    """8/20 -> 5/20: one prompt is 5 points on 20, and the fall is within what 20 prompts can tell from chance."""
    gate = QualityGateOperator(task_id="quality_gate")
    gate.execute(
        context("quality_gate", {("train_rl", "evaluation"): evaluation_xcom(PRE, POST)}, require_no_regression=True)
    )
    assert (
        "require_no_regression passes: accuracy fell from 40.0% (8/20) to 25.0% (5/20), within chance"
        in capsys.readouterr().out
    )


def test_without_a_gate_a_worse_model_goes_on():
    gate = QualityGateOperator(task_id="quality_gate")

    gate.execute(context("quality_gate", {("train_rl", "evaluation"): evaluation_xcom(PRE, POST)}))


# --- the TPU time -------------------------------------------------------------------------------------------


def test_a_slice_counts_from_its_last_successful_create_to_its_delete():
    ops = [
        {"type": "CREATE_NODE_POOL", "pool": "tpu-0", "end": "2026-12-01T09:00:00Z", "failed": True},  # stockout
        {"type": "CREATE_NODE_POOL", "pool": "tpu-0", "end": "2026-12-01T10:00:00.123456789Z", "failed": False},
        {"type": "DELETE_NODE_POOL", "pool": "tpu-0", "end": "2026-12-01T11:30:00Z", "failed": False},
        {"type": "CREATE_NODE_POOL", "pool": "tpu-1", "end": "2026-12-01T10:05:00Z", "failed": False},  # still up
        {"type": "CREATE_NODE_POOL", "pool": "other-run", "end": "2026-12-01T08:00:00Z", "failed": False},
    ]

    assert gke.slice_times(ops, ["tpu-0", "tpu-1"]) == [
        {"pool": "tpu-0", "nodes_from": "2026-12-01T10:00:00.123456+00:00", "nodes_gone": "2026-12-01T11:30:00+00:00"}
    ]


# --- the Asset event and the summary ------------------------------------------------------------------------


def published_extra(xcoms: dict, **params: Any) -> dict:
    publish = RunPublishHfExportOperator(
        task_id="publish_export", source_prefix="s/", asset=SimpleNamespace(), final_step=50
    )
    publish.bind_scope(context("publish_export", xcoms, **params))
    return publish.event_extra


def test_the_published_event_carries_the_evaluation_and_the_tpu_cost():
    extra = published_extra(
        {("train_rl", "evaluation"): evaluation_xcom(PRE, POST), ("delete_tpu_pools", "tpu_slices"): SLICES}
    )

    assert extra["evaluation"]["before"]["accuracy"] == 40.0 and extra["evaluation"]["after"]["accuracy"] == 25.0
    assert extra["tpu"]["chip_hours"] == 96.0 and extra["tpu"]["cost_usd"] == 259.2
    assert extra["tpu_note"] == "96.0 chip-hours, about $259.20 at $2.70 per chip-hour, 1 slice(s)"


def test_a_run_without_evaluation_publishes_no_figures_and_says_why():
    extra = published_extra({("delete_tpu_pools", "tpu_slices"): SLICES}, extra_train_args={"num_test_batches": 0})

    assert extra["evaluation"] is None
    assert extra["evaluation_note"] == "no evaluation: extra_train_args sets num_test_batches to 0"


def summary_context(**params: Any) -> dict:
    return context(
        "pipeline_done",
        {
            ("train_rl", "evaluation"): evaluation_xcom(PRE, POST),
            ("delete_tpu_pools", "tpu_slices"): SLICES,
            ("verify_training", "return_value"): 50,
            ("publish_export", "return_value"): "gs://b/m/hf-trained/r/",
        },
        **params,
    )


def test_the_last_task_logs_and_returns_the_summary_and_sends_nothing_by_default(monkeypatch):
    sent = []
    monkeypatch.setattr(
        "airflow.providers.smtp.notifications.smtp.SmtpNotifier.notify", lambda self, ctx: sent.append(self)
    )

    summary = RunSummaryOperator(task_id="pipeline_done").execute(summary_context())

    assert "final step   50/50" in summary and "96.0 chip-hours" in summary and "gs://b/m/hf-trained/r/" in summary
    assert sent == []


def test_the_summary_is_mailed_through_the_configured_connection(monkeypatch):
    sent = []
    monkeypatch.setattr(
        "airflow.providers.smtp.notifications.smtp.SmtpNotifier.notify", lambda self, ctx: sent.append(self)
    )

    summary = RunSummaryOperator(task_id="pipeline_done").execute(
        summary_context(notify_conn_id="smtp_team", notify_to="ml@example.com")
    )

    (mail,) = sent
    assert mail.smtp_conn_id == "smtp_team" and mail.to == "ml@example.com"
    assert "final step   50/50" in mail.html_content and summary


def test_a_mail_that_cannot_go_out_does_not_fail_a_published_run(monkeypatch, capsys):
    def refuse(self, ctx):
        raise ConnectionRefusedError("smtp down")

    monkeypatch.setattr("airflow.providers.smtp.notifications.smtp.SmtpNotifier.notify", refuse)

    RunSummaryOperator(task_id="pipeline_done").execute(summary_context(notify_conn_id="smtp", notify_to="a@b.c"))

    assert "Could not send the summary through connection smtp: smtp down" in capsys.readouterr().out


@pytest.mark.parametrize(
    "params, field", [({"notify_conn_id": "smtp"}, "notify_to"), ({"notify_to": "a@b.c"}, "notify_conn_id")]
)
def test_a_notification_needs_its_connection_and_its_recipients(params, field):
    with pytest.raises(ConfigError, match=f"{field}: is empty"):
        RunConfig.from_params({**TUTORIAL_CONF, **params})


def gke_operation(kind: str, pool: str, end: str, cluster: str = TUTORIAL_CONF["cluster_name"]) -> SimpleNamespace:
    link = f"https://container.googleapis.com/v1/projects/p/locations/r/clusters/{cluster}/nodePools/{pool}"
    return SimpleNamespace(
        operation_type=SimpleNamespace(name=kind),
        target_link=link,
        end_time=end,
        error=SimpleNamespace(code=0),
        status_message="",
    )


def delete_pools_after_the_last_delete(monkeypatch, list_operations) -> dict:
    from tpu_rl.hooks.gke import GkeApiHook
    from tpu_rl.operators import tpu_pools

    monkeypatch.setattr(GkeApiHook, "delete_node_pool", lambda self, cluster, pool: None)  # gone: nothing to delete
    monkeypatch.setattr(GkeApiHook, "list_operations", lambda self: list_operations())
    ctx = context("delete_tpu_pools")
    operator = tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools")
    operator.submit(ctx)  # every pool's delete is done: GKE no longer knows them
    return ctx["ti"].xcoms


def test_delete_tpu_pools_counts_the_runs_slice_from_gkes_operations(monkeypatch):
    pool = RunIdentity(DAG_ID, RUN_ID).tpu_pool_name(0)
    ops = [
        gke_operation("CREATE_NODE_POOL", pool, "2026-12-01T10:00:00Z"),
        gke_operation("DELETE_NODE_POOL", pool, "2026-12-01T11:30:00Z"),
        gke_operation("DELETE_NODE_POOL", pool, "2026-12-01T12:00:00Z", cluster="another-cluster"),
    ]

    xcoms = delete_pools_after_the_last_delete(monkeypatch, lambda: ops)

    assert xcoms["delete_tpu_pools", "tpu_slices"] == [
        {"pool": pool, "nodes_from": "2026-12-01T10:00:00+00:00", "nodes_gone": "2026-12-01T11:30:00+00:00"}
    ]


def test_a_slice_time_that_cannot_be_read_never_fails_the_teardown(monkeypatch, capsys):
    def unavailable():
        raise RuntimeError("503 the service is unavailable")

    xcoms = delete_pools_after_the_last_delete(monkeypatch, unavailable)

    assert ("delete_tpu_pools", "tpu_slices") not in xcoms
    assert "Could not list GKE's operations to count the slices' TPU time" in capsys.readouterr().out


class LinesLog:
    """The trigger's logger, keeping the lines it logs."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: Any) -> None:
        self.lines.append(message % args)

    warning = info


def training_trigger_lines(
    monkeypatch, bucket: GrowingBucket, steps: list[tuple[float, int]], ends_after: float, interval: float = 3
) -> list[str]:
    """The progress lines of the training trigger's loop: the file grows to ``steps`` (seconds, size) and the
    JobSet ends after ``ends_after`` seconds."""
    import contextlib

    from tpu_rl.triggers import jobset as trigger_module
    from tpu_rl.triggers.wait_progress import Progress

    @contextlib.asynccontextmanager
    async def reader(self, bucket_name):
        yield bucket

    monkeypatch.setattr(trigger_module.GcsReadHook, "reader", reader)
    trigger = jobset_trigger(
        name="t", namespace="default", training={"bucket": "b", "prefix": "p/", "train_steps": 30, "interval": interval}
    )
    trigger._log = LinesLog()

    async def run() -> None:
        progress = Progress(10)
        async with contextlib.AsyncExitStack() as readers:
            loop = asyncio.create_task(trigger._report_training(progress, readers))
            for at, size in steps:
                await asyncio.sleep(at)
                bucket.flush_to(size)
            await asyncio.sleep(ends_after - sum(at for at, _ in steps))
            progress.finished.set()
            await asyncio.wait_for(loop, 5)

    asyncio.run(run())
    return [line for line in trigger._log.lines if line.startswith("Training progress")]


def full_event_file() -> GrowingBucket:
    _, data = tensorboard_event_file(training_scalars("gs://b/run", 30, range(1, 31)))
    return GrowingBucket(data, "events.out.tfevents.1800000000.head-0")


def test_a_short_training_still_shows_its_last_progress_when_it_ends(monkeypatch):
    bucket = full_event_file()  # the first read finds nothing; the trainer writes; the JobSet ends

    lines = training_trigger_lines(monkeypatch, bucket, [(0.2, len(bucket.full))], ends_after=0.5)

    assert len(lines) == 1 and lines[0].startswith("Training progress: step 30/30 (100%)")


def test_no_more_than_one_progress_line_an_interval_even_when_the_training_ends(monkeypatch):
    bucket = full_event_file()
    bucket.flush_to(len(bucket.full))  # there from the start: the first read logs

    lines = training_trigger_lines(monkeypatch, bucket, [], ends_after=0.5)

    assert len(lines) == 1 and bucket.lists == 2  # the read at the end found nothing new: no second line


def test_a_training_that_ends_within_an_interval_of_its_last_line_shows_where_it_got_to(monkeypatch):
    bucket = full_event_file()
    bucket.flush_to(len(bucket.full) // 2)  # half-way at the first read

    lines = training_trigger_lines(monkeypatch, bucket, [(0.2, len(bucket.full))], ends_after=0.5)

    assert len(lines) == 2 and lines[-1].startswith("Training progress: step 30/30 (100%)")
    assert "step 30/30" not in lines[0]


#: A run whose first candidate stocked out and whose slice came from the second, Spot at its own price.
CANDIDATES = [
    {"zone": "us-east5-b", "capacity_type": "on_demand"},
    {"zone": "us-east5-b", "capacity_type": "spot", "price_per_chip_hour": 1.1},
]
CAPACITY_XCOM = {
    "serving": 1,
    "attempts": [{"candidate": 0, "outcome": "stockout", "detail": "GCE_STOCKOUT", "at": ""}],
    "lines": [
        "candidate 0 (on_demand in us-east5-b): left, stockout (GCE_STOCKOUT)",
        "candidate 1 (spot in us-east5-b): the slices came from it",
    ],
}


def test_the_event_and_the_summary_count_the_tpu_cost_at_the_price_of_the_candidate_the_slices_came_from():
    xcoms = {
        ("delete_tpu_pools", "tpu_slices"): [{**SLICES[0], "candidate": 1}],
        ("create_tpu_pools", "capacity"): CAPACITY_XCOM,
    }
    extra = published_extra(xcoms, capacity_candidates=CANDIDATES)
    assert extra["tpu"]["chip_hours"] == 96.0 and extra["tpu"]["cost_usd"] == 105.6
    assert extra["tpu"]["by_candidate"] == [
        {
            "candidate": 1,
            "describe": "spot in us-east5-b",
            "chip_hours": 96.0,
            "price_per_chip_hour": 1.1,
            "cost_usd": 105.6,
            "slices": 1,
        }
    ]
    assert extra["tpu_note"] == (
        "candidate 1 (spot in us-east5-b): 96.0 chip-hours, about $105.60 at $1.10 per chip-hour, 1 slice(s)"
    )
    ctx = summary_context(capacity_candidates=CANDIDATES)
    ctx["ti"].xcoms.update(xcoms)
    summary = RunSummaryOperator(task_id="pipeline_done").execute(ctx)
    assert "TPU          candidate 1 (spot in us-east5-b): 96.0 chip-hours, about $105.60" in summary
    assert "  capacity     candidate 0 (on_demand in us-east5-b): left, stockout (GCE_STOCKOUT)\n" in summary
    assert "               candidate 1 (spot in us-east5-b): the slices came from it\n" in summary


def test_a_single_candidate_runs_cost_is_counted_as_before():
    extra = published_extra({("delete_tpu_pools", "tpu_slices"): SLICES})
    assert "by_candidate" not in extra["tpu"]
    assert extra["tpu_note"] == "96.0 chip-hours, about $259.20 at $2.70 per chip-hour, 1 slice(s)"


def test_after_a_move_on_preemption_the_summary_lists_train_rls_view_of_the_candidates():
    """train_rl moved the slices from Spot to on demand after preemptions: its XCom capacity stands for
    create_tpu_pools's, which still says the slices came from Spot."""
    moved = {
        "serving": 0,
        "attempts": [],
        "lines": ["candidate 1 (spot in us-east5-b): left, preempted (TerminationByKubelet)"],
    }
    ctx = summary_context(capacity_candidates=CANDIDATES)
    ctx["ti"].xcoms.update({("create_tpu_pools", "capacity"): CAPACITY_XCOM, ("train_rl", "capacity"): moved})
    summary = RunSummaryOperator(task_id="pipeline_done").execute(ctx)
    assert "  capacity     candidate 1 (spot in us-east5-b): left, preempted (TerminationByKubelet)\n" in summary
    assert "the slices came from it" not in summary
