"""The plan command: what a run would submit, reviewable before spending money."""

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
import yaml

from tpu_rl.config import RunConfig
from tpu_rl.plan import plan_documents, render
from tpu_rl.run import RunIdentity
from tpu_rl_testing import REPO

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core


def _by_kind(docs):
    jobsets = {d["metadata"]["name"].split("-")[1]: d for _, d in docs if d.get("kind") == "JobSet"}
    return jobsets, [d for _, d in docs if d.get("gkeRequest") == "CreateNodePool"]


def _pod_spec(jobset, replicated_job):
    job = next(r for r in jobset["spec"]["replicatedJobs"] if r["name"] == replicated_job)
    return job, job["template"]["spec"]["template"]["spec"]


def test_tutorial_plan_has_the_tutorials_workloads(tutorial_config, run):
    docs = plan_documents(tutorial_config, run)
    jobsets, node_pools = _by_kind(docs)
    assert set(jobsets) == {"hf2mt", "train", "mt2hf"}

    train = jobsets["train"]
    worker_job, worker = _pod_spec(train, "worker")
    assert worker_job["replicas"] == 1
    assert worker_job["template"]["spec"]["parallelism"] == worker_job["template"]["spec"]["completions"] == 16
    assert worker["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}
    assert worker["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "8x8",
    }
    _, head = _pod_spec(train, "pathways-head")
    assert head["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-np"}
    rm = next(c for c in head["initContainers"] if c["name"] == "pathways-rm")
    assert "--instance_type=tpuv6e:8x8" in rm["args"]
    assert len(train["metadata"]["name"]) <= 22

    for stage in ("hf2mt", "mt2hf"):
        job, pod = _pod_spec(jobsets[stage], "main-job")
        assert job["template"]["spec"]["parallelism"] == 1
        assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-np"}

    [pool] = node_pools
    assert pool["nodePool"]["initial_node_count"] == 16
    assert pool["nodePool"]["placement_policy"] == {"type": "COMPACT", "tpu_topology": "8x8"}
    assert pool["nodePool"]["config"]["machine_type"] == "ct6e-standard-4t"


def test_conversion_on_the_slice_is_the_tutorials_job(tutorial_conf, run):
    from tpu_rl.config import RunConfig

    config = RunConfig.from_params({**tutorial_conf, "conversion_on_tpu": True, "tpu_pool_mode": "cluster"})
    jobsets, _ = _by_kind(plan_documents(config, run))
    job, pod = _pod_spec(jobsets["hf2mt"], "main-job")
    assert job["template"]["spec"]["completions"] == 16
    assert pod["containers"][0]["command"][2].startswith('[ "$JOB_COMPLETION_INDEX" != "0" ] || python3 -m')
    assert jobsets["hf2mt"]["metadata"]["annotations"] == {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
    }


def test_no_token_anywhere_in_the_plan(tutorial_config, run):
    text = render(tutorial_config, run)
    assert "hf_access_token" not in text
    docs = list(yaml.safe_load_all(text))
    [secret] = [d for d in docs if d.get("kind") == "Secret"]
    assert "data" not in secret and "stringData" not in secret
    for doc in docs:
        if doc.get("kind") != "JobSet":
            continue
        for job in doc["spec"]["replicatedJobs"]:
            pod = job["template"]["spec"]["template"]["spec"]
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                for env in container.get("env", []):
                    if env["name"] == "HF_TOKEN":
                        assert env["valueFrom"]["secretKeyRef"] == {
                            "name": secret["metadata"]["name"],
                            "key": "HF_TOKEN",
                        }


def test_every_workload_pod_runs_as_the_packages_service_account_without_a_token(tutorial_config, run):
    """Not the namespace's default account: the pods use the node's identity (hostNetwork) for Cloud Storage
    and never call Kubernetes, so they get no API token."""
    docs = list(yaml.safe_load_all(render(tutorial_config, run)))
    [account] = [d for d in docs if d.get("kind") == "ServiceAccount"]
    assert account["automountServiceAccountToken"] is False
    pods = [
        job["template"]["spec"]["template"]["spec"]
        for d in docs
        if d.get("kind") == "JobSet"
        for job in d["spec"]["replicatedJobs"]
    ]
    assert len(pods) == 4  # the two conversions, the Pathways head and workers
    for pod in pods:
        assert (pod["serviceAccountName"], pod["automountServiceAccountToken"], pod["hostNetwork"]) == (
            account["metadata"]["name"],
            False,
            True,
        )


def test_names_are_stable_for_a_run_and_distinct_between_runs(tutorial_config):
    # At one instant: the cluster's upgrade exclusion starts at the time of the create (two renders a second
    # apart differ there, whatever the names).
    now = datetime(2026, 12, 4, 13, 19, 46, tzinfo=UTC)
    first = render(tutorial_config, RunIdentity("maxtext_rl_tpu", "manual__a"), now)
    assert first == render(tutorial_config, RunIdentity("maxtext_rl_tpu", "manual__a"), now)
    assert first != render(tutorial_config, RunIdentity("maxtext_rl_tpu", "manual__b"), now)


def test_cli_prints_yaml_for_good_params_and_refuses_bad_ones(tmp_path):
    good = tmp_path / "good.json"
    good.write_text((REPO / "include/examples/tutorial.json").read_text())
    result = subprocess.run(
        [sys.executable, "-m", "tpu_rl.plan", "--conf", str(good)], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    kinds = [d.get("kind") or d.get("gkeRequest") for d in yaml.safe_load_all(result.stdout)]
    assert kinds == ["CreateCluster", "CreateNodePool", "ServiceAccount", "Secret", "JobSet", "JobSet", "JobSet"]
    import tpu_rl

    assert result.stdout.startswith(f"# tpu-rl {tpu_rl.__version__}: ")  # which version of the package planned it

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(good.read_text()), "topology": "7x9"}))
    result = subprocess.run(
        [sys.executable, "-m", "tpu_rl.plan", "--conf", str(bad)], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode != 0
    assert result.stdout == ""
    assert "topology: '7x9' is not a v6e topology" in result.stderr


def test_requests_gke_accepts_on_a_release_channel_cluster(tutorial_conf, run):
    """GKE refuses auto-upgrade or auto-repair off on a REGULAR channel cluster; upgrades are held off by a
    maintenance exclusion instead, as Cluster Toolkit's gke-tpu-v6e blueprints do: until the end of support of
    the cluster's version (a shared or kept cluster outlives any fixed date), with the daily maintenance
    window its gke-cluster module always sets."""
    from datetime import datetime

    config = RunConfig.from_params({**tutorial_conf, "tpu_pool_mode": "cluster"})
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    [(_, create)] = [(c, d) for c, d in plan_documents(config, run, now) if d.get("gkeRequest") == "CreateCluster"]
    cluster = create["cluster"]
    assert cluster["release_channel"] == {"channel": "REGULAR"}
    window = cluster["maintenance_policy"]["window"]
    assert window["daily_maintenance_window"] == {"start_time": "09:00"}
    [exclusion] = window["maintenance_exclusions"].values()
    assert exclusion == {
        "start_time": "2026-11-30T12:00:00Z",
        "maintenance_exclusion_options": {
            "scope": "NO_MINOR_OR_NODE_UPGRADES",
            "end_time_behavior": "UNTIL_END_OF_SUPPORT",
        },
    }
    tpu_pools = [p for p in cluster["node_pools"] if p["config"]["machine_type"] == "ct6e-standard-4t"]
    assert tpu_pools and all(p["management"] == {"auto_repair": True, "auto_upgrade": True} for p in tpu_pools)
    cpu = next(p for p in cluster["node_pools"] if p["name"] == "cpu-np")["config"]
    assert cpu["disk_type"] == "hyperdisk-balanced"  # C4D boots only from Hyperdisk
    # gVNIC on every pool, as Cluster Toolkit and xpk create them (not only where the machine needs it).
    assert all(p["config"]["gvnic"] == {"enabled": True} for p in cluster["node_pools"])
    assert all(p["config"]["service_account"] == config.node_service_account for p in cluster["node_pools"])


def test_every_workload_pod_reaches_gcs_as_the_node_service_account(tutorial_config, run):
    """Pods without hostNetwork on GKE_METADATA nodes act as their Kubernetes service account's Workload
    Identity principal, which has no bucket access."""
    jobsets, _ = _by_kind(plan_documents(tutorial_config, run))
    for stage, replicated_job in (
        ("hf2mt", "main-job"),
        ("mt2hf", "main-job"),
        ("train", "pathways-head"),
        ("train", "worker"),
    ):
        _, pod = _pod_spec(jobsets[stage], replicated_job)
        assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet"), (stage, replicated_job)


def test_pathways_containers_match_cluster_toolkit(tutorial_config, run):
    jobsets, _ = _by_kind(plan_documents(tutorial_config, run))
    train = jobsets["train"]
    worker_job, worker = _pod_spec(train, "worker")
    _, head = _pod_spec(train, "pathways-head")
    for container in [*head["initContainers"], *head["containers"], *worker["containers"]]:
        assert {"name": "ABSL_FLAGS", "value": "--pathways_pipe_unreachable_timeout=60s"} in container["env"], (
            container["name"]
        )
    assert worker_job["template"]["spec"]["backoffLimit"] == 16 * 4


def test_the_plan_shows_each_capacity_type_and_what_it_sets(tutorial_conf, run):
    def pool_request(**params):
        config = RunConfig.from_params({**tutorial_conf, **params})
        [(comment, doc)] = [(c, d) for c, d in plan_documents(config, run) if d.get("gkeRequest") == "CreateNodePool"]
        return comment, doc["nodePool"]

    comment, pool = pool_request()
    assert comment.endswith("capacity_type on_demand: no capacity field (standard VMs, all hosts at once)")
    assert "spot" not in pool["config"] and pool["initial_node_count"] == 16

    comment, pool = pool_request(capacity_type="spot")
    assert "capacity_type spot: config.spot true" in comment
    assert (pool["config"]["spot"], pool["config"]["reservation_affinity"]) == (
        True,
        {"consume_reservation_type": "NO_RESERVATION"},
    )

    comment, pool = pool_request(capacity_type="flex_start")
    assert "capacity_type flex_start: config.flex_start true" in comment
    assert pool["config"]["flex_start"] is True and pool["initial_node_count"] == 0
    assert pool["autoscaling"] == {"enabled": True, "min_node_count": 0, "max_node_count": 16, "location_policy": "ANY"}
    assert pool["management"] == {"auto_repair": False, "auto_upgrade": True}

    comment, pool = pool_request(capacity_type="reservation", reservation="my-v6e")
    assert "capacity_type reservation: config.reservation_affinity SPECIFIC_RESERVATION 'my-v6e'" in comment
    assert pool["config"]["reservation_affinity"]["values"] == ["projects/my-project/reservations/my-v6e"]


def test_the_conversion_asks_for_the_disk_its_download_needs(tutorial_conf, run):
    """MaxText's converter downloads the model into the Hugging Face cache (an emptyDir on the node's boot disk):
    62 GB for Qwen3-30B-A3B. Without a request the pod may land on a node without the room and be evicted."""

    def conversion(**params):
        config = RunConfig.from_params({**tutorial_conf, **params})
        docs = plan_documents(config, run)
        jobsets, _ = _by_kind(docs)
        _, pod = _pod_spec(jobsets["hf2mt"], "main-job")
        cluster = next(d for _, d in docs if d.get("gkeRequest") == "CreateCluster")["cluster"]
        cpu_pool = next(p for p in cluster["node_pools"] if p["name"] == "cpu-np")
        return pod, cpu_pool["config"]["disk_size_gb"]

    pod, disk = conversion()
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["ephemeral-storage"] == resources["limits"]["ephemeral-storage"] == "80Gi"
    assert pod["volumes"] == [{"name": "hf-cache", "emptyDir": {"sizeLimit": "80Gi"}}]
    assert disk == 500
    pod, disk = conversion(model_name="qwen3-235b-a22b", hf_model_path="Qwen/Qwen3-235B-A22B-Instruct-2507")  # 470 GB
    assert pod["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "536Gi" and disk == 1279
