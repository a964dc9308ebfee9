"""Preempted trainings through the scheduler: triggered through the local Airflow's REST API against the
simulated cluster, the preemption injected on the simulation's side (sim/faults.py, ``preempt-at-step``: the
trainer's pod ends with exit code 143 and the condition DisruptionTarget TerminationByKubelet, as a Spot VM's
graceful shutdown leaves it). The scenarios' runs are started together by a module fixture, each with its own
run id and fault rule (removed afterwards); each test reads the outcome of its own.
"""

from __future__ import annotations

import json
import uuid

import pytest

from sim import faults
from tpu_rl import training_metrics
from tpu_rl.config import RunConfig
from tpu_rl.contract import XCOM_PREEMPTIONS
from tpu_rl.layout import GcsLayout
from tpu_rl.run import RunIdentity
from tpu_rl_testing import SIM_CONF, selected_scenarios

pytestmark = pytest.mark.e2e

DAG_ID = "maxtext_rl_tpu"
RUN_TIMEOUT = 1200


#: The scenarios, started together by ``preempted``: (conf, emulator fault, how many attempts it hits).
SCENARIOS = {
    "spot": ({**SIM_CONF, "checkpoint_period": 8}, "preempt-at-step=30", 1),
    "budget": ({**SIM_CONF, "checkpoint_period": 10, "max_preemptions": 2}, "preempt-at-step=20", None),  # every one
    "halfstep": ({**SIM_CONF, "checkpoint_period": 10}, "preempt-at-step=30,skip-commit", 1),
    # The host goes during the evaluation after training, after the final save and the success line.
    "after_final": ({**SIM_CONF, "checkpoint_period": 10}, "preempt-in-evaluation", 1),
}


@pytest.fixture(scope="module")
def preempted(airflow, request):
    """Starts the run of every scenario a selected test reads (its ``scenario`` mark) at once (their trainings
    take the standing slice in turn: exclusive placement); {label: (run_id, layout)}. Removes its fault rules
    afterwards."""
    selected = selected_scenarios(request, request.module)
    api, rules, started = faults.core_api(), [], {}
    try:
        for label, (conf, maxtext_fault, times) in SCENARIOS.items():
            if label not in selected:
                continue
            run_id = f"e2e__{label}__{uuid.uuid4().hex[:8]}"
            run = RunIdentity(DAG_ID, run_id)
            config = RunConfig.from_params(conf)
            rule = f"e2e-{label}-{run.key}"
            faults.set_fault(
                api,
                rule,
                prefix=run.jobset_name(config.workload_prefix, "train"),
                stage="train_rl",
                maxtext_fault=maxtext_fault,
                times=times,
            )
            rules.append(rule)
            airflow.trigger(DAG_ID, conf, run_id=run_id)
            started[label] = (run_id, GcsLayout(config, run))
        yield started
    finally:
        for rule in rules:
            faults.clear_faults(api, rule)


def names(gcs, layout: GcsLayout, prefix: str) -> set[str]:
    return {b.name[len(prefix) :] for b in gcs.list_blobs(layout.bucket, prefix=prefix)}


def train_log(airflow, run_id: str) -> str:
    tasks = airflow.task_instances(DAG_ID, run_id)
    return airflow.task_log(DAG_ID, run_id, "train_rl", tasks["train_rl"]["try_number"])


@pytest.mark.scenario("spot")
def test_a_spot_preemption_at_step_30_resumes_from_the_last_checkpoint_and_the_run_succeeds(airflow, gcs, preempted):
    run_id, layout = preempted["spot"]
    assert airflow.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT) == "success"

    tasks = airflow.task_instances(DAG_ID, run_id)
    assert tasks["train_rl"]["try_number"] == 1  # resumed within the try: Airflow's retries are untouched
    assert airflow.xcom(DAG_ID, run_id, "verify_training") == 50
    log = train_log(airflow, run_id)
    assert (
        "preempted (DisruptionTarget TerminationByKubelet: TPU host maintenance or node shutdown, e.g. a Spot VM "
        "reclaimed (the kubelet terminated the pod); pod "
    ) in log
    assert "at step 30: resuming from step 24 (preemption 1 of 3)" in log
    assert "Restored params from step: 24 in " in log  # the trainer's own line (Tunix)
    # The resumed attempt's Pre line scores the weights it restored: the run's "before" is the first attempt's,
    # kept in the training record when that attempt ended.
    record = json.loads(gcs.bucket(layout.bucket).blob(layout.training_record_object).download_as_bytes())
    evaluation = airflow.xcom(DAG_ID, run_id, "train_rl", "evaluation")
    assert evaluation["before"] == record["evaluation_before"]
    pres = {training_metrics.parse_evaluation([line]).before.accuracy for line in log.splitlines() if "Pre RL" in line}
    assert pres - {evaluation["before"]["accuracy"]}, pres  # the resumed attempt's own Pre line scored otherwise

    # The checkpoints prove the resume: the second attempt's event file starts right after step 24.
    events = sorted(n for n in names(gcs, layout, layout.tensorboard_prefix) if training_metrics.is_event_file(n))
    assert len(events) == 2
    resumed = gcs.bucket(layout.bucket).blob(layout.tensorboard_prefix + events[1]).download_as_bytes()
    steps = [step for step, _ in training_metrics.read_scalars([resumed])[training_metrics.LOSS_TAG]]
    assert steps[0] == 25 and steps[-1] == 50
    committed = {
        n.split("/")[0]
        for n in names(gcs, layout, layout.actor_checkpoints_prefix)
        if n.endswith("/commit_success.txt")
    }
    assert {"8", "16", "24", "32", "40", "48", "50"} <= committed

    accounting = airflow.xcom(DAG_ID, run_id, "train_rl", XCOM_PREEMPTIONS)
    assert accounting["count"] == 1 and accounting["steps_recomputed"] == 6
    assert accounting["events"][0]["resumed_from"] == 24 and accounting["events"][0]["preempted_at_step"] == 30
    assert accounting["seconds_lost"] > 0


@pytest.mark.scenario("budget")
def test_preemptions_beyond_the_budget_fail_the_run_with_a_message_that_says_so(airflow, gcs, preempted):
    run_id, layout = preempted["budget"]  # every attempt is preempted
    assert airflow.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT) == "failed"

    tasks = airflow.task_instances(DAG_ID, run_id)
    assert tasks["train_rl"]["state"] == "failed"
    assert tasks["train_rl"]["try_number"] == 1  # not retried: a retry would only spend more preemptions
    assert tasks["delete_cluster"]["state"] == "success"
    log = train_log(airflow, run_id)
    assert "(preemption 1 of 2)" in log and "(preemption 2 of 2)" in log
    assert "preemption 3 is beyond max_preemptions 2, so the training is not resumed" in log
    record = json.loads(gcs.bucket(layout.bucket).blob(layout.training_record_object).download_as_bytes())
    assert [p["resumed_from"] for p in record["preemptions"]] == [20, 20, None]
    assert airflow.xcom(DAG_ID, run_id, "train_rl", XCOM_PREEMPTIONS)["count"] == 3


@pytest.mark.scenario("halfstep")
def test_a_step_half_written_when_preempted_is_set_aside_and_the_resume_starts_from_the_step_before(
    airflow, gcs, preempted
):
    run_id, layout = preempted["halfstep"]
    assert airflow.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT) == "success"

    set_aside = names(gcs, layout, layout.set_aside_prefix)
    folders = {n.split("/")[0] for n in set_aside}
    assert len(folders) == 1 and next(iter(folders)).startswith("30-")
    folder = next(iter(folders))
    assert f"{folder}/_CHECKPOINT_METADATA" in set_aside and f"{folder}/commit_success.txt" not in set_aside
    log = train_log(airflow, run_id)
    assert "actor/30/ is not a complete step (no commit_success.txt in actor/30/" in log
    assert f"{layout.uri(layout.set_aside_prefix)}{folder}/" in log
    assert "at step 30: resuming from step 20 (preemption 1 of 3)" in log
    assert "Restored params from step: 20 in " in log
    # The resumed trainer saved step 30 again, whole, in the step folder the half-written one left free.
    assert "30/commit_success.txt" in names(gcs, layout, layout.actor_checkpoints_prefix)
    assert airflow.xcom(DAG_ID, run_id, "verify_training") == 50
    accounting = airflow.xcom(DAG_ID, run_id, "train_rl", XCOM_PREEMPTIONS)
    assert accounting["steps_recomputed"] == 10
    assert accounting["events"][0]["set_aside"] == [f"{layout.uri(layout.set_aside_prefix)}{folder}/"]


@pytest.mark.scenario("after_final")
def test_a_preemption_after_the_final_save_completes_the_training_without_resubmitting_it(airflow, gcs, preempted):
    """Resubmitting would reload the 30B model and evaluate twice for nothing: the final step is committed."""
    run_id, layout = preempted["after_final"]
    assert airflow.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT) == "success"

    tasks = airflow.task_instances(DAG_ID, run_id)
    assert tasks["train_rl"]["try_number"] == 1
    log = train_log(airflow, run_id)
    assert "Preempted after its final save (actor/50/ is the run's last step): the training is complete" in log
    assert "resuming from step" not in log
    events = [n for n in names(gcs, layout, layout.tensorboard_prefix) if training_metrics.is_event_file(n)]
    assert len(events) == 1  # one trainer attempt: nothing was resubmitted
    assert airflow.xcom(DAG_ID, run_id, "verify_training") == 50
    evaluation = airflow.xcom(DAG_ID, run_id, "train_rl", "evaluation")
    assert evaluation["before"] and evaluation["after"] is None  # the evaluation after training was cut short
