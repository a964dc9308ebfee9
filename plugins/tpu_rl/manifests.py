"""Kubernetes objects of a run, as Python data: the JobSets of the three stages and the token Secret.

They reproduce what the tutorial's ``gcluster job submit`` renders (see the README for the deliberate
differences). Only fields JobSet v0.10.1 knows are emitted: that is what the GKE blueprint installs.
"""

from __future__ import annotations

from typing import Any

from tpu_rl import maxtext
from tpu_rl.config import RunConfig
from tpu_rl.run import GcsLayout, RunIdentity
from tpu_rl.vocabulary import (
    CONVERSION_JOB,
    COORDINATOR_LABEL,
    DEFAULT_POOL,
    EXCLUSIVE_TOPOLOGY,
    GCLUSTER_WORKLOAD_LABEL,
    HOSTNAME_LABEL,
    JOB_INDEX_LABEL,
    JOBSET_API,
    JOBSET_NAME_LABEL,
    KUEUE_QUEUE_NAME_LABEL,
    NODEPOOL_LABEL,
    PATHWAYS_HEAD,
    PATHWAYS_PROXY_CONTAINER,
    PATHWAYS_PROXY_PORT,
    PATHWAYS_RM_CONTAINER,
    PATHWAYS_RM_EXTRA_PORTS,
    PATHWAYS_RM_PORT,
    PATHWAYS_WORKER_CONTAINER,
    PATHWAYS_WORKER_EXTRA_PORTS,
    PATHWAYS_WORKER_JOB,
    PATHWAYS_WORKER_PORT,
    REPLICATED_JOB_LABEL,
    REPLICATED_JOB_REPLICAS_LABEL,
    TPU_ACCELERATOR_LABEL,
    TPU_RESOURCE,
    TPU_SLICE_TOPOLOGY_ANNOTATION,
    TPU_TAINT_KEY,
    TPU_TOPOLOGY_LABEL,
    WORKLOAD_CONTAINER,
)

HF_TOKEN_KEY = "HF_TOKEN"
#: The ``--env`` / ``--pathways-*-env`` values the tutorial sets on every container.
TUTORIAL_ENV = {"GRPC_DNS_RESOLVER": "native"}
PATHWAYS_ABSL_FLAGS = "--pathways_pipe_unreachable_timeout=60s"
#: Pod restarts a worker Job may spend per host before it fails (upstream: hosts x 4, 64 for 8x8).
WORKER_RESTARTS_PER_HOST = 4
#: Where a conversion pod keeps the downloaded Hugging Face files.
HF_CACHE_DIR = "/hf-cache"


def hf_token_secret(config: RunConfig, run: RunIdentity, token: str | None = None) -> dict[str, Any]:
    """The Secret the workloads read ``HF_TOKEN`` from. Without ``token`` (the plan) it carries no data."""
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": run.secret_name(), "namespace": config.namespace, "labels": run.labels()},
        "type": "Opaque",
    }
    if token is not None:
        secret["stringData"] = {HF_TOKEN_KEY: token}
    return secret


def hf_to_maxtext_jobset(config: RunConfig, run: RunIdentity) -> dict[str, Any]:
    command = maxtext.to_maxtext(config, GcsLayout(config, run))
    return _conversion_jobset(config, run, "hf_to_maxtext", command)


def maxtext_to_hf_jobset(config: RunConfig, run: RunIdentity, step: int, attempt_prefix: str) -> dict[str, Any]:
    command = maxtext.to_huggingface(config, GcsLayout(config, run), step, attempt_prefix)
    return _conversion_jobset(config, run, "maxtext_to_hf", command)


def training_jobset(config: RunConfig, run: RunIdentity) -> dict[str, Any]:
    """The Pathways JobSet of ``gcluster job submit --pathways``: a head on the CPU pool, workers on the slice."""
    layout = GcsLayout(config, run)
    name = run.jobset_name(config.workload_prefix, "train")
    scratch = layout.uri(layout.pathways_scratch_prefix)
    head_address = "$(PATHWAYS_HEAD)"
    pathways_env = [_env("ABSL_FLAGS", PATHWAYS_ABSL_FLAGS), *_tutorial_env(), _label_env("PATHWAYS_HEAD", COORDINATOR_LABEL)]
    proxy = {
        "name": PATHWAYS_PROXY_CONTAINER,
        "image": config.pathways_image("proxy_server"),
        "imagePullPolicy": "Always",
        "restartPolicy": "Always",
        "args": [
            f"--server_port={PATHWAYS_PROXY_PORT}",
            f"--resource_manager_address={head_address}:{PATHWAYS_RM_PORT}",
            f"--gcs_scratch_location={scratch}",
        ],
        "env": pathways_env,
        "ports": [{"containerPort": PATHWAYS_PROXY_PORT}],
        "resources": {"limits": {"cpu": "16", "memory": "100Gi"}},
    }
    resource_manager = {
        "name": PATHWAYS_RM_CONTAINER,
        "image": config.pathways_image("server"),
        "imagePullPolicy": "Always",
        "restartPolicy": "Always",
        "args": [
            f"--server_port={PATHWAYS_RM_PORT}",
            f"--gcs_scratch_location={scratch}",
            "--node_type=resource_manager",
            f"--instance_count={config.cluster_nodepool_count}",
            f"--instance_type={config.slice.pathways_instance_type}",
        ],
        "env": [
            *pathways_env,
            _env("TPU_SKIP_MDS_QUERY", "true"),
            _label_env("HOST_ADDRESS", COORDINATOR_LABEL),
            _label_env("JOBSET_NAME", JOBSET_NAME_LABEL),
            _label_env("REPLICATED_JOB_NAME", REPLICATED_JOB_LABEL),
        ],
        "ports": [{"containerPort": p} for p in (PATHWAYS_RM_PORT, *PATHWAYS_RM_EXTRA_PORTS)],
        "resources": {"limits": {"cpu": "8", "memory": "32Gi"}},
    }
    train = maxtext.train_rl(config, layout)
    workload = {
        "name": WORKLOAD_CONTAINER,
        "image": config.cloud_image_name,
        "imagePullPolicy": "Always",
        "securityContext": {"privileged": True},
        "command": ["/bin/bash", "-c", train.script()],
        "env": [
            _label_env("PATHWAYS_HEAD", COORDINATOR_LABEL),
            _env("JAX_PLATFORMS", "proxy"),
            _env("XCLOUD_ENVIRONMENT", "GCP"),
            _env("JAX_BACKEND_TARGET", f"grpc://{head_address}:{PATHWAYS_PROXY_PORT}"),
            _env("ABSL_FLAGS", PATHWAYS_ABSL_FLAGS),
            *_tutorial_env(),
            _secret_env(run),
        ],
        "resources": {"limits": {"cpu": "24", "memory": "100Gi"}, "requests": {"cpu": "2", "memory": "8Gi"}},
    }
    head_pod = {
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "restartPolicy": "Never",
        "nodeSelector": {NODEPOOL_LABEL: config.cpu_pool_name},
        "initContainers": [proxy, resource_manager],
        "containers": [workload],
    }
    worker_container = {
        "name": PATHWAYS_WORKER_CONTAINER,
        "image": config.pathways_image("server"),
        "imagePullPolicy": "Always",
        "args": [
            f"--server_port={PATHWAYS_WORKER_PORT}",
            f"--resource_manager_address={head_address}:{PATHWAYS_RM_PORT}",
            f"--gcs_scratch_location={scratch}",
        ],
        "env": [
            _env("XCLOUD_ENVIRONMENT", "GCP"),
            _env("MEGASCALE_GRPC_ENABLE_XOR_TRACER", "false"),
            _label_env("MEGASCALE_NUM_SLICES", REPLICATED_JOB_REPLICAS_LABEL),
            _label_env("MEGASCALE_SLICE_ID", JOB_INDEX_LABEL),
            _label_env("MEGASCALE_COORDINATOR_ADDRESS", COORDINATOR_LABEL),
            _label_env("PATHWAYS_HEAD", COORDINATOR_LABEL),
            _label_env("JOBSET_NAME", JOBSET_NAME_LABEL),
            _label_env("REPLICATED_JOB_NAME", REPLICATED_JOB_LABEL),
            # Cluster Toolkit sets it on all four Pathways containers (commit 7c70d2606).
            _env("ABSL_FLAGS", PATHWAYS_ABSL_FLAGS),
            *_tutorial_env(),
        ],
        "ports": [{"containerPort": p} for p in (PATHWAYS_WORKER_PORT, *PATHWAYS_WORKER_EXTRA_PORTS)],
        "resources": {"limits": {TPU_RESOURCE: str(config.slice.chips_per_host)}},
    }
    worker_pod = {
        **_tpu_placement(config, run),
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": 30,
        "containers": [worker_container],
    }
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": _metadata(config, run, name),
        "spec": {
            "ttlSecondsAfterFinished": config.ttl_seconds_after_finished,
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "coordinator": {"replicatedJob": PATHWAYS_HEAD},
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [PATHWAYS_HEAD]},
            "failurePolicy": _failure_policy(config.max_restarts, restart_strategy="Recreate"),
            "replicatedJobs": [
                _replicated_job(PATHWAYS_HEAD, 1, 1, 0, HOSTNAME_LABEL, head_pod),
                _replicated_job(
                    PATHWAYS_WORKER_JOB,
                    config.cluster_nodepool_count,
                    config.hosts_per_slice,
                    config.hosts_per_slice * WORKER_RESTARTS_PER_HOST,
                    NODEPOOL_LABEL,
                    worker_pod,
                    pod_annotations={TPU_SLICE_TOPOLOGY_ANNOTATION: config.topology},
                ),
            ],
        },
    }


def _conversion_jobset(
    config: RunConfig, run: RunIdentity, stage: str, command: maxtext.MaxTextCommand
) -> dict[str, Any]:
    """A plain JobSet: by default one pod on the CPU pool; with ``conversion_on_tpu`` the tutorial's job
    over the whole slice, where every host but index 0 exits at once."""
    name = run.jobset_name(config.workload_prefix, stage)
    container: dict[str, Any] = {
        "name": WORKLOAD_CONTAINER,
        "image": config.cloud_image_name,
        "imagePullPolicy": "Always",
        "command": ["/bin/bash", "-c", command.script(only_index_zero=config.conversion_on_tpu)],
        "env": [*_tutorial_env(), _secret_env(run)],
    }
    metadata = _metadata(config, run, name)
    if config.conversion_on_tpu:
        container["securityContext"] = {"privileged": True}
        container["resources"] = {"limits": {TPU_RESOURCE: str(config.slice.chips_per_host)}}
        pod = {**_tpu_placement(config, run), "restartPolicy": "Never", "terminationGracePeriodSeconds": 30}
        hosts, pod_annotations = config.hosts_per_slice, {TPU_SLICE_TOPOLOGY_ANNOTATION: config.topology}
        metadata["annotations"] = {EXCLUSIVE_TOPOLOGY: NODEPOOL_LABEL}
    else:
        container["env"].append(_env("HF_HOME", HF_CACHE_DIR))
        container["volumeMounts"] = [{"name": "hf-cache", "mountPath": HF_CACHE_DIR}]
        resources = {"cpu": config.conversion_cpu, "memory": config.conversion_memory}
        container["resources"] = {"requests": resources, "limits": dict(resources)}
        pod = {
            # As the Pathways head on the same pool: with hostNetwork the pod reaches Cloud Storage as the
            # node's service account; without it, on GKE_METADATA nodes, it would act as its Kubernetes
            # service account's Workload Identity principal, which has no bucket access (403).
            "hostNetwork": True,
            "dnsPolicy": "ClusterFirstWithHostNet",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "nodeSelector": {NODEPOOL_LABEL: config.cpu_pool_name},
            "volumes": [{"name": "hf-cache", "emptyDir": {}}],
        }
        hosts, pod_annotations = 1, {}
    pod["containers"] = [container]
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "ttlSecondsAfterFinished": config.ttl_seconds_after_finished,
            "failurePolicy": _failure_policy(1),
            "replicatedJobs": [
                _replicated_job(CONVERSION_JOB, 1, hosts, 0, None, pod, pod_annotations=pod_annotations)
            ],
        },
    }


def _metadata(config: RunConfig, run: RunIdentity, name: str) -> dict[str, Any]:
    labels = {GCLUSTER_WORKLOAD_LABEL: name, **run.labels()}
    if config.kueue_queue_name:
        labels[KUEUE_QUEUE_NAME_LABEL] = config.kueue_queue_name
    return {"name": name, "namespace": config.namespace, "labels": labels}


def _failure_policy(max_restarts: int, restart_strategy: str | None = None) -> dict[str, Any]:
    policy: dict[str, Any] = {"maxRestarts": max_restarts}
    if restart_strategy:
        policy["restartStrategy"] = restart_strategy
    policy["rules"] = [{"name": "FailJobSetOnPodFailurePolicy", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]
    return policy


def _replicated_job(
    name: str,
    replicas: int,
    hosts: int,
    backoff_limit: int,
    exclusive_topology: str | None,
    pod_spec: dict[str, Any],
    pod_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    template: dict[str, Any] = {
        "spec": {
            "backoffLimit": backoff_limit,
            "completionMode": "Indexed",
            "parallelism": hosts,
            "completions": hosts,
            "template": {"metadata": {"annotations": pod_annotations or {}}, "spec": pod_spec},
        }
    }
    if exclusive_topology:
        template["metadata"] = {"annotations": {EXCLUSIVE_TOPOLOGY: exclusive_topology}}
    return {"name": name, "replicas": replicas, "template": template}


def _tpu_placement(config: RunConfig, run: RunIdentity) -> dict[str, Any]:
    """Scheduling of a TPU pod: the slice's accelerator and topology, never the default pool, and, when the
    run made its own node pools, only those (another run's slice may have the same shape)."""
    expressions = [{"key": NODEPOOL_LABEL, "operator": "NotIn", "values": [DEFAULT_POOL]}]
    if config.tpu_pools_per_run:
        pools = [run.tpu_pool_name(i) for i in range(config.cluster_nodepool_count)]
        expressions.append({"key": NODEPOOL_LABEL, "operator": "In", "values": pools})
    return {
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "nodeSelector": {
            TPU_ACCELERATOR_LABEL: config.slice.generation.accelerator,
            TPU_TOPOLOGY_LABEL: config.topology,
        },
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
            }
        },
        "tolerations": [{"key": TPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
    }


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _tutorial_env() -> list[dict[str, Any]]:
    return [_env(k, v) for k, v in TUTORIAL_ENV.items()]


def _label_env(name: str, label: str) -> dict[str, Any]:
    """An env var set from one of the pod's labels (the JobSet controller's)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}


def _secret_env(run: RunIdentity) -> dict[str, Any]:
    return {"name": HF_TOKEN_KEY, "valueFrom": {"secretKeyRef": {"name": run.secret_name(), "key": HF_TOKEN_KEY}}}
