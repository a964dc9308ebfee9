"""Cluster and TPU node pool operators: create or adopt, and delete only what this run created.

The GKE API has no local stand-in, so these tests replace the provider's GKEHook with a small in-memory
GKE (FakeGke below) that speaks the same calls and raises the same google.api_core errors. Everything
else is real: the operators, the request bodies (parsed into container_v1 types as GKE would) and
Airflow's deferral with the provider's GKEOperationTrigger.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from airflow.providers.google.cloud.triggers.kubernetes_engine import GKEOperationTrigger
from google.api_core.exceptions import AlreadyExists, NotFound
from google.cloud.container_v1 import Cluster, NodePool

from tpu_rl.operators import cluster as cluster_ops
from tpu_rl.run import GKE_LABEL_RUN_KEY, RunIdentity
from tpu_rl_testing import TUTORIAL_CONF

try:  # Airflow >= 3.1 task SDK
    from airflow.sdk.exceptions import TaskDeferred
except ImportError:  # pragma: no cover
    from airflow.exceptions import TaskDeferred

RUN_ID = "manual__2026-11-29T10:00:00+00:00"
RUN = RunIdentity("maxtext_rl_tpu", RUN_ID)


class FakeGke:
    """The GKE calls the operators make, on an in-memory project."""

    def __init__(self):
        self.clusters: dict[str, Cluster] = {}
        self.node_pools: dict[str, NodePool] = {}
        self.calls: list[str] = []

    # GKEHook
    def create_cluster(self, cluster, project_id, wait_to_complete):
        proto = Cluster.from_json(json.dumps(cluster))
        self.calls.append(f"create_cluster {proto.name}")
        if proto.name in self.clusters:
            raise AlreadyExists("cluster exists")
        self.clusters[proto.name] = proto
        return SimpleNamespace(name=f"operation-create-{proto.name}")

    def get_cluster(self, name, project_id):
        if name not in self.clusters:
            raise NotFound("no cluster")
        return self.clusters[name]

    def delete_cluster(self, name, project_id, wait_to_complete):
        self.calls.append(f"delete_cluster {name}")
        self.clusters.pop(name)
        return SimpleNamespace(name=f"operation-delete-{name}")

    def get_cluster_manager_client(self):
        return self

    # ClusterManagerClient
    def create_node_pool(self, parent, node_pool):
        self.calls.append(f"create_node_pool {node_pool.name}")
        if node_pool.name in self.node_pools:
            raise AlreadyExists("pool exists")
        self.node_pools[node_pool.name] = node_pool
        return SimpleNamespace(name=f"operation-pool-{node_pool.name}")

    def delete_node_pool(self, name):
        pool = name.rsplit("/", 1)[-1]
        self.calls.append(f"delete_node_pool {pool}")
        if pool not in self.node_pools:
            raise NotFound("no pool")
        del self.node_pools[pool]
        return SimpleNamespace(name=f"operation-delete-pool-{pool}")


@pytest.fixture
def gke(monkeypatch) -> FakeGke:
    fake = FakeGke()
    monkeypatch.setattr(cluster_ops, "_cluster_hook", lambda config: fake)
    return fake


def context(**params):
    return {"params": {**TUTORIAL_CONF, **params}, "dag": SimpleNamespace(dag_id=RUN.dag_id), "run_id": RUN_ID}


def deferred_operation(operator, ctx) -> str:
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(ctx)
    trigger = deferred.value.trigger
    assert isinstance(trigger, GKEOperationTrigger)
    return trigger.operation_name


def test_create_cluster_labels_it_with_the_run_and_waits_deferred(gke):
    operation = deferred_operation(cluster_ops.CreateClusterOperator(task_id="create_cluster"), context())
    assert operation == "operation-create-qwen-rl"
    created = gke.clusters["qwen-rl"]
    assert created.resource_labels[GKE_LABEL_RUN_KEY] == RUN.key
    assert {p.name for p in created.node_pools} == {"system", "cpu-np"}


def test_a_retry_adopts_the_cluster_its_first_try_created(gke):
    deferred_operation(cluster_ops.CreateClusterOperator(task_id="create_cluster"), context())
    assert cluster_ops.CreateClusterOperator(task_id="create_cluster").execute(context()) is None  # no deferral
    assert gke.calls == ["create_cluster qwen-rl", "create_cluster qwen-rl"]
    assert len(gke.clusters) == 1


def test_existing_cluster_mode_never_creates(gke):
    cluster_ops.CreateClusterOperator(task_id="create_cluster").execute(context(cluster_mode="existing"))
    assert gke.calls == []


def test_teardown_deletes_the_cluster_this_run_created(gke):
    deferred_operation(cluster_ops.CreateClusterOperator(task_id="create_cluster"), context())
    operation = deferred_operation(cluster_ops.DeleteClusterOperator(task_id="delete_cluster"), context())
    assert operation == "operation-delete-qwen-rl"
    assert gke.clusters == {}


def test_teardown_leaves_a_cluster_another_run_created(gke):
    other = RunIdentity("maxtext_rl_tpu", "manual__another")
    gke.clusters["qwen-rl"] = Cluster(name="qwen-rl", resource_labels={GKE_LABEL_RUN_KEY: other.key})
    cluster_ops.DeleteClusterOperator(task_id="delete_cluster").execute(context())
    assert "qwen-rl" in gke.clusters and not any(c.startswith("delete") for c in gke.calls)


def test_teardown_after_a_create_that_never_happened_is_a_no_op(gke):
    cluster_ops.DeleteClusterOperator(task_id="delete_cluster").execute(context())
    assert gke.calls == []


def test_keep_cluster_skips_the_delete(gke):
    deferred_operation(cluster_ops.CreateClusterOperator(task_id="create_cluster"), context())
    cluster_ops.DeleteClusterOperator(task_id="delete_cluster").execute(context(keep_cluster=True))
    assert "qwen-rl" in gke.clusters


def test_tpu_pools_are_created_per_run_then_adopted_then_deleted(gke):
    operation = deferred_operation(cluster_ops.CreateTpuNodePoolsOperator(task_id="create_tpu_pools"), context())
    pool_name = RUN.tpu_pool_name(0)
    assert operation == f"operation-pool-{pool_name}"
    pool = gke.node_pools[pool_name]
    assert (pool.initial_node_count, pool.config.machine_type) == (16, "ct6e-standard-4t")
    assert pool.placement_policy.tpu_topology == "8x8"

    # A retry after the pool exists adopts it: nothing new to wait for.
    assert cluster_ops.CreateTpuNodePoolsOperator(task_id="create_tpu_pools").execute(context()) is None
    assert len(gke.node_pools) == 1

    deferred_operation(cluster_ops.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools"), context())
    assert gke.node_pools == {}
    # Deleting again (a retried teardown) finds nothing and succeeds.
    cluster_ops.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools").execute(context())


def test_pool_teardown_never_touches_pools_it_did_not_create(gke):
    gke.node_pools["tpu-slice-0"] = NodePool(name="tpu-slice-0")
    cluster_ops.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools").execute(context(tpu_pool_mode="cluster"))
    assert "tpu-slice-0" in gke.node_pools and gke.calls == []
