"""What a run shows of its training, through the scheduler on the simulation: progress in train_rl's log
(from the trainer's event files in the bucket, read by the triggerer), the evaluation in XCom and in the
published Asset event, the TPU cost of the slice the run created, the last task's summary; and a model that
got worse failing the quality gate, publishing nothing.

Both runs are triggered at once (the created cluster makes one of them minutes long) by the session fixture
``training_runs`` (conftest.py), and each test reads the outcome of its own. The regression is the emulator's
fault ``eval-regression`` (sim/faults.py), set for that run's training JobSet only and removed after.
"""

from __future__ import annotations

import pytest

from tpu_rl.run import RunIdentity

pytestmark = pytest.mark.e2e

DAG_ID = "maxtext_rl_tpu"
MODEL = "qwen3-30b-a3b"


@pytest.fixture(scope="module")
def runs(airflow, training_runs):
    """The runs of ``training_runs`` (conftest.py), shared with the Training tab's test."""
    return training_runs


def asset_events(airflow, run_id: str) -> list[dict]:
    events = airflow.request("GET", "/api/v2/assets/events?limit=100&order_by=-timestamp")["asset_events"]
    return [e for e in events if e["source_run_id"] == run_id]


@pytest.mark.scenario("trained")
def test_a_run_shows_progress_evaluation_cost_and_a_summary(airflow, runs):
    run_id, conf, state = runs["trained"]
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert state == "success", {t: ti["state"] for t, ti in tasks.items()}

    # Progress, from the triggerer, in train_rl's log: the emulated trainer's event file grew over its run
    # (TRAINED_SECONDS), so a line came while it trained, with an ETA, and one at the end.
    log = airflow.task_log(DAG_ID, run_id, "train_rl", tasks["train_rl"]["try_number"])
    progress = [line for line in log.splitlines() if "Training progress: " in line]
    assert progress and "step 4/4 (100%)" in progress[-1] and "reward " in progress[-1], log[-3000:]
    assert any("/4 (" in line and "step 4/4" not in line and "ETA" in line for line in progress[:-1]), progress
    assert "evaluation before training: accuracy" in log

    # The evaluation the trainer logged (5 test batches of 4 prompts), better after training.
    evaluation = airflow.xcom(DAG_ID, run_id, "train_rl", key="evaluation")
    assert evaluation["before"]["total"] == 20 and evaluation["after"]["total"] == 20
    assert evaluation["after"]["accuracy"] > evaluation["before"]["accuracy"]

    # The slice the run created, counted from GKE's operations: 16 chips while its pool existed.
    (slice_,) = airflow.xcom(DAG_ID, run_id, "delete_tpu_pools", key="tpu_slices")
    assert slice_["pool"] == RunIdentity(DAG_ID, run_id).tpu_pool_name(0)
    assert slice_["nodes_from"] < slice_["nodes_gone"]

    (event,) = asset_events(airflow, run_id)
    extra = event["extra"]
    assert extra["evaluation"] == evaluation
    assert extra["tpu"]["slices"] == [slice_] and extra["tpu"]["chip_hours"] > 0
    assert extra["tpu"]["cost_usd"] == pytest.approx(extra["tpu"]["chip_hours"] * 2.70, abs=0.01)

    summary = airflow.xcom(DAG_ID, run_id, "pipeline_done")
    assert "final step   4/4" in summary
    assert f"before accuracy {evaluation['before']['accuracy']:.1f}%" in summary
    assert f"after  accuracy {evaluation['after']['accuracy']:.1f}%" in summary
    assert f"{extra['tpu']['chip_hours']:.1f} chip-hours, about $" in summary
    assert extra["uri"] in summary
    assert "Run summary" in airflow.task_log(DAG_ID, run_id, "pipeline_done", tasks["pipeline_done"]["try_number"])


@pytest.mark.scenario("regressed")
def test_a_model_that_got_worse_fails_the_gate_with_both_figures_and_is_not_published(airflow, runs, gcs):
    run_id, conf, state = runs["regressed"]
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert state == "failed", {t: ti["state"] for t, ti in tasks.items()}
    assert tasks["train_rl"]["state"] == "success"
    assert tasks["quality_gate"]["state"] == "failed"
    assert tasks["quality_gate"]["try_number"] == 1  # figures do not change on a retry
    for task_id in ("maxtext_to_hf", "verify_export", "publish_export", "pipeline_done"):
        assert tasks[task_id]["state"] == "upstream_failed", (task_id, tasks[task_id]["state"])
    assert tasks["delete_cluster"]["state"] == "success"

    evaluation = airflow.xcom(DAG_ID, run_id, "train_rl", key="evaluation")
    before, after = evaluation["before"]["accuracy"], evaluation["after"]["accuracy"]
    assert after < before
    log = airflow.task_log(DAG_ID, run_id, "quality_gate", 1)
    assert f"accuracy fell from {before:.1f}% (" in log and "beyond chance" in log, log[-3000:]
    assert f"before training: accuracy {before:.1f}%" in log and f"after: accuracy {after:.1f}%" in log

    # Nothing published or exported; the training's checkpoints stay.
    slug = RunIdentity(DAG_ID, run_id).slug
    assert asset_events(airflow, run_id) == []
    assert not list(gcs.list_blobs(conf["gcs_bucket"], prefix=f"{MODEL}/hf-trained/{slug}/"))
    assert not list(gcs.list_blobs(conf["gcs_bucket"], prefix=f"{MODEL}/hf-staging/{slug}/"))
    actor = f"{MODEL}/trained/{slug}/rl/checkpoints/actor/"
    assert any(b.name.endswith("/commit_success.txt") for b in gcs.list_blobs(conf["gcs_bucket"], prefix=actor))
