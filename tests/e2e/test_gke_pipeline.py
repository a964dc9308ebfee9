"""The tutorial's own path through the scheduler: the GKE emulator (sim/gke_emulator.py, reached through the
real google-cloud-container client) creates the cluster and the TPU pools, the pipeline installs JobSet on
the new cluster, trains, deletes the pools right after training and the cluster at the end.

The scenarios do not share a cluster, so they run as concurrent DAG runs: all are triggered at once, at the
start of the e2e session (``gke_scenarios``, by a test marked ``e2e_start``), and go on while the other modules'
scenarios run; each test, ordered last (``e2e_last``), reads the outcome of its own.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime

import pytest

from sim import faults, gke_faults
from tpu_rl.run import GKE_LABEL_RUN_KEY, RunIdentity
from tpu_rl_testing import GKE_PARENT as PARENT
from tpu_rl_testing import SIM_CREATE_CONF, SMALL_SLICE, cluster_or_none

pytestmark = pytest.mark.e2e

DAG_ID = "maxtext_rl_tpu"
RUN_TIMEOUT = 1200
#: How long the capacity scenarios' slices are held back by the GKE emulator.
HELD_SECONDS = 90
CANDIDATES = [
    {"zone": "us-east5-b", "capacity_type": "on_demand"},
    {"zone": "us-east5-b", "capacity_type": "spot", "price_per_chip_hour": 1.1},
    {"zone": "us-east5-a", "capacity_type": "on_demand", "price_per_chip_hour": 3.0},
]


@pytest.fixture(scope="session")
def gke_scenarios(airflow_stack, session_gke):
    """Triggers every scenario at once; yields {scenario: (run_id, conf)}."""
    airflow_stack.wait_for_healthy_dag(DAG_ID)
    airflow_stack.unpause(DAG_ID)
    gke = session_gke
    suffix = uuid.uuid4().hex[:6]
    scenarios = {
        # From nothing: cluster, JobSet, two slices (two pools), training across both.
        "two_slices": {
            **SIM_CREATE_CONF,
            **SMALL_SLICE,
            "cluster_name": f"e2e-new-{suffix}",
            "cluster_nodepool_count": 2,
            "ici_expert_parallelism": 1,  # MaxText's multislice branch has no expert axis
        },
        # No v6e capacity in the zone when the pool is created.
        "stockout": {**SIM_CREATE_CONF, **SMALL_SLICE, "cluster_name": f"e2e-stockout-{suffix}"},
        # A cluster someone else created, with a pool of theirs: adopted, used, left as it was.
        # A cluster made without the DNS endpoint's user access: the run reaches it through its IP endpoint.
        "foreign": {
            **SIM_CREATE_CONF,
            **SMALL_SLICE,
            "cluster_name": f"e2e-foreign-{suffix}",
            "control_plane_endpoint": "ip",
        },
    }
    # Spot capacity GKE holds back for a while (the create RUNNING while GKE retries, nothing said in the pool):
    # the run waits, deferred, within capacity_wait_minutes, then trains.
    scenarios["spot_held"] = {
        **SIM_CREATE_CONF,
        **SMALL_SLICE,
        "cluster_name": f"e2e-spot-{suffix}",
        "capacity_type": "spot",
        "capacity_wait_minutes": 10,
    }
    # A flex-start pool is created empty; the slice comes later (the autoscaler's provisioning), then trains.
    scenarios["flex_start"] = {
        **SIM_CREATE_CONF,
        **SMALL_SLICE,
        "cluster_name": f"e2e-flex-{suffix}",
        "capacity_type": "flex_start",
    }
    # Three capacity candidates: on demand stocked out in us-east5-b, Spot there without quota, on demand in us-east5-a.
    scenarios["candidates"] = {
        **SIM_CREATE_CONF,
        **SMALL_SLICE,
        "cluster_name": f"e2e-cand-{suffix}",
        "capacity_candidates": CANDIDATES,
    }
    # Spot preempted past its budget there (one preemption): the pools move to the next candidate, on demand in
    # us-east5-a, and the training resumes there from its newest complete checkpoint.
    scenarios["moved"] = {
        **SIM_CREATE_CONF,
        **SMALL_SLICE,
        "cluster_name": f"e2e-moved-{suffix}",
        "capacity_candidates": CANDIDATES[1:],
        "max_preemptions_per_candidate": 1,
    }
    run_ids = {name: f"e2e__gke_{name}__{suffix}" for name in scenarios}
    workloads = SIM_CREATE_CONF.get("workload_prefix", "qwen")
    preempted = f"e2e-moved-preempted-{suffix}"
    faults.set_fault(
        faults.core_api(),
        preempted,
        prefix=RunIdentity(DAG_ID, run_ids["moved"]).jobset_name(workloads, "train"),
        stage="train_rl",
        maxtext_fault="preempt-at-step=3",  # after the save of step 2 (checkpoint_period 2)
        times=1,
    )
    candidate_pools = f"tpu-{RunIdentity(DAG_ID, run_ids['candidates']).key}-"
    gke_faults.set_fault(
        f"e2e-candidates-{suffix}",
        "stockout",
        pool_prefix=candidate_pools,
        zone="us-east5-b",
        capacity_type="on_demand",
    )
    gke_faults.set_fault(f"e2e-candidates-quota-{suffix}", "quota", pool_prefix=candidate_pools, capacity_type="spot")
    stockout_pools = f"tpu-{RunIdentity(DAG_ID, run_ids['stockout']).key}-"
    gke_faults.set_fault(f"e2e-stockout-{suffix}", "stockout", pool_prefix=stockout_pools)
    for name in ("spot_held", "flex_start"):
        gke_faults.set_fault(
            f"e2e-{name}-{suffix}",
            "capacity-held",
            seconds=HELD_SECONDS,
            pool_prefix=f"tpu-{RunIdentity(DAG_ID, run_ids[name]).key}-",
        )
    foreign = _create_foreign_cluster(gke, scenarios["foreign"]["cluster_name"])
    try:
        for name, conf in scenarios.items():
            airflow_stack.trigger(DAG_ID, conf, run_id=run_ids[name])
        yield {name: (run_ids[name], scenarios[name]) for name in scenarios}
    finally:
        for name in ("stockout", "spot_held", "flex_start", "candidates", "candidates-quota"):
            gke_faults.clear_faults(f"e2e-{name}-{suffix}")
        faults.clear_faults(faults.core_api(), preempted)
        if cluster_or_none(gke, foreign):
            gke.delete_cluster(name=f"{PARENT}/clusters/{foreign}")


@pytest.fixture(scope="module")
def runs(airflow, gke_scenarios):
    """{scenario: (run_id, conf, final state)}, once every scenario's run ended."""
    states = {name: airflow.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT) for name, (run_id, _) in gke_scenarios.items()}
    return {name: (run_id, conf, states[name]) for name, (run_id, conf) in gke_scenarios.items()}


@pytest.mark.e2e_start
def test_the_scenarios_are_triggered_at_once(airflow, gke_scenarios):
    for run_id, _ in gke_scenarios.values():
        assert airflow.run(DAG_ID, run_id)["state"] in ("queued", "running", "success", "failed")


def _create_foreign_cluster(gke, name: str) -> str:
    """A cluster and a CPU pool made outside the pipeline (another team's), labelled with another run key."""
    import time

    from google.cloud.container_v1 import Cluster

    body = {
        "name": name,
        "resource_labels": {GKE_LABEL_RUN_KEY: "0ther0ne"},
        "release_channel": {"channel": "REGULAR"},
        "workload_identity_config": {"workload_pool": f"{SIM_CREATE_CONF['project']}.svc.id.goog"},
        "node_pools": [
            {
                "name": "default-pool",
                "initial_node_count": 1,
                "config": {"machine_type": "n2-standard-8", "service_account": SIM_CREATE_CONF["node_service_account"]},
            },
            {
                "name": "cpu-np",
                "initial_node_count": 1,
                "locations": [SIM_CREATE_CONF["zone"]],
                # a pool made for conversions: a boot disk that holds the model's download
                "config": {
                    "machine_type": "n4-standard-64",
                    "disk_type": "hyperdisk-balanced",
                    "disk_size_gb": 500,
                    "service_account": SIM_CREATE_CONF["node_service_account"],
                    "workload_metadata_config": {"mode": "GKE_METADATA"},
                },
            },
        ],
    }
    operation = gke.create_cluster(parent=PARENT, cluster=Cluster.from_json(json.dumps(body)))
    deadline = time.monotonic() + 300
    while gke.get_operation(name=f"{PARENT}/operations/{operation.name}").status.name != "DONE":
        assert time.monotonic() < deadline, "the foreign cluster was not created in 300 s"
        time.sleep(2)
    return name


def pool_operations(gke, run_id: str, slices: int) -> dict[str, list]:
    """The GKE operations on the run's TPU pools, by type."""
    run = RunIdentity(DAG_ID, run_id)
    pools = {run.tpu_pool_name(i) for i in range(slices)}
    by_type: dict[str, list] = {}
    for op in gke.list_operations(parent=PARENT).operations:
        if op.target_link.rsplit("/", 1)[-1] in pools:
            by_type.setdefault(op.operation_type.name, []).append(op)
    return by_type


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.e2e_last
def test_a_new_cluster_gets_jobset_and_trains_on_two_slices(airflow, gke, runs):
    run_id, conf, state = runs["two_slices"]
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert state == "success", {t: ti["state"] for t, ti in tasks.items()}
    jobset_log = airflow.task_log(DAG_ID, run_id, "ensure_jobset", tasks["ensure_jobset"]["try_number"])
    assert "Applying the JobSet v0.10.1 release shipped with the package (18 objects)" in jobset_log
    assert "JobSet v0.10.1 is installed: its controller is Available and its webhooks default a JobSet" in jobset_log
    assert airflow.xcom(DAG_ID, run_id, "verify_training") == 4
    # One slice trains, one samples: MaxText's multislice branch (the emulator splits the devices as it does).
    train_log = airflow.task_log(DAG_ID, run_id, "train_rl", tasks["train_rl"]["try_number"])
    assert "Running with Multislice" in train_log, train_log[-3000:]

    ops = pool_operations(gke, run_id, 2)
    assert len(ops["CREATE_NODE_POOL"]) == 2 and len(ops["DELETE_NODE_POOL"]) == 2
    assert all(not op.error.code for op in ops["CREATE_NODE_POOL"] + ops["DELETE_NODE_POOL"])
    # The slice goes right after training, not after the export (on the CPU pool): its deletion is requested
    # while the export still runs. (Before the export starts, too, on an idle machine; on a loaded one the
    # teardown's own start-up can take longer than the checks before the export.)
    first_delete = min(_time(op.start_time) for op in ops["DELETE_NODE_POOL"])
    assert _time(tasks["train_rl"]["end_date"]) < first_delete < _time(tasks["maxtext_to_hf"]["end_date"])
    # After the run the emulator holds nothing of it.
    assert cluster_or_none(gke, conf["cluster_name"]) is None


@pytest.mark.e2e_last
def test_a_stockout_fails_the_run_says_what_to_do_and_leaves_nothing(airflow, gke, runs):
    run_id, conf, state = runs["stockout"]
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert state == "failed"
    create = tasks["create_tpu_pools"]
    # not retried: capacity does not come back in a minute
    assert (create["state"], create["try_number"]) == ("failed", 1)
    assert tasks["train_rl"]["state"] == "upstream_failed"
    assert tasks["delete_tpu_pools"]["state"] == "success" and tasks["delete_cluster"]["state"] == "success"
    log = airflow.task_log(DAG_ID, run_id, "create_tpu_pools", 1)
    pool = RunIdentity(DAG_ID, run_id).tpu_pool_name(0)
    assert f"GKE could not create TPU node pool {pool}: " in log and "GCE_STOCKOUT" in log, log[-3000:]
    assert "fix: there is no v6e-16 capacity in us-east5-b now" in log
    assert cluster_or_none(gke, conf["cluster_name"]) is None


@pytest.mark.e2e_last
def test_a_cluster_and_pool_the_run_did_not_create_are_never_deleted(airflow, gke, runs):
    run_id, conf, state = runs["foreign"]
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert state == "success", {t: ti["state"] for t, ti in tasks.items()}
    create_log = airflow.task_log(DAG_ID, run_id, "create_cluster", tasks["create_cluster"]["try_number"])
    assert "already exists" in create_log and "adopting it" in create_log
    delete_log = airflow.task_log(DAG_ID, run_id, "delete_cluster", tasks["delete_cluster"]["try_number"])
    assert "was created by run key 0ther0ne, not by this run" in delete_log
    cluster = cluster_or_none(gke, conf["cluster_name"])
    assert cluster is not None and cluster.status.name == "RUNNING"
    assert sorted(p.name for p in cluster.node_pools) == ["cpu-np", "default-pool"]  # the run's own pool is gone


@pytest.mark.e2e_last
def test_spot_capacity_held_back_is_waited_for_deferred_and_the_run_trains(airflow, gke, runs):
    run_id, conf, state = runs["spot_held"]
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert state == "success", {t: ti["state"] for t, ti in tasks.items()}
    create = tasks["create_tpu_pools"]
    assert create["try_number"] == 1 and create["duration"] >= HELD_SECONDS - 5  # it waited, in its first try
    log = airflow.task_log(DAG_ID, run_id, "create_tpu_pools", 1)
    assert "Creating node pool" in log and "GKE had no capacity" not in log, log[-3000:]
    pool = pool_operations(gke, run_id, 1)["CREATE_NODE_POOL"][0]
    assert not pool.error.code
    assert airflow.xcom(DAG_ID, run_id, "verify_training") == 4


@pytest.mark.e2e_last
def test_a_flex_start_pool_is_created_empty_and_the_training_waits_for_its_slice(airflow, gke, gcs, runs):
    from tpu_rl import training_metrics
    from tpu_rl.run_scope import RunScope

    run_id, conf, state = runs["flex_start"]
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert state == "success", {t: ti["state"] for t, ti in tasks.items()}
    # GKE's create ends at once, without the pool's nodes (they come HELD_SECONDS after it started), and
    # create_tpu_pools does not wait for them as it would for a stockout: the slice is the training's to wait
    # for. (GKE's own times, not the task's: a loaded worker can take a minute to start and resume a task.)
    create = pool_operations(gke, run_id, 1)["CREATE_NODE_POOL"][0]
    assert not create.error.code
    nodes_from = _time(create.start_time).timestamp() + HELD_SECONDS
    assert _time(create.end_time).timestamp() < nodes_from - 30, (create.start_time, create.end_time)
    log = airflow.task_log(DAG_ID, run_id, "create_tpu_pools", tasks["create_tpu_pools"]["try_number"])
    assert "GCE_STOCKOUT" not in log, log[-3000:]
    # train_rl waited, in its first try, for the slice: the trainer started (its event file's writer start)
    # only once the nodes existed.
    assert tasks["train_rl"]["try_number"] == 1
    layout = RunScope(conf, RunIdentity(DAG_ID, run_id)).layout
    started = [
        training_metrics.event_file_started(b.name)
        for b in gcs.list_blobs(layout.bucket, prefix=layout.tensorboard_prefix)
        if training_metrics.is_event_file(b.name)
    ]
    assert started and min(started) >= nodes_from - 2, (started, nodes_from)
    assert airflow.xcom(DAG_ID, run_id, "verify_training") == 4
    assert cluster_or_none(gke, conf["cluster_name"]) is None


@pytest.mark.e2e_last
def test_a_run_whose_first_candidate_stocks_out_and_second_lacks_quota_trains_on_the_third(airflow, gke, runs):
    run_id, conf, state = runs["candidates"]
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert state == "success", {t: ti["state"] for t, ti in tasks.items()}
    assert tasks["create_tpu_pools"]["try_number"] == 1  # the failover is within the task, not its retries
    log = airflow.task_log(DAG_ID, run_id, "create_tpu_pools", 1)
    assert "candidate 0 (on_demand in us-east5-b) left: stockout" in log, log[-3000:]
    assert "candidate 1 (spot in us-east5-b) left: quota" in log
    assert "Capacity candidate 2 (on_demand in us-east5-a): the slices came from it" in log
    capacity = airflow.xcom(DAG_ID, run_id, "create_tpu_pools", "capacity")
    assert capacity["serving"] == 2 and [a["outcome"] for a in capacity["attempts"]] == ["stockout", "quota"]
    creates = sorted(pool_operations(gke, run_id, 1)["CREATE_NODE_POOL"], key=lambda op: _time(op.start_time))
    assert [bool(op.error.code) for op in creates] == [True, False]  # the stockout, then us-east5-a (quota: refused)
    assert airflow.xcom(DAG_ID, run_id, "verify_training") == 4
    slices = airflow.xcom(DAG_ID, run_id, "delete_tpu_pools", "tpu_slices")
    assert [s["candidate"] for s in slices] == [2]
    summary = airflow.xcom(DAG_ID, run_id, "pipeline_done")
    assert "TPU          candidate 2 (on_demand in us-east5-a): " in summary and "at $3.00 per chip-hour" in summary
    assert "capacity     candidate 0 (on_demand in us-east5-b): left, stockout" in summary


@pytest.mark.e2e_last
def test_a_spot_run_preempted_past_its_budget_there_finishes_on_the_next_candidate_and_reports_both_costs(
    airflow, gke, runs
):
    run_id, conf, state = runs["moved"]
    tasks = airflow.task_instances(DAG_ID, run_id)
    assert state == "success", {t: ti["state"] for t, ti in tasks.items()}
    assert tasks["train_rl"]["try_number"] == 1  # the move is within the try, as a preemption's resume is
    log = airflow.task_log(DAG_ID, run_id, "train_rl", 1)
    assert "candidate 0 (spot in us-east5-b) left: preempted (DisruptionTarget" in log, log[-3000:]
    assert "trying candidate 1 (on_demand in us-east5-a)" in log
    assert "Restored params from step: 2 in " in log  # the trainer's own line, on the new candidate's slice
    assert airflow.xcom(DAG_ID, run_id, "verify_training") == 4
    # GKE created the pool twice (Spot in us-east5-b, then on demand in us-east5-a) and deleted it twice.
    ops = pool_operations(gke, run_id, 1)
    assert len(ops["CREATE_NODE_POOL"]) == 2 and len(ops["DELETE_NODE_POOL"]) == 2
    assert all(not op.error.code for op in ops["CREATE_NODE_POOL"] + ops["DELETE_NODE_POOL"])
    capacity = airflow.xcom(DAG_ID, run_id, "train_rl", "capacity")
    assert capacity["serving"] == 1 and [a["outcome"] for a in capacity["attempts"]] == ["preempted"]
    # Each slice's time at its own candidate's price, and the sum: in the summary and the Asset event's cost.
    slices = airflow.xcom(DAG_ID, run_id, "delete_tpu_pools", "tpu_slices")
    assert sorted(s["candidate"] for s in slices) == [0, 1]
    summary = airflow.xcom(DAG_ID, run_id, "pipeline_done")
    assert "TPU          candidate 0 (spot in us-east5-b): " in summary and "at $1.10 per chip-hour" in summary
    assert "; candidate 1 (on_demand in us-east5-a): " in summary and "at $3.00 per chip-hour" in summary
    assert "; in all " in summary
    assert cluster_or_none(gke, conf["cluster_name"]) is None
