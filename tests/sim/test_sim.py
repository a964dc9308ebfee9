"""The simulated TPU cluster itself: real apiserver, scheduler, Job controller, JobSet controller and
webhooks, kwok-simulated v6e hosts, the GCS emulator and the MaxText stage emulator.

The workloads come from the package's manifest builder (tpu_rl.manifests), as the DAG submits them.
"""

import asyncio
import dataclasses
import json
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sim.maxtext_stages import HF_GENERATION_CONFIGS
from tpu_rl import manifests
from tpu_rl.config import RunConfig
from tpu_rl.layout import GcsLayout
from tpu_rl.run import RunIdentity
from tpu_rl.vocabulary import REPLICATED_JOB_LABEL
from tpu_rl_testing import SPARE_TOPOLOGY, spare_tpu_pool

pytestmark = pytest.mark.sim

REPO = Path(__file__).resolve().parents[2]
BUCKET = "tpu-rl-sim"
TPU_POOL = "tpu-v6e-64-np"


def sim_config(**overrides):
    params = {
        "project": "tpu-rl-sim",
        "region": "us-east5",
        "zone": "us-east5-b",
        "cluster_name": "tpu-rl-sim",
        "gcs_bucket": BUCKET,
        "cluster_mode": "existing",
        "kubernetes_conn_id": "tpu_rl_sim",
        "tpu_pool_mode": "existing",
        "num_batches": 6,
        "checkpoint_period": 4,
        # a unique model folder per test session, so runs never see each other's outputs
        "hf_model_path": f"Qwen/sim-{uuid.uuid4().hex[:6]}",
    }
    params.update(overrides)
    return RunConfig.from_params(params)


def new_run(sim, config, what):
    run = RunIdentity(dag_id="sim_tests", run_id=f"{what}-{uuid.uuid4().hex[:8]}")
    secret = manifests.hf_token_secret(config, run, token="hf_simulated_token_not_real")
    sim.core.create_namespaced_secret(config.namespace, secret)
    ensure_workload_account(sim.core, config)
    return run, GcsLayout(config, run)


def ensure_workload_account(core, config) -> None:
    """The workload pods' service account, as the hf_token_secret task creates it."""
    from kubernetes.client.exceptions import ApiException

    try:
        core.create_namespaced_service_account(config.namespace, manifests.workload_service_account(config))
    except ApiException as e:
        if e.status != 409:
            raise


def webhook_defaults(body):
    """(path, value) of every default JobSet v0.10.1's mutating webhook sets on this body."""
    spec, out = body["spec"], []
    if "successPolicy" not in spec:
        out.append((("spec", "successPolicy", "operator"), "All"))
    if "startupPolicy" not in spec:
        out.append((("spec", "startupPolicy", "startupPolicyOrder"), "AnyOrder"))
    for key in ("enableDNSHostnames", "publishNotReadyAddresses"):
        if key not in spec.get("network", {}):
            out.append((("spec", "network", key), True))
    for i, rjob in enumerate(spec["replicatedJobs"]):
        if "completionMode" not in rjob["template"]["spec"]:
            out.append((("spec", "replicatedJobs", i, "template", "spec", "completionMode"), "Indexed"))
        if "restartPolicy" not in rjob["template"]["spec"]["template"]["spec"]:
            out.append(
                (("spec", "replicatedJobs", i, "template", "spec", "template", "spec", "restartPolicy"), "OnFailure")
            )
    for i, rule in enumerate(spec.get("failurePolicy", {}).get("rules", [])):
        if "name" not in rule:
            out.append((("spec", "failurePolicy", "rules", i, "name"), f"failurePolicyRule{i}"))
    return out


def wait_slice_free(sim, timeout=600):
    def free():
        busy = [
            p
            for p in sim.core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items
            if (p.spec.node_name or "").startswith(f"gke-tpu-rl-sim-{TPU_POOL}-")
        ]
        return not busy

    sim.wait("no running pod on the TPU slice", free, timeout=timeout, interval=2)


def lookup(obj, path):
    for key in path:
        obj = obj[key]
    return obj


def completed(js):
    conditions = {c["type"]: c["status"] for c in js["status"].get("conditions", [])}
    return conditions.get("Completed") == "True"


@pytest.fixture(scope="module")
def config():
    return sim_config()


@pytest.fixture(scope="module")
def converted(sim, config):
    """Stage (a), run once for the module: a plain single-pod conversion JobSet on the CPU pool."""
    run, layout = new_run(sim, config, "convert")
    body = manifests.hf_to_maxtext_jobset(config, run)
    name = body["metadata"]["name"]
    sim.create_jobset(body)
    js = sim.wait_jobset(name)
    return {"run": run, "layout": layout, "jobset": js, "name": name}


def test_status_reports_every_component_healthy(sim):
    status = subprocess.run([REPO / "sim" / "status.sh"], capture_output=True, text=True)
    assert status.returncode == 0, status.stdout
    assert [line.split()[-1] for line in status.stdout.splitlines()[:8]] == ["healthy"] * 8


def test_a_fault_block_removes_only_the_rules_its_own_session_set(sim):
    """Two test sessions share the simulation (the main stack's and the 3.1.7 stack's): one's cleanup must not
    remove a rule the other set meanwhile, or that session's fault never strikes."""
    from sim import faults

    token = uuid.uuid4().hex[:6]
    mine, theirs = f"mine-{token}", f"theirs-{token}"
    try:
        with faults.rules_removed_after(sim.core):
            faults.set_fault(sim.core, mine, prefix=f"nothing-{token}")
            cli = [sys.executable, REPO / "sim/faults.py", "--kubeconfig", sim.kubeconfig]
            subprocess.run(
                [*cli, "set", theirs, "--prefix", f"nothing-{token}"],
                check=True,
                capture_output=True,
            )
            assert {mine, theirs} <= set(faults.list_faults(sim.core))
        left = set(faults.list_faults(sim.core))
        assert mine not in left and theirs in left
    finally:
        faults.clear_faults(sim.core, theirs)


def test_conversion_pod_completes_and_writes_a_committed_checkpoint(sim, converted):
    assert completed(converted["jobset"]), converted["jobset"]["status"]
    layout = converted["layout"]
    out = layout.uri(layout.converted_prefix)
    names = sim.names(out)
    assert "0/commit_success.txt" in names
    meta = json.loads(sim.read(out + "0/_CHECKPOINT_METADATA"))
    assert meta["commit_timestamp_nsecs"] and meta["custom_metadata"] == {"scan_layers": True}
    items = json.loads(sim.read(out + "0/items/_METADATA"))
    assert items["use_ocdbt"] is False and items["use_zarr3"] is False
    leaves = {".".join(k["key"] for k in leaf["key_metadata"]) for leaf in items["tree_metadata"].values()}
    assert leaves and all(f"0/items/{leaf}/.zarray" in names for leaf in leaves)
    # the pod's log is served through the API (kwok, from the emulator's Logs object)
    pod = sim.pods(converted["name"])[0]
    assert pod.spec.node_name.startswith("gke-tpu-rl-sim-cpu-np-")
    log = sim.core.read_namespaced_pod_log(pod.metadata.name, "default", container="workload-container")
    assert f"Conversion complete. Checkpoint saved to {out}0" in log


def test_pathways_jobset_is_admitted_placed_and_completes(sim, config, converted, faults_api):
    run, layout = new_run(sim, config, "train")
    body = manifests.training_jobset(config, run)
    name = body["metadata"]["name"]
    wait_slice_free(sim)  # the cluster is shared: another workload may hold the slice (exclusive placement)
    # the head runs 30 s, long enough to see all workers placed (they start after it: startup InOrder)
    faults_api.set_fault(sim.core, "slow-head", prefix=name, replicated_job="pathways-head", run_seconds=30)
    created = sim.create_jobset(body)
    for path, value in webhook_defaults(body):  # what JobSet's mutating webhook adds when absent
        assert lookup(created, path) == value, path

    def running_workers():
        return [
            p for p in sim.pods(name) if p.status.phase == "Running" and p.spec.containers[0].name == "pathways-worker"
        ]

    workers = sim.wait(
        "16 running Pathways workers", lambda: len(running_workers()) == 16 and running_workers(), timeout=60
    )
    nodes = {p.spec.node_name for p in workers}
    assert len(workers) == 16 and len(nodes) == 16, sorted(nodes)
    tpu_nodes = {
        n.metadata.name for n in sim.core.list_node(label_selector=f"cloud.google.com/gke-nodepool={TPU_POOL}").items
    }
    assert nodes == tpu_nodes
    # the real pod webhook's exclusive placement: affinities on the leader, the leader's pool on followers
    leader = next(p for p in workers if p.metadata.labels["batch.kubernetes.io/job-completion-index"] == "0")
    anti = leader.spec.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution
    assert [t.topology_key for t in anti] == ["cloud.google.com/gke-nodepool"]
    assert all(p.spec.node_selector["cloud.google.com/gke-nodepool"] == TPU_POOL for p in workers if p is not leader)
    head = [p for p in sim.pods(name) if p.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] == "pathways-head"]
    assert len(head) == 1
    head_node = sim.core.read_node(head[0].spec.node_name)
    assert head_node.metadata.labels["cloud.google.com/gke-nodepool"] == "cpu-np"

    js = sim.wait_jobset(name)
    assert completed(js), js["status"]
    assert js["status"].get("terminalState") == "Completed"

    actor = layout.uri(layout.actor_checkpoints_prefix)
    names = sim.names(actor)
    committed = sorted(int(n.split("/")[0]) for n in names if n.endswith("/commit_success.txt"))
    assert committed == [4, 6]  # every checkpoint_period (4) and the end-of-run save at 6 batches
    step = json.loads(sim.read(f"{actor}6/_CHECKPOINT_METADATA"))
    assert step["custom_metadata"] == {"global_step": 6} and step["commit_timestamp_nsecs"]
    assert {"6/model_params/_METADATA", "6/optimizer_state/_METADATA"} <= names
    assert any("/tensorboard/events.out.tfevents." in n for n in sim.names(layout.uri(layout.training_prefix)))


def test_a_pathways_head_waiting_for_its_workers_already_has_a_log(sim, config):
    """A running container has a log under a kubelet (its start line), never "no logs found": a trainer's
    follower that met that error backed off for up to 30 s and could miss a short-lived head's last lines."""
    run, _ = new_run(sim, config, "train")
    body = manifests.training_jobset(config, run)
    name = body["metadata"]["name"]
    for job in body["spec"]["replicatedJobs"]:
        spec = job["template"]["spec"]["template"]["spec"]
        if any(c["name"] == "pathways-worker" for c in spec["containers"]):  # workers that never get a node
            spec["nodeSelector"] = {**spec.get("nodeSelector", {}), "cloud.google.com/gke-nodepool": "no-such-pool"}
    sim.create_jobset(body)
    try:

        def head_log():
            heads = [p for p in sim.pods(name) if p.metadata.labels[REPLICATED_JOB_LABEL] == "pathways-head"]
            if not heads or heads[0].status.phase != "Running":
                return None
            try:
                pod = heads[0].metadata.name
                return sim.core.read_namespaced_pod_log(pod, "default", container="workload-container")
            except Exception:
                return None

        log = sim.wait("the waiting head's log", head_log, timeout=60)
        assert "[simulated] workload-container started on" in log and "python3 -m maxtext" not in log, log
    finally:
        sim.delete_jobset(name)


def test_export_writes_safetensors_shards_and_the_index_last(sim, config, converted):
    run, layout = new_run(sim, config, "export")
    # the export reads a trained checkpoint: train first, with the sim's defaults
    train = manifests.training_jobset(config, run)
    wait_slice_free(sim)
    sim.create_jobset(train)
    assert completed(sim.wait_jobset(train["metadata"]["name"]))
    attempt = layout.export_attempt_prefix(1)
    # Exported as a model of the Instruct weights (the sim's conversions use made-up names), whose repository has
    # a generation_config.json.
    exported = dataclasses.replace(config, hf_model_path="Qwen/Qwen3-30B-A3B-Instruct-2507")
    body = manifests.maxtext_to_hf_jobset(exported, run, 6, attempt)
    sim.create_jobset(body)
    assert completed(sim.wait_jobset(body["metadata"]["name"]))

    out = layout.uri(attempt)
    index = json.loads(sim.read(out + "model.safetensors.index.json"))
    shards = set(index["weight_map"].values())
    assert {"tokenizer.json", "tokenizer_config.json", "config.json", *shards} <= sim.names(out)
    assert json.loads(sim.read(out + "tokenizer_config.json"))["name_or_path"] == exported.hf_model_path
    # Not the converter's (MaxText 0.2.4 writes none): the export script's copy from the repository.
    generation_config = HF_GENERATION_CONFIGS[exported.hf_model_path.lower()]
    assert json.loads(sim.read(out + "generation_config.json")) == generation_config
    total = 0
    for shard in shards:
        data = sim.read(out + shard)
        header_len = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8 : 8 + header_len])
        end = max(t["data_offsets"][1] for k, t in header.items() if k != "__metadata__")
        assert 8 + header_len + end == len(data)
        total += end
    assert index["metadata"]["total_size"] == total


def test_failed_first_attempt_is_restarted_by_the_failure_policy(sim, config, converted, faults_api):
    """A sim-side fault (no change to the manifest) fails the first attempt; maxRestarts 1 restarts it."""
    run, layout = new_run(sim, config, "restart")
    body = manifests.hf_to_maxtext_jobset(config, run)
    name = body["metadata"]["name"]
    assert body["spec"]["failurePolicy"]["maxRestarts"] == 1
    faults_api.set_fault(sim.core, "first-attempt", prefix=name, fail_attempts=1, exit_code=3)
    sim.create_jobset(body)

    failed = sim.wait(
        "the first attempt's pod to fail", lambda: [p for p in sim.pods(name) if p.status.phase == "Failed"], timeout=60
    )
    assert failed[0].metadata.labels["jobset.sigs.k8s.io/restart-attempt"] == "0"
    assert failed[0].status.container_statuses[0].state.terminated.exit_code == 3
    js = sim.wait_jobset(name)
    assert completed(js), js["status"]
    assert js["status"]["restarts"] == 1
    # the rule matched both attempts; fail_attempts=1 failed only attempt 0
    applied = faults_api.list_faults(sim.core)["first-attempt"]["applied"]
    incarnation = js["metadata"]["uid"][:8]
    assert applied == [f"default/{name}@{incarnation}/attempt-0", f"default/{name}@{incarnation}/attempt-1"]


def test_pod_template_annotation_fails_the_jobset_with_the_exit_code(sim):
    """Faults can also be asked for in the manifest: sim.tpu-rl.dev/exit-code on the pod template."""
    name = f"sim-fail-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [
                {
                    "name": "main-job",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "backoffLimit": 0,
                            "completions": 1,
                            "parallelism": 1,
                            "template": {
                                "metadata": {
                                    "annotations": {"sim.tpu-rl.dev/exit-code": "7", "sim.tpu-rl.dev/run-seconds": "1"}
                                },
                                "spec": {
                                    "restartPolicy": "Never",
                                    "nodeSelector": {"cloud.google.com/gke-nodepool": "cpu-np"},
                                    "containers": [
                                        {
                                            "name": "workload-container",
                                            "image": "busybox",
                                            "command": ["/bin/bash", "-c", "exit 7"],
                                        }
                                    ],
                                },
                            },
                        }
                    },
                }
            ],
        },
    }
    sim.create_jobset(body)
    pod = sim.wait("the pod to fail", lambda: [p for p in sim.pods(name) if p.status.phase == "Failed"], timeout=60)[0]
    assert pod.status.container_statuses[0].state.terminated.exit_code == 7
    js = sim.wait_jobset(name)
    conditions = {c["type"]: c for c in js["status"]["conditions"]}
    assert conditions["Failed"]["status"] == "True", js["status"]
    assert js["status"].get("terminalState") == "Failed"


def committed_steps(sim, layout):
    actor = layout.uri(layout.actor_checkpoints_prefix)
    return sorted(int(n.split("/")[0]) for n in sim.names(actor) if n.endswith("/commit_success.txt"))


def test_training_that_stops_early_saves_its_last_step(sim, config, converted, faults_api):
    """stop-at-step: the run ends normally at step 5 of 6; the end-of-run save is actor/5."""
    run, layout = new_run(sim, config, "early")
    body = manifests.training_jobset(config, run)
    faults_api.set_fault(sim.core, "early", prefix=body["metadata"]["name"], maxtext_fault="stop-at-step=5")
    wait_slice_free(sim)
    sim.create_jobset(body)
    assert completed(sim.wait_jobset(body["metadata"]["name"]))
    assert committed_steps(sim, layout) == [4, 5]


def test_crashed_training_is_restarted_and_resumes_from_its_last_checkpoint(sim, converted, faults_api):
    """crash-at-step on the first attempt only: checkpoint 4 survives, the JobSet restart (maxRestarts 1)
    resumes from it and makes the end-of-run save at 6."""
    config = sim_config(max_restarts=1, hf_model_path=converted["layout"].config.hf_model_path)
    run, layout = new_run(sim, config, "crash")
    body = manifests.training_jobset(config, run)
    name = body["metadata"]["name"]
    faults_api.set_fault(sim.core, "crash", prefix=name, stage="train_rl", maxtext_fault="crash-at-step=5", times=1)
    wait_slice_free(sim)
    sim.create_jobset(body)
    js = sim.wait_jobset(name, timeout=180)
    assert completed(js), js["status"]
    assert js["status"]["restarts"] == 1
    assert committed_steps(sim, layout) == [4, 6]


@pytest.fixture
def spare_pool(sim):
    """Two extra TPU-like hosts in their own pool, so losing one never disturbs the shared slice."""
    with spare_tpu_pool(sim.core) as pool:
        yield pool


def two_host_jobset(name, pool):
    """Two long-running pods, one per host of `pool`, restarted once by the JobSet on failure."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "failurePolicy": {"maxRestarts": 1},
            "replicatedJobs": [
                {
                    "name": "main-job",
                    "template": {
                        "spec": {
                            "backoffLimit": 0,
                            "completions": 2,
                            "parallelism": 2,
                            "template": {
                                "metadata": {"annotations": {"sim.tpu-rl.dev/run-seconds": "600"}},
                                "spec": {
                                    "restartPolicy": "Never",
                                    "nodeSelector": {"cloud.google.com/gke-nodepool": pool},
                                    "affinity": {
                                        "podAntiAffinity": {
                                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                                {
                                                    "labelSelector": {
                                                        "matchLabels": {"jobset.sigs.k8s.io/jobset-name": name}
                                                    },
                                                    "topologyKey": "kubernetes.io/hostname",
                                                }
                                            ]
                                        }
                                    },
                                    "containers": [
                                        {
                                            "name": "workload-container",
                                            "image": "busybox",
                                            "command": ["sleep", "600"],
                                            "resources": {"limits": {"google.com/tpu": "4"}},
                                        }
                                    ],
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest.mark.parametrize(
    "how, reason, timeout",
    [
        ("evict", "DeletionByTaintManager", 30),  # NoExecute taint: a host going away for maintenance
        ("lose", "DeletionByPodGC", 120),  # Node deleted: pod GC acts after its 40 s quarantine
    ],
)
def test_lost_host_fails_its_pod_with_disruption_target_and_the_jobset_restarts(sim, spare_pool, how, reason, timeout):
    from sim import hosts

    pool, names = spare_pool
    name = f"sim-host-{uuid.uuid4().hex[:6]}"
    sim.create_jobset(two_host_jobset(name, pool))

    def running():
        return [p for p in sim.pods(name) if p.status.phase == "Running"]

    sim.wait("both pods running", lambda: len(running()) == 2, timeout=60)
    victim = next(p for p in running() if p.spec.node_name == names[1])
    getattr(hosts, how)(sim.core, names[1])
    # the pod lives on only briefly once disrupted: watch it from before the loss
    from kubernetes import watch

    condition = None
    for event in watch.Watch().stream(
        sim.core.list_namespaced_pod,
        "default",
        timeout_seconds=timeout,
        field_selector=f"metadata.name={victim.metadata.name}",
        resource_version=victim.metadata.resource_version,
    ):
        found = [c for c in event["object"].status.conditions or [] if c.type == "DisruptionTarget"]
        if found:
            condition = found[0]
            break
    assert condition is not None, f"no DisruptionTarget on {victim.metadata.name} within {timeout} s"
    assert condition.reason == reason
    sim.wait("the JobSet to restart", lambda: sim.get_jobset(name)["status"].get("restarts") == 1, timeout=30)

    # attempt 1: one pod runs on the surviving host; the lost host's pod cannot be placed until it is back
    def attempt1():
        return [p for p in sim.pods(name) if p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] == "1"]

    sim.wait(
        "attempt 1 with one pod running, one pending",
        lambda: sorted(p.status.phase for p in attempt1()) == ["Pending", "Running"],
        timeout=30,
    )
    sim.delete_jobset(name)


def test_the_watchdog_ends_a_stalled_training_and_deletes_its_jobset(sim, config, converted, faults_api, monkeypatch):
    """The trainer stalls after step 4 (``stall-at-step=4``: its saves and event file up to 4, then no step and no
    line, its pods still running). The package's JobSet trigger, watching its steps in the bucket and its log, ends
    the wait 20 s into the silence with the step, and deletes the JobSet: its pods free the slice. Before the
    watchdog, the wait (and the slice) went on until train_rl's 72-hour timeout. On a v6e-8 slice of its own (a
    spare pool's 2x4 hosts), so that the end-to-end scenarios beside it keep the standing slice."""
    from tpu_rl.hooks.kubernetes import ClusterTarget
    from tpu_rl.triggers.jobset import JobSetTrigger
    from tpu_rl.watchdog import STALL, Windows

    for key, value in sim.env.items():
        if key.startswith("AIRFLOW_CONN_"):
            monkeypatch.setenv(key, value)
    small = dataclasses.replace(
        config,
        tpu_type="v6e-8",
        topology=SPARE_TOPOLOGY,
        ici_tensor_parallelism=2,
        ici_expert_parallelism=2,
        rollout_tensor_parallelism=4,
    )
    assert small.problems() == []
    run, layout = new_run(sim, small, "stall")
    body = manifests.training_jobset(small, run)
    name = body["metadata"]["name"]
    faults_api.set_fault(sim.core, "stall", prefix=name, stage="train_rl", maxtext_fault="stall-at-step=4")
    with spare_tpu_pool(sim.core):
        uid = sim.create_jobset(body)["metadata"]["uid"]
        trigger = JobSetTrigger(
            name=name,
            namespace="default",
            uid=uid,
            log_replicated_job="pathways-head",
            log_container="workload-container",
            cluster=ClusterTarget(kubernetes_conn_id="tpu_rl_sim"),
            progress_interval=10,
            training={
                "bucket": BUCKET,
                "prefix": layout.tensorboard_prefix,
                "train_steps": small.train_steps,
                "gcp_conn_id": "google_cloud_default",
                "interval": 5,
            },
            watchdog=Windows(stall_seconds=20, first_step_seconds=300).to_dict(),
        )
        started = time.monotonic()
        event = asyncio.run(first_event(trigger)).payload
        assert time.monotonic() - started < 20 + 15 + 5 + 60  # the window, a look, a read of the steps, slack
        sim.wait("the JobSet gone", lambda: jobset_gone(sim, name), timeout=60)
    assert event["status"] == "stuck" and event["stuck"] == {"kind": STALL, "step": 4}
    assert f"JobSet default/{name} was deleted by the watchdog: the training stalled at step 4" in event["message"]
    assert committed_steps(sim, layout) == [4]  # what a retry resumes from


def jobset_gone(sim, name):
    from kubernetes.client.exceptions import ApiException

    try:
        sim.get_jobset(name)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


async def first_event(trigger):
    async for event in trigger.run():
        return event
    raise AssertionError("trigger ended without an event")
