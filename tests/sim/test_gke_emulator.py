"""The GKE API emulator (sim/gke_emulator.py) through the real clients, unmodified: google-cloud-container's
ClusterManagerClient (gRPC over TLS, through gRPC's HTTP CONNECT proxy support), the Google provider's GKEHook,
GKEOperationTrigger (grpc aio), GKEClusterAuthDetails and GKEKubernetesHook (a token from the emulator's
token endpoint, accepted by the cluster's own apiserver).

One small cluster (one 1-node pool) is shared by the module's tests, which run in file order; the last one
deletes it. Operation durations are the emulator's defaults (3 s creates, 2 s deletes).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
import uuid
from pathlib import Path

import pytest

from tpu_rl_testing import environ

pytestmark = pytest.mark.sim

REPO = Path(__file__).resolve().parents[2]

PROJECT, REGION, ZONE = "tpu-rl-sim", "us-east5", "us-east5-b"
CLUSTER = f"gke-emu-{uuid.uuid4().hex[:6]}"
PARENT = f"projects/{PROJECT}/locations/{REGION}"
CLUSTER_PATH = f"{PARENT}/clusters/{CLUSTER}"
NODE_SERVICE_ACCOUNT = "tpu-rl-nodes@tpu-rl-sim.iam.gserviceaccount.com"


@pytest.fixture(scope="module")
def gke_env(sim):
    """The variables .sim/airflow.env gives Airflow: the proxy, the CA, the service-account connection."""
    names = (
        "grpc_proxy",
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        "HTTPS_PROXY",
        "NO_PROXY",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
    )
    with environ({n: sim.env[n] for n in names}):
        yield sim.env


@pytest.fixture(scope="module")
def hook(gke_env):
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

    return GKEHook(gcp_conn_id="google_cloud_default", location=REGION)


@pytest.fixture(scope="module")
def client(hook):
    return hook.get_cluster_manager_client()


def run_trigger(operation_name, poll=0.5, timeout=180):
    """The provider's GKEOperationTrigger run to its first event, as the triggerer would."""
    from airflow.providers.google.cloud.triggers.kubernetes_engine import GKEOperationTrigger

    trigger = GKEOperationTrigger(
        operation_name=operation_name,
        project_id=PROJECT,
        location=REGION,
        gcp_conn_id="google_cloud_default",
        poll_interval=poll,
    )

    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(first(), timeout))


def wait_operation(client, name, timeout=120):
    from google.cloud.container_v1 import Operation

    deadline = time.time() + timeout
    while time.time() < deadline:
        op = client.get_operation(name=f"{PARENT}/operations/{name}")
        if op.status == Operation.Status.DONE:
            return op
        time.sleep(0.3)
    raise AssertionError(f"operation {name} not DONE after {timeout} s")


def pool_body(name, machine_type="n2-standard-8", **extra):
    return {
        "name": name,
        "initial_node_count": 1,
        "locations": [ZONE],
        "config": {
            "machine_type": machine_type,
            "workload_metadata_config": {"mode": "GKE_METADATA"},
            # the account the simulation's identity may act as (sim/gke_iam.py); GKE's default would be refused
            "service_account": NODE_SERVICE_ACCOUNT,
            **extra.pop("config", {}),
        },
        **extra,
    }


def kube_nodes(hook, pool=None):
    """Nodes of the cluster, listed the way the pipeline reaches a GKE cluster (provider's auth details and hook)."""
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesHook
    from airflow.providers.google.cloud.operators.kubernetes_engine import GKEClusterAuthDetails
    from kubernetes import client as k8s

    url, ca = GKEClusterAuthDetails(
        cluster_name=CLUSTER, project_id=PROJECT, use_internal_ip=False, use_dns_endpoint=False, cluster_hook=hook
    ).fetch_cluster_info()
    kube = GKEKubernetesHook(cluster_url=url, ssl_ca_cert=ca, gcp_conn_id="google_cloud_default")
    selector = f"cloud.google.com/gke-nodepool={pool}" if pool else None
    return k8s.CoreV1Api(kube.get_conn()).list_node(label_selector=selector).items


@pytest.fixture(scope="module")
def cluster(hook, client):
    """Creates the module's cluster through GKEHook and waits for it with the provider's trigger."""
    from google.api_core.exceptions import NotFound

    body = {
        "name": CLUSTER,
        "release_channel": {"channel": "REGULAR"},
        "workload_identity_config": {"workload_pool": f"{PROJECT}.svc.id.goog"},
        "resource_labels": {"tpu-rl-run-key": "test"},
        "node_pools": [pool_body("system")],
    }
    started = time.time()
    op = hook.create_cluster(cluster=body, project_id=PROJECT, wait_to_complete=False)
    assert op.operation_type.name == "CREATE_CLUSTER" and op.status.name in ("PENDING", "RUNNING")
    assert hook.get_cluster(name=CLUSTER, project_id=PROJECT).status.name == "PROVISIONING"
    event = run_trigger(op.name)
    assert event == {"status": "success", "message": "Operation is successfully ended.", "operation_name": op.name}
    print(f"cluster {CLUSTER} RUNNING after {time.time() - started:.1f} s")
    yield CLUSTER
    try:
        client.delete_cluster(name=CLUSTER_PATH)
    except NotFound:
        pass


def test_cluster_is_running_with_endpoint_and_nodes(hook, cluster):
    got = hook.get_cluster(name=cluster, project_id=PROJECT)
    assert got.status.name == "RUNNING"
    assert got.endpoint.startswith("127.0.0.1:")
    assert got.master_auth.cluster_ca_certificate  # base64 PEM, as GKE gives it
    assert got.resource_labels["tpu-rl-run-key"] == "test"
    assert got.resource_labels["airflow-version"].startswith("v")  # GKEHook's own label reached the server
    assert [p.status.name for p in got.node_pools] == ["RUNNING"]
    (node,) = kube_nodes(hook, "system")
    labels = node.metadata.labels
    assert labels["node.kubernetes.io/instance-type"] == "n2-standard-8"
    assert labels["topology.kubernetes.io/zone"] == ZONE and labels["topology.kubernetes.io/region"] == REGION
    assert labels["iam.gke.io/gke-metadata-server-enabled"] == "true"
    assert node.status.capacity["cpu"] == "8" and node.status.allocatable["cpu"] == "7910m"


def test_refused_requests_raise_api_core_exceptions(hook, client, cluster):
    from google.api_core.exceptions import AlreadyExists, InvalidArgument, NotFound, PermissionDenied, Unauthenticated
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.container_v1 import ClusterManagerClient

    with pytest.raises(AlreadyExists):
        hook.create_cluster(
            cluster={"name": cluster, "node_pools": [pool_body("p")]}, project_id=PROJECT, wait_to_complete=False
        )
    with pytest.raises(InvalidArgument, match="Auto_upgrade cannot be false when release_channel REGULAR is set"):
        client.create_node_pool(
            parent=CLUSTER_PATH,
            node_pool=pool_body("no-upgrade", management={"auto_repair": True, "auto_upgrade": False}),
        )
    with pytest.raises(InvalidArgument, match="features are not compatible"):
        client.create_node_pool(parent=CLUSTER_PATH, node_pool=pool_body("c4d", "c4d-standard-32"))
    with pytest.raises(NotFound):
        hook.get_cluster(name="no-such-cluster", project_id=PROJECT)
    with pytest.raises(NotFound):
        client.get_node_pool(name=f"{CLUSTER_PATH}/nodePools/no-such-pool")
    with pytest.raises(Unauthenticated):
        ClusterManagerClient(credentials=AnonymousCredentials()).list_clusters(parent=PARENT)
    # IAM (sim/gke_iam.py): nodes only as an account the caller may act as; nothing in a project without a role.
    stranger = "tpu-rl-other@tpu-rl-sim.iam.gserviceaccount.com"
    with pytest.raises(InvalidArgument, match=f'does not have access to service account "{stranger}"'):
        client.create_node_pool(parent=CLUSTER_PATH, node_pool=pool_body("other", config={"service_account": stranger}))
    with pytest.raises(InvalidArgument, match="-compute@developer.gserviceaccount.com"):  # GKE's default account
        client.create_node_pool(parent=CLUSTER_PATH, node_pool=pool_body("default", config={"service_account": ""}))
    with pytest.raises(PermissionDenied, match='Required "container.clusters.list" permission'):
        client.list_clusters(parent="projects/another-project/locations/us-east5")
    # Every refused pool left nothing behind.
    assert [p.name for p in client.list_node_pools(parent=CLUSTER_PATH).node_pools] == ["system"]


def test_tpu_pool_create_then_delete_removes_its_nodes(hook, client, cluster):
    from google.api_core.exceptions import FailedPrecondition

    body = pool_body(
        "tpu-v6e-4",
        "ct6e-standard-4t",
        config={
            "disk_type": "hyperdisk-balanced",
            "taints": [{"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"}],
        },
        placement_policy={"type": "COMPACT", "tpu_topology": "2x2"},
    )
    op = client.create_node_pool(parent=CLUSTER_PATH, node_pool=body)
    # GKE runs one operation per node pool: not a second one on the same pool, while another pool's may run.
    with pytest.raises(FailedPrecondition, match=f"Operation {op.name} is currently creating a node pool"):
        client.delete_node_pool(name=f"{CLUSTER_PATH}/nodePools/tpu-v6e-4")
    second = client.create_node_pool(parent=CLUSTER_PATH, node_pool=pool_body("second"))
    assert "/projects/100000000001/" in op.target_link  # GKE's links name the project by number
    assert run_trigger(op.name)["status"] == "success"
    assert wait_operation(client, second.name).error.code == 0
    wait_operation(client, client.delete_node_pool(name=f"{CLUSTER_PATH}/nodePools/second").name)
    assert wait_operation(client, op.name).error.code == 0
    assert client.get_node_pool(name=f"{CLUSTER_PATH}/nodePools/tpu-v6e-4").status.name == "RUNNING"
    (node,) = kube_nodes(hook, "tpu-v6e-4")
    labels = node.metadata.labels
    assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
    assert labels["cloud.google.com/gke-tpu-topology"] == "2x2"
    assert labels["cloud.google.com/gke-placement-group"]
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [("google.com/tpu", "present", "NoSchedule")]
    assert node.status.allocatable["google.com/tpu"] == "4"

    op = client.delete_node_pool(name=f"{CLUSTER_PATH}/nodePools/tpu-v6e-4")
    assert wait_operation(client, op.name).status.name == "DONE"
    assert kube_nodes(hook, "tpu-v6e-4") == []
    assert [p.name for p in client.list_node_pools(parent=CLUSTER_PATH).node_pools] == ["system"]


def test_stockout_fault_fails_the_pool_operation(hook, client, cluster):
    from sim import gke_faults

    gke_faults.set_fault("test-stockout", "stockout", pool_prefix="stock-", times=1)
    try:
        op = client.create_node_pool(parent=CLUSTER_PATH, node_pool=pool_body("stock-a"))
        # The provider's trigger reports any DONE operation as success; the error is on the operation.
        assert run_trigger(op.name)["status"] == "success"
        done = wait_operation(client, op.name)
        assert done.error.code == 8  # RESOURCE_EXHAUSTED
        assert "[GCE_STOCKOUT]" in done.error.message and done.status_message == done.error.message
        pool = client.get_node_pool(name=f"{CLUSTER_PATH}/nodePools/stock-a")
        assert pool.status.name == "ERROR" and "does not have enough resources" in pool.status_message
        assert kube_nodes(hook, "stock-a") == []
        assert gke_faults.list_faults()["test-stockout"]["applied"] == 1
    finally:
        gke_faults.clear_faults("test-stockout")
    op = client.delete_node_pool(name=f"{CLUSTER_PATH}/nodePools/stock-a")
    wait_operation(client, op.name)


def test_a_quota_fault_of_one_region_refuses_that_regions_pools_only(client, cluster):
    """Compute Engine's TPU quota is regional: a quota rule naming another region leaves this cluster's creates
    alone; one naming its region refuses them at once with GKE's regional-quota 403."""
    from google.api_core.exceptions import PermissionDenied

    from sim import gke_faults

    gke_faults.set_fault("test-quota-elsewhere", "quota", pool_prefix="quota-", region="europe-west4")
    try:
        op = client.create_node_pool(parent=CLUSTER_PATH, node_pool=pool_body("quota-a"))
        assert wait_operation(client, op.name).error.code == 0
        gke_faults.set_fault("test-quota-here", "quota", pool_prefix="quota-", region=REGION)
        with pytest.raises(PermissionDenied, match=f"Insufficient regional quota .* in region {REGION}"):
            client.create_node_pool(parent=CLUSTER_PATH, node_pool=pool_body("quota-b"))
        assert gke_faults.list_faults()["test-quota-elsewhere"]["applied"] == 0
    finally:
        gke_faults.clear_faults("test-quota-elsewhere")
        gke_faults.clear_faults("test-quota-here")
    op = client.delete_node_pool(name=f"{CLUSTER_PATH}/nodePools/quota-a")
    wait_operation(client, op.name)


def test_a_reservation_of_a_fixed_number_of_vms_refuses_a_pool_it_cannot_hold(client, cluster):
    """reservations.json gives "my-res" 2 VMs: a pool of 2 consumes them, a second one is refused at once with GKE's
    429 "Reservation does not have enough resources for the request" (gsutil issue 1000); deleting the first gives
    them back."""
    from google.api_core.exceptions import ResourceExhausted

    from sim.gke_settings import GKE_DIR

    reservations = GKE_DIR / "reservations.json"
    before = reservations.read_text() if reservations.exists() else None
    reservations.write_text(json.dumps([{"name": "my-res", "vm_count": 2}]))
    affinity = {
        "consume_reservation_type": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["my-res"],
    }
    reserved = {"initial_node_count": 2, "config": {"reservation_affinity": affinity}}
    try:
        op = client.create_node_pool(parent=CLUSTER_PATH, node_pool=pool_body("res-a", **copy.deepcopy(reserved)))
        assert wait_operation(client, op.name).error.code == 0
        with pytest.raises(ResourceExhausted, match='specific reservation "my-res" is insufficient for node pool'):
            client.create_node_pool(parent=CLUSTER_PATH, node_pool=pool_body("res-b", **copy.deepcopy(reserved)))
        op = client.delete_node_pool(name=f"{CLUSTER_PATH}/nodePools/res-a")
        wait_operation(client, op.name)
        op = client.create_node_pool(parent=CLUSTER_PATH, node_pool=pool_body("res-b", **copy.deepcopy(reserved)))
        assert wait_operation(client, op.name).error.code == 0
        op = client.delete_node_pool(name=f"{CLUSTER_PATH}/nodePools/res-b")
        wait_operation(client, op.name)
    finally:
        if before is None:
            reservations.unlink(missing_ok=True)
        else:
            reservations.write_text(before)


def test_operations_are_listed(client, cluster):
    ops = client.list_operations(parent=PARENT).operations
    mine = [
        o for o in ops if o.target_link.endswith(f"/clusters/{CLUSTER}") or f"/clusters/{CLUSTER}/" in o.target_link
    ]
    assert {o.operation_type.name for o in mine} >= {"CREATE_CLUSTER", "CREATE_NODE_POOL", "DELETE_NODE_POOL"}
    assert all(o.status.name == "DONE" for o in mine)


def test_dns_endpoint_refuses_user_traffic_unless_the_cluster_allows_it(hook, cluster):
    """The module's cluster was created without control_plane_endpoints_config: its DNS name exists (GKE
    always sets one) but refuses user traffic, and the pipeline says which setting to change, before any
    Kubernetes call."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    from tpu_rl.compat import AirflowFailException
    from tpu_rl.hooks.kubernetes import ClusterTarget, KubernetesApiHook

    got = hook.get_cluster(name=cluster, project_id=PROJECT)
    dns = got.control_plane_endpoints_config.dns_endpoint_config
    assert dns.endpoint == f"gke-{got.id}.{REGION}.gke.goog" and not dns.allow_external_traffic

    target = dict(project_id=PROJECT, location=REGION, cluster_name=cluster, gcp_conn_id="google_cloud_default")
    with pytest.raises(AirflowFailException, match="control_plane_endpoint: .*--enable-dns-access"):
        _ = KubernetesApiHook(ClusterTarget(**target, use_dns_endpoint=True)).gke_endpoint
    # Through the IP endpoint the same cluster answers.
    assert KubernetesApiHook(ClusterTarget(**target)).list_nodes("cloud.google.com/gke-nodepool=system")

    # The front end itself refuses, whatever the client: 403 with the reason.
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesHook

    kube = GKEKubernetesHook(
        cluster_url=f"https://{dns.endpoint}",
        ssl_ca_cert=got.master_auth.cluster_ca_certificate,
        use_dns_endpoint=True,
        gcp_conn_id="google_cloud_default",
    )
    with pytest.raises(ApiException) as refused:
        k8s.CoreV1Api(kube.get_conn()).list_node()
    assert refused.value.status == 403 and "allowExternalTraffic is false" in refused.value.body


def test_cluster_delete_stops_its_control_plane(hook, client, cluster):
    from google.api_core.exceptions import NotFound

    from sim.control_plane import ControlPlane

    state = json.loads((Path(os.environ.get("TPU_RL_SIM_DIR", REPO / ".sim")) / "gke" / "state.json").read_text())
    slot = state["clusters"][f"{PROJECT}/{REGION}/{CLUSTER}"]["slot"]
    cp = ControlPlane(f"{PROJECT}-{REGION}-{CLUSTER}", slot)
    assert cp.alive()
    op = hook.delete_cluster(name=cluster, project_id=PROJECT, wait_to_complete=False)
    assert hook.get_cluster(name=cluster, project_id=PROJECT).status.name == "STOPPING"
    assert run_trigger(op.name)["status"] == "success"
    with pytest.raises(NotFound):
        hook.get_cluster(name=cluster, project_id=PROJECT)
    assert not cp.alive() and not cp.dir.exists()
