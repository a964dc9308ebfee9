"""A per-cluster control plane (sim/control_plane.py) on the running simulation's etcd: it starts empty
(no nodes, no JobSet), the JobSet release installs through the API as a client would, the pod runner
makes the controller Deployment really run, and its webhook defaults a JobSet; stop(purge) leaves nothing.
"""

import os
import time
from importlib import resources

import pytest
import yaml

pytestmark = pytest.mark.sim

FIELD_MANAGER = "tpu-rl"
# 40..49 are for tests (the GKE emulator allocates from 0); the pid keeps concurrent runs apart.
SLOT = 40 + os.getpid() % 10


def apply(api, obj):
    """Server-side apply of one object, in its own namespace, as `kubectl apply --server-side` does."""
    from kubernetes import dynamic

    resource = dynamic.DynamicClient(api).resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    return resource.server_side_apply(
        body=obj,
        name=obj["metadata"]["name"],
        namespace=obj["metadata"].get("namespace"),
        field_manager=FIELD_MANAGER,
        force_conflicts=True,
    )


def wait(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_control_plane_installs_and_runs_jobset(sim, tmp_path):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from sim.control_plane import ControlPlane, process_alive, recorded_pid
    from sim.nodes import node

    cp = ControlPlane(f"test-cp-{SLOT}", SLOT)
    cp.stop(purge=True)  # leftovers of an interrupted run
    begin = time.time()
    try:
        cp.start({"test-token-not-secret": "creator@example.com"})
        cp.wait_ready(60)
        started_in = time.time() - begin
        assert cp.alive() and cp.endpoint == f"127.0.0.1:{17000 + 10 * SLOT}"

        # The creator's token: cluster-admin through a ClusterRoleBinding, not system:masters.
        ca = tmp_path / "ca.crt"
        ca.write_bytes(cp.ca_pem)
        conf = client.Configuration()
        conf.host, conf.ssl_ca_cert = f"https://{cp.endpoint}", str(ca)
        conf.api_key = {"authorization": "Bearer test-token-not-secret"}
        api = client.ApiClient(conf)
        core, ext = client.CoreV1Api(api), client.ApiextensionsV1Api(api)
        review = client.AuthenticationV1Api(api).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        assert review.status.user_info.username == "creator@example.com"
        assert "system:masters" not in (review.status.user_info.groups or [])

        assert core.list_node().items == []
        crds = {c.metadata.name for c in ext.list_custom_resource_definition().items}
        assert "jobsets.jobset.x-k8s.io" not in crds and "logs.kwok.x-k8s.io" in crds

        core.create_node(
            node(
                "gke-test-cp-default-pool-0",
                "default-pool",
                "e2-standard-8",
                {"cpu": "8", "memory": "32Gi", "pods": "110"},
            )
        )

        release = resources.files("tpu_rl.releases").joinpath("jobset-v0.10.1.yaml").read_text()
        for obj in yaml.safe_load_all(release):
            apply(api, obj)
        apps = client.AppsV1Api(api)

        def available():
            d = apps.read_namespaced_deployment("jobset-controller-manager", "jobset-system")
            return any(c.type == "Available" and c.status == "True" for c in (d.status.conditions or []))

        wait("the JobSet Deployment Available", available, 60)
        pod = core.list_namespaced_pod("jobset-system").items[0]
        assert pod.status.pod_ip.startswith(f"127.{100 + SLOT}.")

        # The real controller injects its CA and its webhook defaults a JobSet, through the Service.
        jobset = {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "webhook-probe", "namespace": "default"},
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "w",
                        "template": {
                            "spec": {
                                "template": {
                                    "spec": {
                                        "restartPolicy": "Never",
                                        "containers": [{"name": "c", "image": "busybox", "command": ["true"]}],
                                    }
                                }
                            }
                        },
                    }
                ]
            },
        }
        custom = client.CustomObjectsApi(api)

        last_error = []

        def defaulted():  # refused (500) until the controller serves its webhook
            try:
                return custom.create_namespaced_custom_object(
                    "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", jobset
                )
            except ApiException as e:
                last_error[:] = [f"{e.status} {e.body}"]

        try:
            created = wait("a JobSet defaulted by the webhook", defaulted, 60)
        except AssertionError as e:
            raise AssertionError(f"{e}; last answer: {last_error}") from None
        assert created["spec"]["successPolicy"]["operator"] == "All"
        hook = client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
            "jobset-mutating-webhook-configuration"
        )
        assert all(w.client_config.ca_bundle for w in hook.webhooks)
        print(f"control plane ready in {started_in:.1f} s; JobSet defaulted {time.time() - begin:.1f} s after start")
        pids = [recorded_pid(f) for f in (cp.dir / "pids").glob("*.pid")]
        assert len([p for p in pids if p]) == 7  # 6 components and the JobSet controller
    finally:
        pids = [p for p in (recorded_pid(f) for f in (cp.dir / "pids").glob("*.pid")) if p]
        cp.stop(purge=True)
    assert pids and not any(process_alive(p) for p in pids)
    assert cp.etcd_keys() == 0 and not cp.dir.exists()
