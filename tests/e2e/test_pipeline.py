"""The whole pipeline as users run it: triggered through the REST API of a local Airflow (scheduler,
triggerer, dag-processor, api-server on PostgreSQL) against the simulated TPU cluster.

Faults are injected on the simulation's side (sim/faults.py), never through the DAG's params: the DAG
runs exactly as it would against GKE, in existing-cluster mode.
"""

from __future__ import annotations

import uuid

import pytest

from sim import faults
from tpu_rl.run import RunIdentity
from tpu_rl_testing import SIM_CONF, selected_scenarios

pytestmark = pytest.mark.e2e

DAG_ID = "maxtext_rl_tpu"
#: A run's training waits its turn on the standing slice behind the other scenarios' (15 minutes and more in make
#: test on two cores).
RUN_TIMEOUT = 1800


def new_run_id(label: str) -> str:
    return f"e2e__{label}__{uuid.uuid4().hex[:8]}"


def trigger_and_wait(airflow, conf: dict, label: str) -> tuple[str, str]:
    run_id = airflow.trigger(DAG_ID, conf, run_id=new_run_id(label))
    return run_id, airflow.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT)


@pytest.fixture(scope="module")
def sim_faults():
    """The fault switch; the rules this module sets are removed after it (others' rules stay: other
    scenarios run alongside)."""
    with faults.rules_removed_after(faults.core_api()) as api:
        yield api


def crash_rule(run_id: str) -> str:
    """The fault rule of the crashing run: named for it, as another session on the same simulation (the 3.1.7
    stack's) sets its own."""
    return f"e2e-train-crash-{RunIdentity(DAG_ID, run_id).key}"


#: Saves every 10 steps; once its export is published, the run keeps only the step exported.
CRASH_CONF = {**SIM_CONF, "checkpoint_period": 10, "keep_checkpoints": "exported"}


@pytest.fixture(scope="module")
def started(airflow, sim_faults, request) -> dict[str, list[str]]:
    """The module's runs the selected tests read, triggered at once (their trainings take the standing slice in
    turn): one whose training crashes at step 30 on every attempt (exit code 3) until its rule is removed, and one
    or two of the same conf (``concurrent``, ``concurrent-second``)."""
    selected = selected_scenarios(request, request.module)
    runs = {"crash": [], "concurrent": []}
    if "crash" in selected:
        crash = new_run_id("crash")
        train_jobset = RunIdentity(DAG_ID, crash).jobset_name(CRASH_CONF.get("workload_prefix", "qwen"), "train")
        faults.set_fault(
            sim_faults,
            crash_rule(crash),
            prefix=train_jobset,
            stage="train_rl",
            maxtext_fault="crash-at-step=30",
            exit_code=3,
        )
        runs["crash"].append(airflow.trigger(DAG_ID, CRASH_CONF, run_id=crash))
    for i, label in enumerate(("concurrent", "concurrent-second")):
        if label in selected:
            runs["concurrent"].append(airflow.trigger(DAG_ID, SIM_CONF, run_id=new_run_id(f"concurrent{i}")))
    return runs


def objects(gcs, bucket: str, prefix: str) -> dict[str, int]:
    return {b.name[len(prefix) :]: b.size for b in gcs.list_blobs(bucket, prefix=prefix)}


@pytest.fixture(scope="module")
def concurrent_runs(airflow, started) -> list[tuple[str, str]]:
    """The runs of the same conf: [(run_id, final state)]."""
    return [(run_id, airflow.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT)) for run_id in started["concurrent"]]


@pytest.mark.scenario("concurrent")
def test_happy_path(airflow, gcs, concurrent_runs):
    run_id, state = concurrent_runs[0]
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert state == "success", {t: ti["state"] for t, ti in tasks.items()}
    assert all(ti["state"] in ("success", "skipped") for ti in tasks.values())
    assert airflow.xcom(DAG_ID, run_id, "verify_training") == 50
    published = airflow.xcom(DAG_ID, run_id, "publish_export")
    slug = RunIdentity(DAG_ID, run_id).slug
    assert published == f"gs://{SIM_CONF['gcs_bucket']}/qwen3-30b-a3b/hf-trained/{slug}/"
    exported = objects(gcs, SIM_CONF["gcs_bucket"], f"qwen3-30b-a3b/hf-trained/{slug}/")
    assert "model.safetensors.index.json" in exported and "config.json" in exported
    assert "generation_config.json" in exported  # copied from the Instruct repository by the export's JobSet
    # keep_checkpoints 'all' (the default): the run's step stays.
    assert "50/commit_success.txt" in objects(
        gcs, SIM_CONF["gcs_bucket"], f"qwen3-30b-a3b/trained/{slug}/rl/checkpoints/actor/"
    )
    events = airflow.request("GET", "/api/v2/assets/events?limit=100&order_by=-timestamp")["asset_events"]
    assert any(e["source_run_id"] == run_id and e["extra"]["uri"] == published for e in events)


@pytest.mark.scenario("crash")
def test_training_failure_fails_the_run_tears_down_and_clearing_resumes(airflow, gcs, sim_faults, started):
    conf, [run_id] = CRASH_CONF, started["crash"]
    assert airflow.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT) == "failed"

    tasks = airflow.task_instances(DAG_ID, run_id)
    assert tasks["train_rl"]["state"] == "failed"
    # A crash is not a preemption: it fails each try, and the run fails once Airflow's retries (2) are spent.
    assert tasks["train_rl"]["try_number"] == 3
    assert tasks["delete_tpu_pools"]["state"] == "success"
    assert tasks["delete_cluster"]["state"] == "success"
    assert tasks["maxtext_to_hf"]["state"] == "upstream_failed"
    log = airflow.task_log(DAG_ID, run_id, "train_rl", tasks["train_rl"]["try_number"])
    assert "workload-container exited 3" in log, log[-3000:]
    assert "resuming from step" not in log  # no preemption resume

    # Periodic saves before the crash survive (nothing was exported: prune_checkpoints never ran); the user fixes
    # the cause and clears train_rl.
    slug = RunIdentity(DAG_ID, run_id).slug
    actor = f"qwen3-30b-a3b/trained/{slug}/rl/checkpoints/actor/"
    assert {"10/commit_success.txt", "20/commit_success.txt"} <= set(objects(gcs, conf["gcs_bucket"], actor))
    conversion_try = tasks["hf_to_maxtext"]["try_number"]
    faults.clear_faults(sim_faults, crash_rule(run_id))
    cleared = airflow.clear(DAG_ID, run_id, ["train_rl"])
    assert "hf_to_maxtext" not in cleared and "train_rl" in cleared
    assert airflow.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT) == "success"

    tasks = airflow.task_instances(DAG_ID, run_id)
    assert tasks["hf_to_maxtext"]["try_number"] == conversion_try  # the conversion was not redone
    assert airflow.xcom(DAG_ID, run_id, "verify_training") == 50
    resumed_log = airflow.task_log(DAG_ID, run_id, "train_rl", tasks["train_rl"]["try_number"])
    assert "Adopting" not in resumed_log  # a new JobSet, resuming from the run's own checkpoints
    # keep_checkpoints 'exported': once the export is published and checked again, only the step exported stays.
    assert tasks["prune_checkpoints"]["state"] == "success"
    assert {name.split("/")[0] for name in objects(gcs, conf["gcs_bucket"], actor)} == {"50"}
    assert "50/commit_success.txt" in objects(gcs, conf["gcs_bucket"], actor)


@pytest.mark.scenario("concurrent", "concurrent-second")
def test_two_concurrent_runs_do_not_collide(airflow, gcs, concurrent_runs):
    run_ids = [run_id for run_id, _ in concurrent_runs]
    assert [state for _, state in concurrent_runs] == ["success", "success"]
    published = [airflow.xcom(DAG_ID, run_id, "publish_export") for run_id in run_ids]
    assert published[0] != published[1]
    for run_id, uri in zip(run_ids, published, strict=True):
        assert RunIdentity(DAG_ID, run_id).slug in uri
        prefix = uri.split("/", 3)[3]
        assert "model.safetensors.index.json" in objects(gcs, SIM_CONF["gcs_bucket"], prefix)


def test_rest_api_trigger_with_bad_conf_fails_in_the_first_task(airflow):
    run_id, state = trigger_and_wait(airflow, {**SIM_CONF, "topology": "7x9"}, "badconf")
    assert state == "failed"
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert tasks["validate_config"]["state"] == "failed"
    assert tasks["validate_config"]["try_number"] == 1  # not retried: bad params do not get better
    assert all(ti["state"] in ("upstream_failed", None) for t, ti in tasks.items() if t != "validate_config")
    log = airflow.task_log(DAG_ID, run_id, "validate_config", 1)
    assert "topology: '7x9' is not a v6e topology" in log
