"""The cluster, node pool and JobSet install operators against the GKE emulator of the simulation.

Each operator runs as Airflow runs it: ``execute`` defers on the package's ``GkeOperationTrigger``, the
trigger polls the emulator through the real async client (grpc aio), and the operator resumes with its
event. The emulator refuses what GKE refuses, so these tests also prove the pipeline's requests pass.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook
from airflow.providers.standard.triggers.temporal import DateTimeTrigger
from google.api_core.exceptions import NotFound
from google.cloud.container_v1 import Cluster

from sim import gke_faults
from tpu_rl.compat import AirflowException
from tpu_rl.contract import XCOM_TPU_SLICES
from tpu_rl.operators import cluster as cluster_ops
from tpu_rl.operators import tpu_pools
from tpu_rl.operators.leases import cluster_lease
from tpu_rl.operators.setup import EnsureJobSetOperator
from tpu_rl.operators.training_record import check_training_record
from tpu_rl.run import GKE_LABEL_RUN_KEY, RunIdentity
from tpu_rl.run_scope import RunScope
from tpu_rl.triggers.gke import GkeOperationTrigger
from tpu_rl_testing import GKE_TEST_CONF, TaskInstanceStandIn, task_context

try:  # Airflow >= 3.1 task SDK
    from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
except ImportError:  # pragma: no cover
    from airflow.exceptions import AirflowFailException, TaskDeferred

pytestmark = pytest.mark.gke

REPO = Path(__file__).resolve().parents[2]

DAG_ID = "maxtext_rl_tpu"
SMALL = GKE_TEST_CONF
POLL = 1


class Run:
    """One DAG run's params and identity, with a cluster name of its own."""

    def __init__(self, **params):
        self.run_id = f"gke_test__{uuid.uuid4().hex[:8]}"
        self.params = {**SMALL, "cluster_name": f"gke-test-{uuid.uuid4().hex[:6]}", **params}
        self.identity = RunIdentity(DAG_ID, self.run_id)
        self.ti = TaskInstanceStandIn(DAG_ID, self.run_id, "gke_test")  # one for the operators of the test

    def context(self, **params):
        return task_context(self.ti, {**self.params, **params})


async def _first_event(trigger):
    async for event in trigger.run():
        return event


def run_operator(operator, context) -> list[str]:
    """execute(), then for each deferral the trigger to its event and the resume method; returns the GKE
    operations it waited for (its other waits, a while before asking GKE again, are waited through)."""
    call, operations = (lambda: operator.execute(context)), []
    while True:
        try:
            call()
            return operations
        except TaskDeferred as deferred:
            trigger = deferred.trigger
            if isinstance(trigger, GkeOperationTrigger):
                operations.append(trigger.operation_name)
            else:
                assert isinstance(trigger, DateTimeTrigger), trigger
            event = asyncio.run(_first_event(trigger))
            resume, kwargs = getattr(operator, deferred.method_name), deferred.kwargs or {}
            call = lambda resume=resume, kwargs=kwargs, payload=event.payload: resume(context, payload, **kwargs)  # noqa: E731


@pytest.fixture(scope="module")
def gke(gke_sim):
    return GKEHook(gcp_conn_id="google_cloud_default", location="us-east5")


def get_cluster(gke, name):
    try:
        return gke.get_cluster(name=name, project_id="tpu-rl-sim")
    except NotFound:
        return None


@pytest.fixture(scope="module")
def created(gke):
    """A cluster created by CreateClusterOperator (one per module: a control plane takes seconds to start)."""
    run = Run()
    operations = run_operator(
        cluster_ops.CreateClusterOperator(task_id="create_cluster", poll_interval=POLL), run.context()
    )
    yield run, operations
    if get_cluster(gke, run.params["cluster_name"]):
        gke.delete_cluster(name=run.params["cluster_name"], project_id="tpu-rl-sim", wait_to_complete=False)


def test_create_cluster_labels_it_with_the_run_and_waits_deferred(gke, created):
    run, operations = created
    assert len(operations) == 1
    cluster = get_cluster(gke, run.params["cluster_name"])
    assert cluster.status == Cluster.Status.RUNNING
    assert cluster.resource_labels[GKE_LABEL_RUN_KEY] == run.identity.key
    assert {p.name for p in cluster.node_pools} == {"system", "cpu-np"}
    [exclusion] = cluster.maintenance_policy.window.maintenance_exclusions.values()
    assert exclusion.maintenance_exclusion_options.scope.name == "NO_MINOR_OR_NODE_UPGRADES"
    assert exclusion.maintenance_exclusion_options.end_time_behavior.name == "UNTIL_END_OF_SUPPORT"
    assert cluster.maintenance_policy.window.daily_maintenance_window.start_time == "09:00"
    assert all(p.config.gvnic.enabled for p in cluster.node_pools)


def test_the_pipeline_reaches_a_created_cluster_through_its_dns_endpoint(gke, created):
    """control_plane_endpoint 'dns' (the default): the created cluster allows its DNS-based endpoint and every
    Kubernetes call goes there, trusting the public CA, not the cluster's; 'ip' reaches the IP endpoint."""
    import ssl
    import urllib.error
    import urllib.request

    run, _ = created
    dns = get_cluster(gke, run.params["cluster_name"]).control_plane_endpoints_config.dns_endpoint_config
    assert dns.allow_external_traffic and dns.endpoint.endswith(".us-east5.gke.goog")
    hook = _hook_for(run)
    assert hook.gke_endpoint[0] == f"https://{dns.endpoint}"
    assert {n.metadata.labels["cloud.google.com/gke-nodepool"] for n in hook.list_nodes("")} == {"system", "cpu-np"}

    # The cluster CA signs only the IP endpoint: a client that pins it for the DNS name is refused.
    pinned = ssl.create_default_context(cadata=base64.b64decode(hook.gke_endpoint[1]).decode())
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"https://{dns.endpoint}/version", context=pinned, timeout=10)

    ip_hook = _hook_for(Run(**{**run.params, "control_plane_endpoint": "ip"}))
    assert ip_hook.gke_endpoint[0].startswith("https://127.0.0.1:")
    assert len(ip_hook.list_nodes("")) == len(hook.list_nodes(""))


def test_kubernetes_calls_get_past_a_front_end_that_answers_503_or_drops_the_connection(gke, created):
    """GKE's front end before the control plane answers 503 or drops a connection while a control-plane replica
    restarts (an upgrade, a repair): every call, the operators' and the triggers', is made again with backoff, as
    client-go makes it; one that keeps failing still fails with the answer it got."""
    from kubernetes.client.exceptions import ApiException

    from tpu_rl.hooks.kubernetes import AsyncKubernetesApiHook

    run, _ = created
    name, hook = run.params["cluster_name"], _hook_for(run)
    cases = (("kube-unavailable", 3), ("kube-reset", 2))
    try:
        for kind, times in cases:
            gke_faults.set_fault(f"gke-test-{kind}", kind, cluster=name, times=times)
            assert {n.metadata.labels["cloud.google.com/gke-nodepool"] for n in hook.list_nodes("")} >= {"cpu-np"}
            assert gke_faults.list_faults()[f"gke-test-{kind}"]["applied"] == times
        target = hook.target.with_endpoint(*hook.gke_endpoint)
        for kind, times in cases:
            gke_faults.set_fault(f"gke-test-{kind}-async", kind, cluster=name, times=times)
            assert asyncio.run(AsyncKubernetesApiHook(target).get_jobset("none", "default")) is None
            assert gke_faults.list_faults()[f"gke-test-{kind}-async"]["applied"] == times
        gke_faults.set_fault("gke-test-kube-down", "kube-unavailable", cluster=name)  # never passes
        with pytest.raises(ApiException) as refused:
            _hook_for(run).list_nodes("")
        assert refused.value.status == 503
        assert gke_faults.list_faults()["gke-test-kube-down"]["applied"] == 5  # five tries in all
    finally:
        for kind, _ in cases:
            gke_faults.clear_faults(f"gke-test-{kind}")
            gke_faults.clear_faults(f"gke-test-{kind}-async")
        gke_faults.clear_faults("gke-test-kube-down")


def test_a_retry_adopts_the_cluster_its_first_try_created(created):
    run, _ = created
    assert (
        run_operator(cluster_ops.CreateClusterOperator(task_id="create_cluster", poll_interval=POLL), run.context())
        == []
    )


def test_a_retry_deletes_the_cluster_its_failed_create_left_in_error_and_creates_it_again(gke, capsys):
    """GKE leaves a cluster whose create failed in ERROR and never repairs it: adopting it would only fail the
    run at wait_for_cluster. The retry deletes it (this run's, by its label) and creates it again."""
    run = Run()
    name = run.params["cluster_name"]
    create = cluster_ops.CreateClusterOperator(task_id="create_cluster", poll_interval=POLL)
    gke_faults.set_fault("gke-test-cluster-error", "cluster-error", cluster=name, times=1)
    try:
        with pytest.raises(AirflowException, match=r"\(CREATE_CLUSTER\) failed: Failed to create cluster"):
            run_operator(create, run.context())
        assert get_cluster(gke, name).status == Cluster.Status.ERROR
        assert len(run_operator(create, run.context())) == 2  # the retry: the delete, then the create
        log = capsys.readouterr().out
        assert f"Cluster {name}, created by an earlier try of this run, is ERROR (Failed to create cluster)" in log
        cluster = get_cluster(gke, name)
        assert cluster.status == Cluster.Status.RUNNING
        assert cluster.resource_labels[GKE_LABEL_RUN_KEY] == run.identity.key
    finally:
        gke_faults.clear_faults("gke-test-cluster-error")
        if get_cluster(gke, name):
            gke.delete_cluster(name=name, project_id="tpu-rl-sim", wait_to_complete=False)


def test_a_stockout_of_a_slice_created_with_the_cluster_costs_the_whole_cluster(gke, capsys):
    """tpu_pool_mode=cluster: the slice's pool is in the cluster's create request, and a stockout of it fails the
    cluster's create (the emulator as GKE: the create DONE with [GCE_STOCKOUT], the cluster left in ERROR). The task
    fails with GKE's message; its retry deletes the cluster and creates all of it again (docs/how-to/capacity.md)."""
    run = Run(tpu_pool_mode="cluster")
    name = run.params["cluster_name"]
    create = cluster_ops.CreateClusterOperator(task_id="create_cluster", poll_interval=POLL)
    gke_faults.set_fault("gke-test-cluster-stockout", "stockout", pool_prefix="tpu-slice-", cluster=name, times=1)
    try:
        with pytest.raises(AirflowException, match=r"\(CREATE_CLUSTER\) failed: .*\[GCE_STOCKOUT\]"):
            run_operator(create, run.context())
        failed = get_cluster(gke, name)
        assert failed.status == Cluster.Status.ERROR and "does not have enough resources" in failed.status_message
        assert len(run_operator(create, run.context())) == 2  # the retry: the delete, then the create
        assert f"Cluster {name}, created by an earlier try of this run, is ERROR" in capsys.readouterr().out
        cluster = get_cluster(gke, name)
        assert cluster.status == Cluster.Status.RUNNING
        assert {p.name: p.status.name for p in cluster.node_pools}["tpu-slice-0"] == "RUNNING"
    finally:
        gke_faults.clear_faults("gke-test-cluster-stockout")
        if get_cluster(gke, name):
            gke.delete_cluster(name=name, project_id="tpu-rl-sim", wait_to_complete=False)


def test_create_mode_refuses_a_cluster_a_live_run_created_and_adopts_it_once_that_run_ended(created):
    """Another run with the same cluster_name in cluster_mode create would delete the cluster under its
    creator at its end: refused while the creator's run lives, pointing at the shared mode."""
    run, _ = created
    intruder = Run(cluster_name=run.params["cluster_name"])
    intruder.ti.run_states[run.run_id] = "running"
    create = cluster_ops.CreateClusterOperator(task_id="create_cluster", poll_interval=POLL)
    with pytest.raises(
        AirflowFailException,
        match=rf"belongs to the live run {DAG_ID} / {run.run_id} \(running\)"
        r".*cluster_mode 'shared'",
    ):
        run_operator(create, intruder.context())
    intruder.ti.run_states[run.run_id] = "failed"  # its creator is gone: a leftover to adopt
    assert run_operator(create, intruder.context()) == []


def test_existing_cluster_mode_never_creates(gke):
    run = Run(cluster_mode="existing", tpu_pool_mode="existing")
    assert run_operator(cluster_ops.CreateClusterOperator(task_id="create_cluster"), run.context()) == []
    assert get_cluster(gke, run.params["cluster_name"]) is None


def test_a_new_cluster_gets_the_shipped_jobset_release_and_a_broken_install_is_repaired(created, capsys):
    """The task log (Airflow's structured logger writes it to stdout here) says what was done."""
    from kubernetes.client import AppsV1Api

    run, _ = created
    ensure = EnsureJobSetOperator(task_id="ensure_jobset", poll_interval=1)
    ensure.execute(run.context())
    log = capsys.readouterr().out
    assert "Applying the JobSet v0.10.1 release shipped with the package (18 objects)" in log
    assert "applied Deployment jobset-system/jobset-controller-manager" in log
    assert "JobSet v0.10.1 is installed: its controller is Available and its webhooks default a JobSet" in log

    # Installed and admitting: a second run skips the install.
    ensure.execute(run.context())
    log = capsys.readouterr().out
    assert "JobSet is installed and admits JobSets" in log and "Applying" not in log

    # A half-finished install (the CRD and the webhook configurations, failurePolicy Fail, are there; the
    # namespaced objects are not: what create_from_yaml's namespace override left) is repaired, not skipped.
    from kubernetes.client import CoreV1Api

    hook = _hook_for(run)
    api = hook.kube_hook.get_conn()
    AppsV1Api(api).delete_namespaced_deployment("jobset-controller-manager", "jobset-system")
    CoreV1Api(api).delete_namespaced_service("jobset-webhook-service", "jobset-system")
    deadline = time.monotonic() + 60
    while not (problem := hook.jobset_admission_problem("default")):  # the apiserver's caches catch up
        assert time.monotonic() < deadline, "JobSets are still admitted without the webhook's Service"
        time.sleep(1)
    assert "jobset-webhook-service" in problem
    ensure.execute(run.context())
    log = capsys.readouterr().out
    assert "JobSet is installed only in part" in log and "repairing it" in log
    assert hook.jobset_admission_problem("default") is None


def _workload_credentials(api, config, identity) -> None:
    """What the hf_token_secret task creates: the run's token Secret and the workloads' service account."""
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    from tpu_rl import manifests

    CoreV1Api(api).create_namespaced_secret("default", manifests.hf_token_secret(config, identity, "hf_not_real"))
    try:
        CoreV1Api(api).create_namespaced_service_account("default", manifests.workload_service_account(config))
    except ApiException as e:
        if e.status != 409:
            raise


def _stage_outcome(api, jobset: dict) -> tuple[str, str]:
    """Submits a stage's JobSet; its first finished pod's phase and what the MaxText emulator says it did."""
    from kubernetes.client import CoreV1Api, CustomObjectsApi

    CustomObjectsApi(api).create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", jobset)
    name, deadline = jobset["metadata"]["name"], time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = (
            CoreV1Api(api).list_namespaced_pod("default", label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items
        )
        done = [p for p in pods if p.status.phase in ("Succeeded", "Failed")]
        if done:
            return done[0].status.phase, (done[0].metadata.annotations or {}).get("sim.tpu-rl.dev/emulated", "")
        time.sleep(1)
    raise AssertionError(f"{name} did not finish")


def test_conversion_pods_reach_the_bucket_as_the_node_service_account(created):
    """On GKE_METADATA nodes a pod without hostNetwork is its Kubernetes service account's Workload Identity
    principal, which the bucket does not grant: the conversion as built runs; without hostNetwork it gets 403."""

    from tpu_rl import manifests
    from tpu_rl.config import RunConfig

    run, _ = created
    config = RunConfig.from_params({**run.params, "gcs_bucket": "tpu-rl-sim", "workload_prefix": "idt"})
    api = _hook_for(run).kube_hook.get_conn()
    _workload_credentials(api, config, run.identity)

    as_built = manifests.hf_to_maxtext_jobset(config, run.identity)
    assert _stage_outcome(api, as_built)[0] == "Succeeded"

    other = Run(cluster_name=run.params["cluster_name"])
    without_host_network = manifests.hf_to_maxtext_jobset(config, other.identity)
    pod = without_host_network["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    del pod["hostNetwork"], pod["dnsPolicy"]
    token = next(e for e in pod["containers"][0]["env"] if e["name"] == "HF_TOKEN")
    token["valueFrom"]["secretKeyRef"]["name"] = run.identity.secret_name()
    phase, emulated = _stage_outcome(api, without_host_network)
    assert phase == "Failed"
    assert (
        "403 Forbidden: principal://iam.googleapis.com/" in emulated
        and "/subject/ns/default/sa/tpu-rl-workload" in emulated
    )


def test_the_conversion_needs_bucket_get_besides_object_access(created, tmp_path):
    """MaxText's HF->MaxText conversion calls get_bucket() before it writes: a node account with
    roles/storage.objectAdmin alone (no storage.buckets.get) fails it with the client's message; the roles
    docs/getting-started/composer.md grants (objectAdmin and legacyBucketReader) let it run."""
    import json

    from tpu_rl import manifests
    from tpu_rl.config import RunConfig

    run, _ = created
    node_account = f"serviceAccount:{run.params['node_service_account']}"
    policy = Path(os.environ.get("TPU_RL_SIM_DIR", REPO / ".sim")) / "bucket-policy.json"
    api = _hook_for(run).kube_hook.get_conn()

    def conversion(roles: list[str]) -> tuple[str, str]:
        policy.write_text(json.dumps({node_account: roles}))
        attempt = Run(cluster_name=run.params["cluster_name"])
        config = RunConfig.from_params({**attempt.params, "gcs_bucket": "tpu-rl-sim", "workload_prefix": "iam"})
        _workload_credentials(api, config, attempt.identity)
        return _stage_outcome(api, manifests.hf_to_maxtext_jobset(config, attempt.identity))

    try:
        phase, emulated = conversion(["roles/storage.objectAdmin"])
        assert phase == "Failed" and "GCS bucket tpu-rl-sim not found or accessible" in emulated, emulated
        assert conversion(["roles/storage.objectAdmin", "roles/storage.legacyBucketReader"])[0] == "Succeeded"
    finally:
        policy.unlink(missing_ok=True)


def test_a_conversion_that_fits_no_cpu_pool_node_fails_before_it_is_submitted(created):
    run, _ = created
    # cpu-np is c4d-standard-96 here; pretend the run asks for more than any node has.
    fits = {
        "cpu_pool_name": "cpu-np",
        "conversion_memory": "64Gi",
        "conversion_cpu": "8",
        "model_name": "qwen3-30b-a3b",
        "conversion_disk_gib": 85,
        "cpu_pool_disk_gb": 500,
    }
    check = EnsureJobSetOperator(task_id="ensure_jobset")._check_cpu_pool
    check(_hook_for(run), SimpleNamespace(**fits))
    with pytest.raises(
        AirflowFailException, match=r"conversion_memory: 400Gi does not fit on any node of the CPU pool 'cpu-np'"
    ):
        check(_hook_for(run), SimpleNamespace(**{**fits, "conversion_memory": "400Gi"}))
    # The download goes to the node's disk: a pool whose nodes leave less of it to pods than the download needs.
    with pytest.raises(
        AirflowFailException,
        match=r"asks for 300Gi of it, and the CPU pool 'cpu-np' leaves at most \d+Gi of a node's disk to pods; "
        r"fix: give the pool a larger boot disk",
    ):
        check(_hook_for(run), SimpleNamespace(**{**fits, "conversion_disk_gib": 300}))


def test_a_cpu_pool_at_zero_nodes_is_checked_as_gke_makes_its_nodes_and_a_missing_pool_fails(gke, created):
    """Cluster Toolkit's Pathways CPU pool autoscales from 0: with no node to read, the check read nothing and a
    conversion that could never fit sat Pending for hours. It now reads the pool's machine type and boot disk."""
    from google.cloud.container_v1 import NodePool

    from tpu_rl import gke as requests
    from tpu_rl.config import RunConfig
    from tpu_rl.hooks.gke import GkeApiHook

    run, _ = created
    config = RunConfig.from_params(run.params)
    body = {**requests.cpu_pool(config), "name": "cpu-zero", "initial_node_count": 0}
    body["autoscaling"] = {"enabled": True, "min_node_count": 0, "max_node_count": 2}
    body["config"] = {**body["config"], "disk_size_gb": 100}  # leaves about 42Gi to pods: less than a download
    client = gke.get_cluster_manager_client()
    client.create_node_pool(parent=requests.cluster_path(config), node_pool=NodePool.from_json(json.dumps(body)))
    pool_path = f"{requests.cluster_path(config)}/nodePools/cpu-zero"
    deadline = time.time() + 60
    while client.get_node_pool(name=pool_path).status.name != "RUNNING" and time.time() < deadline:
        time.sleep(0.5)
    hook = GkeApiHook(config.gcp_conn_id, config.project, config.region)
    check = EnsureJobSetOperator(task_id="ensure_jobset")._check_cpu_pool
    zero = SimpleNamespace(
        cpu_pool_name="cpu-zero",
        cluster_name=config.cluster_name,
        conversion_memory="64Gi",
        conversion_cpu="8",
        model_name="qwen3-30b-a3b",
        conversion_disk_gib=85,
        cpu_pool_disk_gb=500,
    )
    try:
        assert _hook_for(run).list_nodes("cloud.google.com/gke-nodepool=cpu-zero") == []
        with pytest.raises(
            AirflowFailException, match=r"the CPU pool 'cpu-zero' leaves at most 4\dGi of a node's disk"
        ):
            check(_hook_for(run), zero, hook)
        with pytest.raises(AirflowFailException, match=r"has no node pool 'cpu-gone'"):
            check(_hook_for(run), SimpleNamespace(**{**vars(zero), "cpu_pool_name": "cpu-gone"}), hook)
    finally:
        client.delete_node_pool(name=pool_path)
        _wait_until_gone(client, pool_path)  # the module's next requests on the cluster would meet its operation


def _wait_until_gone(client, pool_path: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            client.get_node_pool(name=pool_path)
        except NotFound:
            return
        time.sleep(0.5)
    raise AssertionError(f"{pool_path} was not deleted within {timeout} s")


def _hook_for(run):
    from tpu_rl.config import RunConfig
    from tpu_rl.hooks.kubernetes import ClusterTarget, KubernetesApiHook

    return KubernetesApiHook(ClusterTarget.for_run(RunConfig.from_params(run.params)))


def test_tpu_pools_are_created_per_run_then_adopted_then_deleted(gke, created):
    run, _ = created
    pool_name = run.identity.tpu_pool_name(0)
    create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
    assert len(run_operator(create, run.context())) == 1
    pool = gke.get_cluster_manager_client().get_node_pool(
        name=f"projects/tpu-rl-sim/locations/us-east5/clusters/{run.params['cluster_name']}/nodePools/{pool_name}"
    )
    assert (pool.initial_node_count, pool.config.machine_type, pool.placement_policy.tpu_topology) == (
        4,
        "ct6e-standard-4t",
        "4x4",
    )
    assert (pool.management.auto_upgrade, pool.management.auto_repair) == (True, True)
    nodes = _hook_for(run).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}")
    assert len(nodes) == 4 and all(n.status.capacity["google.com/tpu"] == "4" for n in nodes)

    # A retry after the pool exists adopts it: nothing new to wait for.
    assert run_operator(create, run.context()) == []

    delete = tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL)
    assert len(run_operator(delete, run.context())) == 1
    assert _hook_for(run).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}") == []
    # The slice's TPU time, from GKE's own operations: from its create's end to its delete's end.
    [slice_] = run.ti.pushed(XCOM_TPU_SLICES)
    assert slice_["pool"] == pool_name and slice_["nodes_from"] < slice_["nodes_gone"]
    # Deleting again (a retried teardown) finds nothing and succeeds.
    assert run_operator(delete, run.context()) == []


def test_a_stockout_fails_the_pool_create_with_what_to_do_and_a_retry_replaces_the_failed_pool(gke, created):
    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"])  # another run's pools on the same cluster
    pool_name = other.identity.tpu_pool_name(0)
    gke_faults.set_fault("gke-test-stockout", "stockout", pool_prefix=pool_name, times=1)
    try:
        create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
        with pytest.raises(AirflowFailException) as failed:
            run_operator(create, other.context())
        assert f"GKE could not create TPU node pool {pool_name}: " in str(failed.value)
        assert "GCE_STOCKOUT" in str(failed.value)
        assert "fix: there is no v6e-16 capacity in us-east5-b now" in str(failed.value)
        # The capacity is back: a new try deletes the pool left in ERROR and creates it again.
        assert len(run_operator(create, other.context())) == 2  # the delete, then the create
        assert len(_hook_for(other).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}")) == 4
    finally:
        gke_faults.clear_faults("gke-test-stockout")
        run_operator(
            tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL), other.context()
        )


def test_a_pool_whose_create_still_waits_for_capacity_is_deleted_once_gke_lets_it(gke, created, capsys):
    """After create_tpu_pools gave up waiting (capacity_wait_minutes), GKE's create still runs and GKE refuses
    the delete: delete_tpu_pools waits for that operation, deferred, then deletes the pool."""
    from google.cloud.container_v1 import NodePool

    from tpu_rl import gke as requests
    from tpu_rl.config import RunConfig

    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"])
    config, pool_name = RunConfig.from_params(other.params), other.identity.tpu_pool_name(0)
    gke_faults.set_fault("gke-test-held", "capacity-held", pool_prefix=pool_name, seconds=6)
    try:
        client = gke.get_cluster_manager_client()
        pool = NodePool.from_json(json.dumps(requests.tpu_node_pool(config, other.identity, 0)))
        client.create_node_pool(parent=requests.cluster_path(config), node_pool=pool)
        delete = tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL)
        waited = run_operator(delete, other.context())
        assert len(waited) == 2  # the create it waited for, then its own delete
        # GKE names the project by number in its operation links; the run knows it by id.
        assert f"GKE refuses to delete node pool {pool_name} while operation" in capsys.readouterr().out
        assert _hook_for(other).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}") == []
        with pytest.raises(NotFound):
            client.get_node_pool(name=f"{requests.cluster_path(config)}/nodePools/{pool_name}")
    finally:
        gke_faults.clear_faults("gke-test-held")


@pytest.mark.parametrize(
    ("fault", "seconds", "shown"),
    [("capacity-held", 5, "PROVISIONING"), ("slow-create", 12, "ERROR")],
    ids=["provisioning", "slow-create-in-error"],
)
def test_a_retry_waits_for_the_create_gke_still_runs_instead_of_replacing_the_pool(
    gke, created, capsys, fault, seconds, shown
):
    """A try that ended while GKE still created its pool (a worker lost, say): the next try waits for that create,
    whatever the pool shows meanwhile: PROVISIONING (not a slice training can use, so not adopted) or ERROR (GKE
    may show a slow create so, then make it RUNNING: NVIDIA/aicr 2065, so not deleted and created again). The
    slice comes from the first create."""
    from google.cloud.container_v1 import NodePool

    from tpu_rl import gke as requests
    from tpu_rl.config import RunConfig

    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"])
    config, pool_name = RunConfig.from_params(other.params), other.identity.tpu_pool_name(0)
    gke_faults.set_fault(f"gke-test-{fault}", fault, pool_prefix=pool_name, seconds=seconds)
    try:
        client = gke.get_cluster_manager_client()
        first = client.create_node_pool(
            parent=requests.cluster_path(config),
            node_pool=NodePool.from_json(json.dumps(requests.tpu_node_pool(config, other.identity, 0))),
        )
        pool_path = f"{requests.cluster_path(config)}/nodePools/{pool_name}"
        deadline = time.monotonic() + 30
        while client.get_node_pool(name=pool_path).status != NodePool.Status[shown]:
            assert time.monotonic() < deadline, f"the emulator's {fault} create never showed {shown}"
            time.sleep(0.5)
        create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
        assert run_operator(create, other.context()) == [first.name]  # no delete, no second create
        assert f"Node pool {pool_name} is {shown}: waiting for GKE's operation {first.name}" in capsys.readouterr().out
        assert client.get_node_pool(name=pool_path).status == NodePool.Status.RUNNING
        assert len(_hook_for(other).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}")) == 4
    finally:
        gke_faults.clear_faults(f"gke-test-{fault}")
        run_operator(
            tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL), other.context()
        )


def test_a_partly_created_pool_is_replaced_not_adopted(gke, created, capsys):
    """A stockout can leave a pool RUNNING_WITH_ERROR with some of its hosts: training would wait for the
    others forever. The next try deletes it and creates it whole."""
    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"])
    pool_name = other.identity.tpu_pool_name(0)
    gke_faults.set_fault("gke-test-partial", "stockout", pool_prefix=pool_name, times=1, nodes=2)
    create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
    try:
        with pytest.raises(AirflowFailException, match="GCE_STOCKOUT"):
            run_operator(create, other.context())
        assert len(_hook_for(other).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}")) == 2
        assert len(run_operator(create, other.context())) == 2  # the delete of the partial pool, the new create
        assert f"Node pool {pool_name} is RUNNING_WITH_ERROR" in capsys.readouterr().out
        assert len(_hook_for(other).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}")) == 4
    finally:
        gke_faults.clear_faults("gke-test-partial")
        run_operator(
            tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL), other.context()
        )


def test_missing_quota_fails_at_once_naming_the_quota_and_creates_nothing(gke, created):
    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"], capacity_wait_minutes=60)
    pool_name = other.identity.tpu_pool_name(0)
    gke_faults.set_fault("gke-test-quota", "quota", pool_prefix=pool_name)
    try:
        started = time.monotonic()
        with pytest.raises(AirflowFailException) as failed:
            run_operator(
                tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL), other.context()
            )
        assert time.monotonic() - started < 30  # the hour of capacity wait is not spent on quota
        message = str(failed.value)
        assert "Insufficient regional quota" in message and "TPUS_PER_TPU_FAMILY" in message
        assert (
            "Compute Engine quota for 16 v6e-16 chips in us-east5" in message and "not the Cloud TPU API's" in message
        )
        assert pool_name not in {p.name for p in get_cluster(gke, run.params["cluster_name"]).node_pools}
    finally:
        gke_faults.clear_faults("gke-test-quota")


def test_gke_throttling_is_waited_out_not_read_as_missing_quota(gke, created, capsys):
    """GKE answers 429 for the project's requests a minute (its words say "quota"): the pool create asks again a
    little later and the run goes on; so does the pools' delete."""
    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"])
    pool_name = other.identity.tpu_pool_name(0)
    create = tpu_pools.CreateTpuNodePoolsOperator(
        task_id="create_tpu_pools", poll_interval=POLL, refused_retry_interval=1
    )
    delete = tpu_pools.DeleteTpuNodePoolsOperator(
        task_id="delete_tpu_pools", poll_interval=POLL, refused_retry_interval=1
    )
    gke_faults.set_fault("gke-test-throttle", "throttle", pool_prefix=pool_name, times=2)
    try:
        assert len(run_operator(create, other.context())) == 1  # the one create GKE took
        out = capsys.readouterr().out
        assert out.count("GKE refuses to create the TPU node pools for now (throttled: Quota exceeded for") == 2
        assert len(_hook_for(other).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}")) == 4
        gke_faults.set_fault("gke-test-throttle", "throttle", pool_prefix=pool_name, times=1)
        assert len(run_operator(delete, other.context())) == 1
        assert "GKE refuses to delete the TPU node pools for now (throttled:" in capsys.readouterr().out
        assert pool_name not in {p.name for p in get_cluster(gke, run.params["cluster_name"]).node_pools}
    finally:
        gke_faults.clear_faults("gke-test-throttle")
        run_operator(delete, other.context())


def test_gke_answering_unavailable_is_asked_again_with_backoff(gke, created):
    """GKE's front end answers 503 (UNAVAILABLE) for a moment: the same call is made again, with backoff, and the
    pool is created and deleted as if nothing happened (the generated client retries neither a create nor, past
    20 s, anything else)."""
    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"])
    pool_name = other.identity.tpu_pool_name(0)
    create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
    delete = tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL)
    gke_faults.set_fault("gke-test-unavailable", "unavailable", pool_prefix=pool_name, times=3)
    try:
        assert len(run_operator(create, other.context())) == 1
        assert gke_faults.list_faults()["gke-test-unavailable"]["applied"] == 3
        assert len(_hook_for(other).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}")) == 4
        gke_faults.set_fault("gke-test-unavailable", "unavailable", pool_prefix=pool_name, times=2)
        assert len(run_operator(delete, other.context())) == 1
        assert pool_name not in {p.name for p in get_cluster(gke, run.params["cluster_name"]).node_pools}
    finally:
        gke_faults.clear_faults("gke-test-unavailable")
        run_operator(delete, other.context())


def test_more_slices_than_gke_runs_operations_at_once_are_created_in_turns(gke, created):
    """GKE runs at most 5 operations at once on a cluster and refuses more with 429 "Too many operations"
    (which says "quota" too): six slices are created five at a time, none refused, all RUNNING."""
    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"], cluster_nodepool_count=6, ici_expert_parallelism=1)
    create = tpu_pools.CreateTpuNodePoolsOperator(
        task_id="create_tpu_pools", poll_interval=POLL, refused_retry_interval=1
    )
    delete = tpu_pools.DeleteTpuNodePoolsOperator(
        task_id="delete_tpu_pools", poll_interval=POLL, refused_retry_interval=1
    )
    pools = {other.identity.tpu_pool_name(i) for i in range(6)}
    try:
        run_operator(create, other.context())
        cluster = get_cluster(gke, run.params["cluster_name"])
        assert {p.name: p.status.name for p in cluster.node_pools if p.name in pools} == dict.fromkeys(pools, "RUNNING")
        client = gke.get_cluster_manager_client()
        creates = [
            op
            for op in client.list_operations(parent="projects/tpu-rl-sim/locations/us-east5").operations
            if op.operation_type.name == "CREATE_NODE_POOL" and op.target_link.rsplit("/", 1)[-1] in pools
        ]
        assert len(creates) == 6  # one each: no create was refused and sent again
        sixth = max(creates, key=lambda op: op.start_time)
        assert sum(op.end_time <= sixth.start_time for op in creates) >= 1  # it waited for one of the first five
    finally:
        run_operator(delete, other.context())


def test_gke_upgrading_the_cluster_holds_the_pool_create_until_it_is_done(gke, created, capsys):
    """GKE upgrades a cluster's control plane on its own (the maintenance exclusion still allows patches) and
    refuses a pool create meanwhile (FAILED_PRECONDITION "... is currently upgrading cluster"): the create waits
    for GKE's operation, deferred, and is sent again once it is done."""
    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"])
    pool_name = other.identity.tpu_pool_name(0)
    create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
    delete = tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL)
    gke_faults.set_fault("gke-test-upgrade", "upgrade", pool_prefix=pool_name, times=1, seconds=4)
    try:
        waited = run_operator(create, other.context())
        assert len(waited) == 2  # GKE's upgrade, then the pool's create
        assert "GKE refuses to create the TPU node pools while operation" in capsys.readouterr().out
        assert (
            "UPGRADE_MASTER"
            in gke.get_operation(waited[0].rsplit("/", 1)[-1], project_id="tpu-rl-sim").operation_type.name
        )
        assert len(_hook_for(other).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}")) == 4
    finally:
        gke_faults.clear_faults("gke-test-upgrade")
        run_operator(delete, other.context())


def test_the_slices_of_a_run_are_created_and_deleted_side_by_side(gke, created):
    """GKE runs operations on different node pools at once: N slices take about one create, not N."""
    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"], cluster_nodepool_count=2, ici_expert_parallelism=1)
    create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
    delete = tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL)
    client = gke.get_cluster_manager_client()
    try:
        run_operator(create, other.context())
        run_operator(delete, other.context())
        pools = {other.identity.tpu_pool_name(i) for i in range(2)}
        ops = [
            op
            for op in client.list_operations(parent="projects/tpu-rl-sim/locations/us-east5").operations
            if (op.target_link.rsplit("/", 1)[-1] in pools)
        ]
        for kind in ("CREATE_NODE_POOL", "DELETE_NODE_POOL"):
            first, second = sorted((op for op in ops if op.operation_type.name == kind), key=lambda op: op.start_time)
            assert second.start_time < first.end_time, kind  # the second began before the first ended
    finally:
        run_operator(delete, other.context())


# The run's cluster (``created``) is deleted by the teardown tests below: the pool tests come before them.
def test_capacity_candidates_fail_over_by_zone_and_capacity_type(gke, created):
    """The issue's scenario at pool creation: on demand stocked out in us-east5-b, Spot without quota there, on demand
    in us-east5-a has capacity: the pool ends in us-east5-a and the task says why it left the first two."""
    run, _ = created
    candidates = [
        {"zone": "us-east5-b", "capacity_type": "on_demand"},
        {"zone": "us-east5-b", "capacity_type": "spot", "price_per_chip_hour": 1.1},
        {"zone": "us-east5-a", "capacity_type": "on_demand"},
    ]
    other = Run(cluster_name=run.params["cluster_name"], capacity_candidates=candidates)
    pool_name = other.identity.tpu_pool_name(0)
    stockout = {"pool_prefix": pool_name, "zone": "us-east5-b", "capacity_type": "on_demand"}
    gke_faults.set_fault("gke-test-zone-stockout", "stockout", **stockout)
    gke_faults.set_fault("gke-test-spot-quota", "quota", pool_prefix=pool_name, capacity_type="spot")
    try:
        scope = RunScope.of(other.context())  # the DAG's check_training_record, where the attempts are kept
        check_training_record(scope.bucket, scope.layout.training_record_object, scope.training_record, logging)
        create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
        run_operator(create, other.context())
        pool = gke.get_cluster_manager_client().get_node_pool(
            name=f"projects/tpu-rl-sim/locations/us-east5/clusters/{run.params['cluster_name']}/nodePools/{pool_name}"
        )
        assert list(pool.locations) == ["us-east5-a"] and not pool.config.spot
        report = other.ti.pushed("capacity")
        assert report["serving"] == 2 and [a["outcome"] for a in report["attempts"]] == ["stockout", "quota"]
        nodes = _hook_for(other).list_nodes(f"cloud.google.com/gke-nodepool={pool_name}")
        assert len(nodes) == 4 and {n.metadata.labels["topology.kubernetes.io/zone"] for n in nodes} == {"us-east5-a"}
        # A new try goes on from candidate 2: it adopts the pool, with nothing created or deleted.
        retry = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
        assert run_operator(retry, other.context()) == []
        assert other.ti.pushed("capacity")["serving"] == 2
    finally:
        gke_faults.clear_faults("gke-test-zone-stockout")
        gke_faults.clear_faults("gke-test-spot-quota")
        run_operator(
            tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL), other.context()
        )


def test_a_reservation_too_small_for_the_slice_moves_the_run_to_the_next_candidate(gke, created):
    """The reservation holds 2 VMs and the slice needs 4 hosts: GKE's 429 "Reservation does not have enough
    resources" is read as capacity that is not there (not throttling to wait out): the run moves on at once and its
    pool ends on demand."""
    from sim.gke_settings import GKE_DIR

    run, _ = created
    reservations = GKE_DIR / "reservations.json"
    before = reservations.read_text() if reservations.exists() else None
    reservations.write_text(json.dumps([{"name": "tpu-rl-small", "vm_count": 2}]))
    candidates = [
        {"zone": "us-east5-b", "capacity_type": "reservation", "reservation": "tpu-rl-small"},
        {"zone": "us-east5-b", "capacity_type": "on_demand"},
    ]
    other = Run(cluster_name=run.params["cluster_name"], capacity_candidates=candidates)
    try:
        scope = RunScope.of(other.context())
        check_training_record(scope.bucket, scope.layout.training_record_object, scope.training_record, logging)
        create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
        run_operator(create, other.context())
        pool = gke.get_cluster_manager_client().get_node_pool(
            name=f"projects/tpu-rl-sim/locations/us-east5/clusters/{run.params['cluster_name']}/nodePools/"
            f"{other.identity.tpu_pool_name(0)}"
        )
        assert not pool.config.reservation_affinity.values
        report = other.ti.pushed("capacity")
        assert report["serving"] == 1 and report["attempts"][0]["outcome"] == "stockout"
        assert "Reservation does not have enough resources" in report["attempts"][0]["detail"]
    finally:
        if before is None:
            reservations.unlink(missing_ok=True)
        else:
            reservations.write_text(before)
        run_operator(
            tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL), other.context()
        )


def test_a_candidate_the_preflight_left_out_is_never_asked_of_gke(gke, created):
    """The preflight found candidate 0's reservation too small: create_tpu_pools starts on candidate 1, and GKE
    never sees a pool request for candidate 0 (the emulator would have refused it: the reservation does not exist)."""
    run, _ = created
    candidates = [
        {"zone": "us-east5-b", "capacity_type": "reservation", "reservation": "tpu-rl-not-there"},
        {"zone": "us-east5-b", "capacity_type": "on_demand"},
    ]
    other = Run(cluster_name=run.params["cluster_name"], capacity_candidates=candidates)
    why = "capacity_candidates[0].reservation: reservation ... has 2 of 2 VMs not in use"
    other.ti.xcoms["preflight", "return_value"] = {"skipped": {"0": why}, "warnings": []}
    try:
        scope = RunScope.of(other.context())
        check_training_record(scope.bucket, scope.layout.training_record_object, scope.training_record, logging)
        create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
        operations = run_operator(create, other.context())
        assert len(operations) == 1  # one pool, created once, on candidate 1
        report = other.ti.pushed("capacity")
        assert report["serving"] == 1
        assert report["attempts"] == [{"candidate": 0, "outcome": "left out by the preflight", "detail": why, "at": ""}]
    finally:
        run_operator(
            tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools", poll_interval=POLL), other.context()
        )


def test_pool_teardown_never_touches_pools_it_did_not_create(gke, created):
    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"], tpu_pool_mode="cluster")
    assert run_operator(tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools"), other.context()) == []


def test_teardown_leaves_a_cluster_another_run_created(gke, created):
    run, _ = created
    other = Run(cluster_name=run.params["cluster_name"])
    assert run_operator(cluster_ops.DeleteClusterOperator(task_id="delete_cluster"), other.context()) == []
    assert get_cluster(gke, run.params["cluster_name"]) is not None


def test_existing_cluster_teardown_deletes_only_the_runs_secret(gke, created, capsys):
    from kubernetes.client import CoreV1Api

    from tpu_rl import manifests
    from tpu_rl.config import RunConfig

    run, _ = created
    user = Run(cluster_name=run.params["cluster_name"], cluster_mode="existing", tpu_pool_mode="existing")
    secret = manifests.hf_token_secret(RunConfig.from_params(user.params), user.identity, "hf_not_real")
    core = CoreV1Api(_hook_for(user).kube_hook.get_conn())
    core.create_namespaced_secret("default", secret)
    delete = cluster_ops.DeleteClusterOperator(task_id="delete_cluster")
    assert run_operator(delete, user.context()) == []
    assert (
        f"Deleted Secret default/{user.identity.secret_name()}; the existing cluster stays" in capsys.readouterr().out
    )
    assert not [
        s for s in core.list_namespaced_secret("default").items if s.metadata.name == secret["metadata"]["name"]
    ]
    assert get_cluster(gke, run.params["cluster_name"]) is not None
    assert run_operator(delete, user.context()) == []  # a retry: nothing left to delete
    assert f"No Secret {user.identity.secret_name()} to delete" in capsys.readouterr().out


def test_keep_cluster_skips_the_delete(gke, created):
    run, _ = created
    assert (
        run_operator(cluster_ops.DeleteClusterOperator(task_id="delete_cluster"), run.context(keep_cluster=True)) == []
    )
    assert get_cluster(gke, run.params["cluster_name"]) is not None


def test_teardown_deletes_the_cluster_this_run_created_and_its_control_plane(gke, created, capsys):
    """Even while GKE upgrades it on its own: the delete waits for GKE's operation, deferred, and is sent again."""
    run, _ = created
    hook = _hook_for(run)
    delete = cluster_ops.DeleteClusterOperator(task_id="delete_cluster", poll_interval=POLL)
    gke_faults.set_fault("gke-test-upgrade", "upgrade", cluster=run.params["cluster_name"], times=1, seconds=3)
    try:
        assert len(run_operator(delete, run.context())) == 2  # GKE's upgrade, then the delete
    finally:
        gke_faults.clear_faults("gke-test-upgrade")
    assert f"GKE refuses to delete cluster {run.params['cluster_name']} while operation" in capsys.readouterr().out
    assert get_cluster(gke, run.params["cluster_name"]) is None
    with pytest.raises(Exception):  # noqa: B017 (its API server is gone with it: refused or not found)
        hook.list_nodes("")
    # A retried teardown after the delete (or after a create that never happened) is a no-op.
    assert run_operator(delete, run.context()) == []


def test_a_shared_cluster_kept_by_its_last_run_is_joined_at_once_and_a_stuck_delete_is_taken_over(gke, capsys):
    """keep_cluster in shared mode leaves the lease open; a last run that left to delete the cluster and ended
    without deleting it (its delete kept failing) does not hold the next run back for ever."""
    from tpu_rl.hooks.gcs import storage_client
    from tpu_rl.leases import Holder, leave_cluster
    from tpu_rl.run_scope import RunScope

    first = Run(cluster_mode="shared", keep_cluster=True)
    name = first.params["cluster_name"]
    create = cluster_ops.CreateClusterOperator(task_id="create_cluster", poll_interval=POLL)
    delete = cluster_ops.DeleteClusterOperator(task_id="delete_cluster", poll_interval=POLL)
    try:
        assert len(run_operator(create, first.context())) == 1
        assert run_operator(delete, first.context()) == []
        assert get_cluster(gke, name) is not None  # kept
        second = Run(cluster_name=name, cluster_mode="shared")
        second.ti.run_states[first.run_id] = "success"
        assert run_operator(create, second.context()) == []  # joined and adopted, without waiting
        assert "Joined the lease of shared cluster" in capsys.readouterr().out

        # The second run left to delete the cluster; its delete never happened and its run is still going.
        store = cluster_lease(RunScope.of(second.context()))
        leaving = Holder.of(second.identity, "2026-12-01T00:00:00+00:00")
        store.change(lambda lease: leave_cluster(lease, leaving, lambda run: "running", closing=True))
        third = Run(cluster_name=name, cluster_mode="shared")
        third.ti.run_states[second.run_id] = "running"
        with pytest.raises(TaskDeferred) as deferred:
            create.execute(third.context())
        assert not isinstance(deferred.value.trigger, GkeOperationTrigger)  # the wait for the delete
        assert "is being deleted by the last run that used it" in capsys.readouterr().out
        third.ti.run_states[second.run_id] = "failed"  # it ended without deleting the cluster
        assert run_operator(create, third.context()) == []
        assert "its run has ended without deleting it: this run takes the cluster over" in capsys.readouterr().out

        # A run of the same cluster name that keeps its lease in another bucket is refused: it would delete
        # the cluster under the runs it cannot see.
        other_bucket = f"gke-test-{uuid.uuid4().hex[:6]}"
        storage_client().create_bucket(other_bucket)
        intruder = Run(cluster_name=name, cluster_mode="shared", gcs_bucket=other_bucket)
        with pytest.raises(
            AirflowFailException, match="gcs_bucket: shared cluster .* keeps its lease at gs://tpu-rl-sim/"
        ):
            run_operator(create, intruder.context())

        assert len(run_operator(delete, third.context())) == 1  # the last holder deletes it
        assert get_cluster(gke, name) is None
    finally:
        if get_cluster(gke, name):
            gke.delete_cluster(name=name, project_id="tpu-rl-sim", wait_to_complete=False)


def test_a_pool_whose_nodes_the_identity_may_not_act_as_is_refused_before_it_exists(gke, created):
    """The emulator holds the IAM policy docs/getting-started/composer.md grants (sim/gke_iam.py): the environment's
    account may act as the nodes' account and no other. A run naming another node account is refused by GKE's 400
    before any pool exists, and fails at once, naming the permission and the role to grant (a retry would be refused
    again); the documented account's pools are created by the other tests of this module."""
    run, _ = created
    stranger = "tpu-rl-other@tpu-rl-sim.iam.gserviceaccount.com"
    other = Run(cluster_name=run.params["cluster_name"], node_service_account=stranger)
    create = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", poll_interval=POLL)
    with pytest.raises(AirflowFailException) as failed:
        run_operator(create, other.context())
    message = str(failed.value)
    assert f'The user does not have access to service account "{stranger}"' in message
    assert "iam.serviceAccounts.actAs" in message and "roles/iam.serviceAccountUser" in message
    pool_path = f"projects/tpu-rl-sim/locations/us-east5/clusters/{run.params['cluster_name']}/nodePools/"
    with pytest.raises(NotFound):
        gke.get_cluster_manager_client().get_node_pool(name=pool_path + other.identity.tpu_pool_name(0))
