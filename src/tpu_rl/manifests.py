"""Kubernetes objects of a run, as Python data: the JobSets of the three stages and the token Secret.

They reproduce what the tutorial's ``gcluster job submit`` renders (docs/explanation/tutorial-differences.md has the
deliberate differences). Only fields JobSet v0.10.1 knows are emitted: that is what the GKE blueprint installs.

The training JobSet is composed of named builders (head pod: proxy and resource-manager sidecars and the
trainer; worker pod), each made of small typed pieces (``_container``, ``_host_network``,
``_tpu_placement``, the env helpers), as the cncf provider's pod operator composes its pod. The names,
labels and ports come from :mod:`tpu_rl.vocabulary`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpu_rl import maxtext
from tpu_rl.config import RunConfig
from tpu_rl.layout import GcsLayout
from tpu_rl.run import RunIdentity
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
    WORKLOAD_SERVICE_ACCOUNT,
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
        "metadata": {
            "name": run.secret_name(),
            "namespace": config.namespace,
            "labels": run.labels(),
            "annotations": run.annotations(),
        },
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
    program = _env(maxtext.COPY_GENERATION_CONFIG_ENV, maxtext.COPY_GENERATION_CONFIG_PROGRAM)
    return _conversion_jobset(config, run, "maxtext_to_hf", command, env=[program])


def training_jobset(config: RunConfig, run: RunIdentity) -> dict[str, Any]:
    """The Pathways JobSet of ``gcluster job submit --pathways``: a head on the CPU pool, workers on the slice."""
    wiring = PathwaysWiring.of(GcsLayout(config, run))
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": _metadata(config, run, run.jobset_name(config.workload_prefix, "train")),
        "spec": {
            "ttlSecondsAfterFinished": config.ttl_seconds_after_finished,
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "coordinator": {"replicatedJob": PATHWAYS_HEAD},
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [PATHWAYS_HEAD]},
            "failurePolicy": _failure_policy(config.max_restarts, restart_strategy="Recreate"),
            "replicatedJobs": [
                _replicated_job(PATHWAYS_HEAD, 1, 1, 0, HOSTNAME_LABEL, pathways_head_pod(config, run, wiring)),
                _replicated_job(
                    PATHWAYS_WORKER_JOB,
                    config.cluster_nodepool_count,
                    config.hosts_per_slice,
                    config.hosts_per_slice * WORKER_RESTARTS_PER_HOST,
                    NODEPOOL_LABEL,
                    pathways_worker_pod(config, run, wiring),
                    pod_annotations={TPU_SLICE_TOPOLOGY_ANNOTATION: config.topology},
                ),
            ],
        },
    }


@dataclass(frozen=True)
class PathwaysWiring:
    """What the Pathways containers of one JobSet share: the head's address (the coordinator's, which each
    container reads from its pod's label into ``$(PATHWAYS_HEAD)``) and the run's Cloud Storage scratch."""

    scratch: str
    head_address: str = "$(PATHWAYS_HEAD)"

    @classmethod
    def of(cls, layout: GcsLayout) -> PathwaysWiring:
        return cls(scratch=layout.uri(layout.pathways_scratch_prefix))

    @property
    def resource_manager_address(self) -> str:
        return f"{self.head_address}:{PATHWAYS_RM_PORT}"

    @property
    def proxy_target(self) -> str:
        """The trainer's ``JAX_BACKEND_TARGET``."""
        return f"grpc://{self.head_address}:{PATHWAYS_PROXY_PORT}"

    def server_args(self, port: int) -> list[str]:
        """Arguments of a Pathways server that registers with the resource manager (proxy, worker)."""
        return [
            f"--server_port={port}",
            f"--resource_manager_address={self.resource_manager_address}",
            f"--gcs_scratch_location={self.scratch}",
        ]

    def sidecar_env(self) -> list[dict[str, Any]]:
        """The env of the head's two sidecars."""
        return [
            _env("ABSL_FLAGS", PATHWAYS_ABSL_FLAGS),
            *_tutorial_env(),
            _label_env("PATHWAYS_HEAD", COORDINATOR_LABEL),
        ]


def pathways_proxy_container(config: RunConfig, wiring: PathwaysWiring) -> dict[str, Any]:
    """The proxy the trainer's JAX talks to: a sidecar of the head."""
    return _container(
        PATHWAYS_PROXY_CONTAINER,
        config.pathways_image("proxy_server"),
        sidecar=True,
        args=wiring.server_args(PATHWAYS_PROXY_PORT),
        env=wiring.sidecar_env(),
        ports=[PATHWAYS_PROXY_PORT],
        limits={"cpu": "16", "memory": "100Gi"},
    )


def pathways_resource_manager_container(config: RunConfig, wiring: PathwaysWiring) -> dict[str, Any]:
    """The resource manager the proxy and every worker register with: a sidecar of the head."""
    return _container(
        PATHWAYS_RM_CONTAINER,
        config.pathways_image("server"),
        sidecar=True,
        args=[
            f"--server_port={PATHWAYS_RM_PORT}",
            f"--gcs_scratch_location={wiring.scratch}",
            "--node_type=resource_manager",
            f"--instance_count={config.cluster_nodepool_count}",
            f"--instance_type={config.slice.pathways_instance_type}",
        ],
        env=[
            *wiring.sidecar_env(),
            _env("TPU_SKIP_MDS_QUERY", "true"),
            _label_env("HOST_ADDRESS", COORDINATOR_LABEL),
            _label_env("JOBSET_NAME", JOBSET_NAME_LABEL),
            _label_env("REPLICATED_JOB_NAME", REPLICATED_JOB_LABEL),
        ],
        ports=[PATHWAYS_RM_PORT, *PATHWAYS_RM_EXTRA_PORTS],
        limits={"cpu": "8", "memory": "32Gi"},
    )


def pathways_trainer_container(config: RunConfig, run: RunIdentity, wiring: PathwaysWiring) -> dict[str, Any]:
    """The workload container of the head: ``train_rl``, whose JAX runs on the slice through the proxy."""
    return _container(
        WORKLOAD_CONTAINER,
        config.cloud_image_name,
        privileged=True,
        command=["/bin/bash", "-c", maxtext.train_rl(config, GcsLayout(config, run)).script()],
        env=[
            _label_env("PATHWAYS_HEAD", COORDINATOR_LABEL),
            _env("JAX_PLATFORMS", "proxy"),
            _env("XCLOUD_ENVIRONMENT", "GCP"),
            _env("JAX_BACKEND_TARGET", wiring.proxy_target),
            _env("ABSL_FLAGS", PATHWAYS_ABSL_FLAGS),
            *_tutorial_env(),
            _secret_env(run),
        ],
        limits={"cpu": "24", "memory": "100Gi"},
        requests={"cpu": "2", "memory": "8Gi"},
    )


def pathways_head_pod(config: RunConfig, run: RunIdentity, wiring: PathwaysWiring) -> dict[str, Any]:
    """The head pod on the CPU pool: proxy and resource manager as sidecars, the trainer as its workload."""
    return {
        **_pod_identity(),
        "restartPolicy": "Never",
        "nodeSelector": {NODEPOOL_LABEL: config.cpu_pool_name},
        "initContainers": [
            pathways_proxy_container(config, wiring),
            pathways_resource_manager_container(config, wiring),
        ],
        "containers": [pathways_trainer_container(config, run, wiring)],
    }


def pathways_worker_container(config: RunConfig, wiring: PathwaysWiring) -> dict[str, Any]:
    """One TPU host's Pathways server, holding all the host's chips."""
    return _container(
        PATHWAYS_WORKER_CONTAINER,
        config.pathways_image("server"),
        args=wiring.server_args(PATHWAYS_WORKER_PORT),
        env=[
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
        ports=[PATHWAYS_WORKER_PORT, *PATHWAYS_WORKER_EXTRA_PORTS],
        limits={TPU_RESOURCE: str(config.slice.chips_per_host)},
    )


def pathways_worker_pod(config: RunConfig, run: RunIdentity, wiring: PathwaysWiring) -> dict[str, Any]:
    """A worker pod on one host of the slice; a failed worker restarts in place (the head waits for it)."""
    return {
        **_tpu_placement(config, run),
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": 30,
        "containers": [pathways_worker_container(config, wiring)],
    }


def _container(
    name: str,
    image: str,
    *,
    env: list[dict[str, Any]],
    limits: dict[str, str],
    requests: dict[str, str] | None = None,
    sidecar: bool = False,
    privileged: bool = False,
    command: list[str] | None = None,
    args: list[str] | None = None,
    ports: Sequence[int] = (),
) -> dict[str, Any]:
    """A container, its fields in the order ``gcluster`` renders them. ``sidecar``: an init container that
    keeps running beside the main one (``restartPolicy: Always``)."""
    container: dict[str, Any] = {"name": name, "image": image, "imagePullPolicy": "Always"}
    if sidecar:
        container["restartPolicy"] = "Always"
    if privileged:
        container["securityContext"] = {"privileged": True}
    if command:
        container["command"] = command
    if args:
        container["args"] = args
    container["env"] = env
    if ports:
        container["ports"] = [{"containerPort": p} for p in ports]
    container["resources"] = {"limits": limits, **({"requests": requests} if requests else {})}
    return container


def _pod_identity() -> dict[str, Any]:
    """Who every workload pod (conversions, Pathways head and workers) is. It uses the node's network, so it
    reaches Cloud Storage as the node's service account; without it, on GKE_METADATA nodes, it would act as
    its Kubernetes service account's Workload Identity principal, which has no bucket access (403). That
    service account is the package's own, without an API token: the workloads never call Kubernetes."""
    return {
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "serviceAccountName": WORKLOAD_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
    }


def workload_service_account(config: RunConfig) -> dict[str, Any]:
    """The service account of the workload pods, in the run's namespace (shared by runs; never deleted)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": WORKLOAD_SERVICE_ACCOUNT,
            "namespace": config.namespace,
            "labels": {"app.kubernetes.io/managed-by": "tpu-rl"},
        },
        "automountServiceAccountToken": False,
    }


def _conversion_jobset(
    config: RunConfig,
    run: RunIdentity,
    stage: str,
    command: maxtext.MaxTextCommand,
    env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A plain JobSet: by default one pod on the CPU pool; with ``conversion_on_tpu`` the tutorial's job
    over the whole slice, where every host but index 0 exits at once. ``env``: more variables of its container."""
    name = run.jobset_name(config.workload_prefix, stage)
    container: dict[str, Any] = {
        "name": WORKLOAD_CONTAINER,
        "image": config.cloud_image_name,
        "imagePullPolicy": "Always",
        "command": ["/bin/bash", "-c", command.script(only_index_zero=config.conversion_on_tpu)],
        "env": [*_tutorial_env(), _secret_env(run), *(env or [])],
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
        # The download goes to the emptyDir on the node's boot disk: ask for it, so that the pod goes to a node
        # with the room (a default 100 GB boot disk leaves pods about 44 GiB) instead of being evicted half-way.
        disk = f"{config.conversion_disk_gib}Gi"
        resources = {"cpu": config.conversion_cpu, "memory": config.conversion_memory, "ephemeral-storage": disk}
        container["resources"] = {"requests": resources, "limits": dict(resources)}
        pod = {
            **_pod_identity(),  # as the Pathways head on the same pool
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "nodeSelector": {NODEPOOL_LABEL: config.cpu_pool_name},
            "volumes": [{"name": "hf-cache", "emptyDir": {"sizeLimit": disk}}],
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
    policy["rules"] = [
        {"name": "FailJobSetOnPodFailurePolicy", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
    ]
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
        **_pod_identity(),
        "nodeSelector": {
            TPU_ACCELERATOR_LABEL: config.slice.generation.accelerator,
            TPU_TOPOLOGY_LABEL: config.topology,
        },
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": expressions}]
                }
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
