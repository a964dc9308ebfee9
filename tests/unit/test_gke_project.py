"""The GKE emulator's operations (sim/gke_project.py, sim/gke_emulator.py) run in the test's own thread, over a
state directory of its own and a stand-in control plane that only records the nodes registered in it.

Pure: no simulation, no network, no thread.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sim import gke_emulator, gke_faults, gke_project
from sim.gke_errors import GkeError

pytestmark = pytest.mark.core

KEY = "tpu-rl-sim/us-east5/cl"


class RecordingControlPlane:
    """Starts at once and keeps the names of the nodes registered in it."""

    endpoint, ca_pem = "https://127.0.0.1:1", b"ca"

    def __init__(self):
        self.nodes: list[str] = []

    def start(self, tokens):
        pass

    def wait_ready(self, seconds):
        pass

    def api(self, method, path, body=None):
        self.nodes.append(body["metadata"]["name"])


@pytest.fixture
def emulator(tmp_path, monkeypatch):
    """An emulator over tmp_path (its state, its fault rules), operations without delays."""
    (tmp_path / "gke").mkdir()
    monkeypatch.setattr(gke_project, "GKE_DIR", tmp_path / "gke")
    monkeypatch.setattr(gke_faults, "SIM", tmp_path)
    monkeypatch.setattr(gke_project, "Accounts", lambda: SimpleNamespace(tokens={}))
    for delay in ("CLUSTER_CREATE_S", "STOCKOUT_S", "POOL_CREATE_S"):
        monkeypatch.setattr(gke_project, delay, 0)
    emulator = gke_emulator.Emulator()
    plane = RecordingControlPlane()
    emulator.control_plane = lambda key: plane
    emulator.plane = plane
    return emulator


def creating_cluster(emulator) -> str:
    """A cluster whose create request holds a system pool and a v6e-16 slice pool (tpu_pool_mode=cluster), and its
    create operation, RUNNING; the operation's name."""
    c = emulator.c
    pools = [
        c.NodePool(name="system", initial_node_count=1, config=c.NodeConfig(machine_type="n2-standard-8")),
        c.NodePool(
            name="tpu-slice-0",
            initial_node_count=4,
            locations=["us-east5-b"],
            config=c.NodeConfig(machine_type="ct6e-standard-4t"),
            placement_policy=c.NodePool.PlacementPolicy(type_="COMPACT", tpu_topology="4x4"),
        ),
    ]
    cluster = c.Cluster(name="cl", locations=["us-east5-b"], node_pools=pools, status=c.Cluster.Status.PROVISIONING)
    emulator.clusters[KEY] = {"cluster": cluster, "slot": 0}
    name = "operation-1-cluster"
    op = c.Operation(name=name, status=c.Operation.Status.RUNNING, operation_type=c.Operation.Type.CREATE_CLUSTER)
    emulator.operations[name] = {"op": op, "key": KEY, "pool": None, "kind": "CREATE_CLUSTER"}
    return name


def test_a_pool_created_with_the_cluster_stocks_out_as_a_pool_created_alone(emulator):
    """A "stockout" rule matching a pool of the cluster's own request fails the cluster's create, as GKE does: the
    operation DONE with RESOURCE_EXHAUSTED and GKE's [GCE_STOCKOUT] text, the cluster left in ERROR, the slice
    pool without nodes; the other pools have theirs."""
    gke_faults.set_fault("no-v6e", "stockout", machine_type="ct6e-standard-4t", times=1)
    name = creating_cluster(emulator)
    emulator._create_cluster(name, emulator.operations[name])

    op, cluster = emulator.operations[name]["op"], emulator.clusters[KEY]["cluster"]
    assert op.status.name == "DONE" and op.error.code == 8
    assert "[GCE_STOCKOUT]" in op.error.message and "Expected 4, running 0" in op.error.message
    assert cluster.status.name == "ERROR" and cluster.status_message == op.error.message
    assert [cond.code.name for cond in cluster.conditions] == ["GCE_STOCKOUT"]
    statuses = {p.name: p.status.name for p in cluster.node_pools}
    assert statuses == {"system": "RUNNING", "tpu-slice-0": "ERROR"}
    assert len(emulator.plane.nodes) == 1 and "-system-" in emulator.plane.nodes[0]
    assert gke_faults.list_faults()["no-v6e"]["applied"] == 1


def test_without_a_stockout_the_cluster_and_its_pools_are_created(emulator):
    name = creating_cluster(emulator)
    emulator._create_cluster(name, emulator.operations[name])
    op, cluster = emulator.operations[name]["op"], emulator.clusters[KEY]["cluster"]
    assert op.status.name == "DONE" and not op.error.code
    assert cluster.status.name == "RUNNING" and len(emulator.plane.nodes) == 5


def test_an_operation_is_found_only_in_its_own_location(emulator):
    """GKE keeps an operation in its cluster's location: the same name asked for in another location is NOT_FOUND."""
    name = creating_cluster(emulator)
    request = emulator.c.GetOperationRequest
    assert (
        emulator.get_operation(request(name=f"projects/tpu-rl-sim/locations/us-east5/operations/{name}")).name == name
    )
    for elsewhere in ("projects/tpu-rl-sim/locations/us-central1", "projects/other-project/locations/us-east5"):
        with pytest.raises(GkeError) as refused:
            emulator.get_operation(request(name=f"{elsewhere}/operations/{name}"))
        assert refused.value.code == "NOT_FOUND"
        assert refused.value.message == f"Not found: {elsewhere}/operations/{name}."
