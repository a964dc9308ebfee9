"""The reaper DAG through the scheduler, against the GKE emulator: a pipeline run whose Airflow metadata is
deleted mid-training leaves its cluster, TPU pool, JobSet and Secret; the reaper keeps them while the run
lives, reports them once it is gone (failing: TPU capacity left), keeps them within the grace period, and
with deletion allowed removes them, and nothing else: a cluster made with keep_cluster and a cluster
without this package's marks stay."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

import pytest

from sim import faults
from tpu_rl import gke as gke_bodies
from tpu_rl.config import RunConfig
from tpu_rl.run import RunIdentity
from tpu_rl_testing import GKE_PARENT, REPO, SIM_CREATE_CONF, SMALL_SLICE, cluster_or_none, stack_answer

pytestmark = pytest.mark.e2e

DAG_ID, REAPER = "maxtext_rl_tpu", "maxtext_rl_tpu_reaper"
WATCH = [f"{SIM_CREATE_CONF['project']}/{SIM_CREATE_CONF['region']}"]


@pytest.fixture(scope="module")
def reaper(airflow):
    airflow.wait_for_healthy_dag(REAPER)
    assert airflow.request("GET", f"/api/v2/dags/{REAPER}")["is_paused"], "the reaper must be paused at creation"
    airflow.unpause(REAPER)

    def run(**conf) -> tuple[str, dict[str, dict]]:
        run_id = airflow.trigger(REAPER, {"watch": WATCH, **conf})
        state = airflow.wait_for_run(REAPER, run_id, 300)
        rows = airflow.xcom(REAPER, run_id, "reap", key="report")
        return state, {row["resource"]: row for row in rows}

    yield run
    airflow.request("PATCH", f"/api/v2/dags/{REAPER}", {"is_paused": True})


def _create(gke, body: dict) -> None:
    from google.cloud.container_v1 import Cluster

    operation = gke.create_cluster(parent=GKE_PARENT, cluster=Cluster.from_json(json.dumps(body)))
    deadline = time.monotonic() + 300
    while gke.get_operation(name=f"{GKE_PARENT}/operations/{operation.name}").status.name != "DONE":
        assert time.monotonic() < deadline, f"cluster {body['name']} not created in 300 s"
        time.sleep(2)


def _lose_run(dag_id: str, run_id: str) -> None:
    """Deletes the run from the local stack's metadata database (scripts/airflow-stack.sh's own; its task
    instances go with it)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(stack_answer("db-url"))
    try:
        with engine.begin() as connection:
            deleted = connection.execute(
                text("DELETE FROM dag_run WHERE dag_id = :dag_id AND run_id = :run_id"),
                {"dag_id": dag_id, "run_id": run_id},
            ).rowcount
    finally:
        engine.dispose()
    assert deleted == 1


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(2)
    return value


def test_the_reaper_removes_what_a_lost_run_left_and_nothing_else(airflow, gke, reaper):
    suffix = uuid.uuid4().hex[:6]
    kept_name, foreign_name, lost_name = f"reap-keep-{suffix}", f"reap-other-{suffix}", f"reap-lost-{suffix}"
    # A cluster of a run long gone that asked to keep it: the pipeline's own request body.
    kept_conf = {**SIM_CREATE_CONF, **SMALL_SLICE, "cluster_name": kept_name, "keep_cluster": True}
    _create(
        gke,
        gke_bodies.cluster_body(
            RunConfig.from_params(kept_conf), RunIdentity(DAG_ID, f"gone__{suffix}"), datetime.now(UTC)
        ),
    )
    # A cluster someone else made: no marks of this package.
    _create(
        gke,
        {
            "name": foreign_name,
            "release_channel": {"channel": "REGULAR"},
            "node_pools": [
                {
                    "name": "default-pool",
                    "initial_node_count": 1,
                    # an account the simulation's identity may act as (sim/gke_iam.py)
                    "config": {
                        "machine_type": "n2-standard-8",
                        "service_account": SIM_CREATE_CONF["node_service_account"],
                    },
                }
            ],
        },
    )
    conf = {**SIM_CREATE_CONF, **SMALL_SLICE, "cluster_name": lost_name}
    run_id = airflow.trigger(DAG_ID, conf, run_id=f"e2e__reaper__{suffix}")
    lost = RunIdentity(DAG_ID, run_id)
    try:
        # Training that lasts: the fault switch of the run's new cluster, set before its slice exists.
        _wait(lambda: (c := cluster_or_none(gke, lost_name)) and c.status.name == "RUNNING", 300, "no cluster")
        kubeconfig = (
            REPO
            / ".sim/gke/clusters"
            / (f"{SIM_CREATE_CONF['project']}-{SIM_CREATE_CONF['region']}-{lost_name}/kubeconfig")
        )
        faults.set_fault(faults.core_api(str(kubeconfig)), "long-training", stage="train_rl", run_seconds=900)
        _wait(
            lambda: airflow.task_instances(DAG_ID, run_id).get("train_rl", {}).get("state") == "deferred",
            600,
            "train_rl never deferred",
        )
        pool = f"{GKE_PARENT}/clusters/{lost_name}/nodePools/{lost.tpu_pool_name(0)}"
        cluster = f"{GKE_PARENT}/clusters/{lost_name}"
        jobset = f"{lost_name}: default/{RunConfig.from_params(conf).workload_prefix}-train-{lost.key}"
        secret = f"{lost_name}: default/{lost.secret_name()}"
        kept = f"{GKE_PARENT}/clusters/{kept_name}"

        # While the run lives, everything of it stays, even with deletion allowed.
        state, rows = reaper(delete=True, grace_minutes=0)
        assert state == "success"
        for name in (cluster, pool, jobset, secret):
            assert (rows[name]["decision"], rows[name]["reason"]) == ("keep", "its run is running"), rows.get(name)
            assert rows[name]["owner_run_id"] == run_id
        assert rows[pool]["tpu_chips"] == 16 and rows[cluster]["tpu_chips"] == 16
        assert (rows[kept]["decision"], rows[kept]["reason"]) == ("keep", "created with keep_cluster")
        assert not [r for r in rows if foreign_name in r], "a cluster without the marks was listed"

        # Airflow loses the run mid-training (a metadata database restored from before it; the API refuses to
        # delete a running run): its teardown never runs.
        _lose_run(DAG_ID, run_id)
        time.sleep(5)
        state, rows = reaper(delete=False, grace_minutes=600)
        assert state == "success" and rows[cluster]["reason"] == "younger than the grace period (600.0 min)"

        state, rows = reaper(delete=False, grace_minutes=0)
        left_rows = [rows.get(name) for name in (cluster, pool)]
        assert state == "failed", f"TPU capacity left behind must fail the reaper: {left_rows}"
        # The scenarios beside this one leave what their ended runs no longer need (a Completed JobSet in a shared
        # cluster, say), which the reaper reaps as well: this run's are the ones in its cluster.
        left = {name for name, row in rows.items() if row["decision"] == "reap" and lost_name in name}
        assert {cluster, pool, secret} <= left <= {cluster, pool, secret, jobset}
        assert rows[cluster]["reason"] == "its run no longer exists in Airflow" and not rows[cluster]["deleted"]
        assert rows[kept]["decision"] == "keep"
        assert cluster_or_none(gke, lost_name) is not None, "a dry run deleted something"

        state, rows = reaper(delete=True, grace_minutes=0)
        assert state == "success"
        assert all(rows[name]["deleted"] for name in left)
        _wait(lambda: cluster_or_none(gke, lost_name) is None, 120, "the lost run's cluster was not deleted")
        assert cluster_or_none(gke, kept_name) is not None and cluster_or_none(gke, foreign_name) is not None
    finally:
        for name in (lost_name, kept_name, foreign_name):
            if cluster_or_none(gke, name) is not None:
                try:
                    gke.delete_cluster(name=f"{GKE_PARENT}/clusters/{name}")
                except Exception:  # noqa: BLE001 - a delete already under way
                    pass
