"""Stages before the workloads: validate the params, prove the triggerer, the bucket, what the cluster must
run, the token."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

from tpu_rl import __version__
from tpu_rl.compat import AirflowException, AirflowFailException
from tpu_rl.config import ConfigError
from tpu_rl.config_rules import conversion_fit_problems
from tpu_rl.hub_datasets import data_resolution
from tpu_rl.jobset_release import CONTROLLER_DEPLOYMENT, CONTROLLER_NAMESPACE, describe, release_objects
from tpu_rl.machines import SHAPES, pod_disk_gib, quantity_cpu, quantity_gib
from tpu_rl.manifests import hf_token_secret, workload_service_account
from tpu_rl.run_scope import RunScoped
from tpu_rl.training_metrics import gate_resolution
from tpu_rl.triggers.triggerer import TriggererCheckTrigger
from tpu_rl.vocabulary import JOBSET_CRD, KUEUE_GROUP, KUEUE_LOCALQUEUES, KUEUE_VERSION, NODEPOOL_LABEL, TPU_RESOURCE


class ValidateRunConfigOperator(RunScoped, BaseOperator):
    """Fails the run, without retries, on params that cannot work; before anything is created."""

    ui_color = "#e8f4fd"

    def execute(self, context: Any) -> None:
        scope = self.bind_scope(context)
        try:
            config = scope.config
        except ConfigError as error:
            raise AirflowFailException(str(error)) from None
        layout = scope.layout
        self.log.info(
            "%s on %s x %d slice(s): %d chips on %d hosts per slice (%s); trainer %g / sampler %g devices",
            config.model_name,
            config.tpu_type,
            config.cluster_nodepool_count,
            config.chips,
            config.hosts_per_slice,
            config.slice.pathways_instance_type,
            config.trainer_devices,
            config.sampler_devices,
        )
        self.log.info("base checkpoint: %s", layout.uri(layout.converted_prefix))
        self.log.info("training output: %s", layout.uri(layout.training_prefix))
        self.log.info("Hugging Face export: %s", layout.uri(layout.export_prefix))
        if resolution := gate_resolution(config):
            self.log.warning("Quality gate: %s", resolution)
        if resolution := data_resolution(config):
            self.log.warning("Training data: %s", resolution)


class TriggererCheckOperator(BaseOperator):
    """Defers once on the package's own trigger, before anything billable exists.

    Every later wait (GKE operations, the training, the checkpoints) runs in the triggerer, which must import
    this package and what its triggers import when they run (the Google and Kubernetes providers' hooks, their
    clients, aiohttp). Where it cannot (Cloud Composer 3 with the package in plugins/, which the triggerer never
    gets; a dependency missing there), the first such wait would fail after a cluster or a TPU slice was already
    asked for; here the run fails first, naming the module and the fix. A triggerer that never picks the trigger
    up (none runs) fails it at ``timeout``. A triggerer that runs another version than the worker that deferred
    fails it too: a trigger serialised by one version and run by another may not mean the same thing. What it
    proves is about the one triggerer that ran the trigger, at that moment: not the others, nor a later upgrade.
    """

    ui_color = "#e8f4fd"
    INSTALL_FIX = (
        "install the distribution tpu-rl in every Airflow component (scheduler, DAG processor, workers, "
        "triggerer, API server): on Cloud Composer 3 as a custom PyPI package (make deploy-composer "
        "builds the wheel, uploads it and installs it; docs/getting-started/composer.md), not in plugins/, which "
        "Composer 3 "
        "gives to neither the scheduler nor the triggerer"
    )
    DEPENDENCY_FIX = (
        "install tpu-rl with its dependencies (pyproject.toml: the Google and Kubernetes providers, "
        "kubernetes_asyncio, aiohttp, ...) in the triggerer as in the workers: pip installs them with the "
        "distribution; on Cloud Composer 3 they come with the image: look in the environment's PyPI packages for "
        "one that pins another version of them"
    )

    def __init__(self, *, timeout: timedelta = timedelta(minutes=10), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timeout = timeout

    def execute(self, context: Any) -> None:
        self.log.info("tpu-rl %s on this worker: deferring once to prove the triggerer imports it", __version__)
        self.defer(
            trigger=TriggererCheckTrigger(sent_by=__version__), method_name="execute_complete", timeout=self.timeout
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> None:
        # An event of 2.4.0's trigger (a triggerer not yet upgraded) names neither the deferring version nor imports.
        deferred_by = event.get("deferred_by", __version__)
        if event["version"] != deferred_by:
            raise AirflowFailException(
                f"the triggerer ({event['host']}) runs tpu-rl {event['version']}, the worker that deferred this "
                f"task {deferred_by}: install the same version everywhere (on Cloud Composer, one "
                "--update-pypi-package updates every component together), then clear this task"
            )
        if failed := event.get("failed"):
            causes = "; ".join(f"{failure['module']} ({failure['error']})" for failure in failed)
            raise AirflowFailException(
                f"the triggerer ({event['host']}) runs tpu-rl {event['version']} but cannot import what its "
                f"triggers import: {causes}: {self.DEPENDENCY_FIX}. Nothing was created."
            )
        if deferred_by != __version__:
            self.log.warning(
                "this worker runs tpu-rl %s, the one that deferred %s: the environment was updated meanwhile",
                __version__,
                deferred_by,
            )
        self.log.info(
            "the triggerer (%s) runs tpu-rl %s, as the worker that deferred, and imported the %d modules of its "
            "triggers",
            event["host"],
            event["version"],
            len(event.get("imported", [])),
        )

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Any) -> Any:
        """Airflow resumes the task with ``__fail__`` when the triggerer failed the trigger or it timed out."""
        if next_method != "__fail__":
            return super().resume_execution(next_method, next_kwargs, context)
        next_kwargs = next_kwargs or {}
        if next_kwargs.get("error") == "Trigger timeout":  # TriggerFailureReason.TRIGGER_TIMEOUT (a str enum)
            raise AirflowFailException(
                f"no triggerer ran this task's trigger within {self.timeout}: every wait of the pipeline is "
                "deferred, so the environment needs a running triggerer (Cloud Composer: --triggerer-count 1 or "
                "more; docs/getting-started/composer.md). Nothing was created."
            )
        traceback = next_kwargs.get("traceback") or []
        cause = next((line.strip() for line in reversed(traceback) if line.strip()), str(next_kwargs.get("error")))
        raise AirflowFailException(
            f"the triggerer cannot run this package's trigger ({cause}): {self.INSTALL_FIX}. Nothing was created."
        )


class EnsureBucketOperator(RunScoped, BaseOperator):
    """Creates the bucket in the run's region unless it exists (a 409 is success)."""

    def execute(self, context: Any) -> None:
        from airflow.providers.google.cloud.operators.gcs import GCSCreateBucketOperator

        config = self.bind_scope(context).config
        GCSCreateBucketOperator(
            task_id=self.task_id,
            bucket_name=config.gcs_bucket,
            location=config.region,
            project_id=config.project,
            gcp_conn_id=config.gcp_conn_id,
        ).execute(context)


class EnsureJobSetOperator(RunScoped, BaseOperator):
    """Makes sure the cluster can run the workloads: JobSet installed and admitting JobSets (installs the
    release shipped with the package when absent, repairs a half-finished install), a CPU pool node big
    enough for a conversion pod, and, when a Kueue queue is configured, its LocalQueue.

    :param install_timeout: how long a fresh install may take to admit its first JobSet.
    """

    def __init__(self, *, install_timeout: timedelta = timedelta(minutes=10), poll_interval: float = 5, **kwargs: Any):
        super().__init__(**kwargs)
        self.install_timeout = install_timeout
        self.poll_interval = poll_interval

    def execute(self, context: Any) -> None:
        scope = self.bind_scope(context)
        config = scope.config
        hook = scope.kubernetes
        versions = hook.crd_served_versions(JOBSET_CRD)
        problem = hook.jobset_admission_problem(config.namespace) if versions else None
        if versions and problem is None:
            self.log.info("JobSet is installed and admits JobSets (CRD versions %s): nothing to install", versions)
        else:
            if versions:
                self.log.warning("JobSet is installed only in part (%s): repairing it", problem)
            self._install(hook, config.jobset_version, config.namespace)
        if not config.conversion_on_tpu:
            self._check_cpu_pool(hook, config, None if config.kubernetes_conn_id else scope.gke)
        if config.kueue_queue_name:
            self._check_local_queue(hook, config)

    def _install(self, hook: Any, version: str, namespace: str) -> None:
        objects = release_objects(version)
        self.log.info("Applying the JobSet %s release shipped with the package (%d objects)", version, len(objects))
        for obj in objects:
            hook.apply(obj)
            self.log.info("  applied %s", describe(obj))
        deadline = time.monotonic() + self.install_timeout.total_seconds()
        while problem := (
            hook.deployment_problem(CONTROLLER_DEPLOYMENT, CONTROLLER_NAMESPACE)
            or hook.jobset_admission_problem(namespace)
        ):
            if time.monotonic() > deadline:
                raise AirflowException(
                    f"JobSet {version} was applied but does not admit JobSets after "
                    f"{self.install_timeout}: {problem}. A retry re-applies the release."
                )
            self.log.info("Waiting for JobSet: %s", problem)
            time.sleep(self.poll_interval)
        self.log.info("JobSet %s is installed: its controller is Available and its webhooks default a JobSet", version)

    def _check_cpu_pool(self, hook: Any, config: Any, gke: Any = None) -> None:
        """A conversion pod that fits no node of the CPU pool would stay Pending for ever: fail now. ``gke``: the
        cluster's GKE hook, to read a pool that has no node now (it autoscales from 0, as Cluster Toolkit's)."""
        room = self._cpu_pool_room(hook, config, gke)
        if room is None:
            return
        cpu, memory, disk, where = room
        for problem in conversion_fit_problems(
            config, cpu, memory, where=where, larger="use a pool of larger machines"
        ):
            raise AirflowFailException(str(problem))
        if disk < config.conversion_disk_gib:
            raise AirflowFailException(
                f"cpu_pool_name: the conversion downloads {config.model_name} to the node's disk and asks for "
                f"{config.conversion_disk_gib}Gi of it, and the CPU pool '{config.cpu_pool_name}' leaves at most "
                f"{disk:.0f}Gi of a node's disk to pods; fix: "
                f"give the pool a larger boot disk (e.g. gcloud container node-pools create ... --disk-size "
                f"{config.cpu_pool_disk_gb}), or name another pool"
            )

    def _cpu_pool_room(self, hook: Any, config: Any, gke: Any) -> tuple[float, float, float, str] | None:
        """(CPUs, GiB of memory, GiB of disk) a node of the CPU pool leaves to pods, and how to name that node: its
        largest node's allocatable, or, with no node now, what GKE would give a node of its machine type and boot
        disk. None when neither is known."""
        name = config.cpu_pool_name
        nodes = hook.list_nodes(f"{NODEPOOL_LABEL}={name}")
        if nodes:
            memory = max(quantity_gib(n.status.allocatable["memory"]) for n in nodes)
            cpu = max(quantity_cpu(n.status.allocatable["cpu"]) for n in nodes)
            disk = max(quantity_gib(n.status.allocatable.get("ephemeral-storage", "0")) for n in nodes)
            self.log.info(
                "CPU pool %s: largest node leaves %.1fGi, %.2f CPUs and %.0fGi of local disk to pods",
                name,
                memory,
                cpu,
                disk,
            )
            return cpu, memory, disk, f"any node of the CPU pool '{name}'"
        pool = self._gke_pool(gke, config) if gke is not None else None
        shape = SHAPES.get(pool.config.machine_type) if pool is not None else None
        if shape is None:
            self.log.info("The CPU pool %s has no node now, and its machine type is not known: not checked", name)
            return None
        self.log.info(
            "The CPU pool %s has no node now (it scales from 0): checked as GKE makes a node of it (%s, %d GB disk)",
            name,
            pool.config.machine_type,
            pool.config.disk_size_gb,
        )
        where = f"a node of the CPU pool '{name}' ({pool.config.machine_type}, {pool.config.disk_size_gb} GB disk)"
        return shape.allocatable_cpu, shape.allocatable_memory_gib, pod_disk_gib(pool.config.disk_size_gb), where

    @staticmethod
    def _gke_pool(gke: Any, config: Any) -> Any:
        """The CPU pool as GKE has it; a pool the cluster lacks fails the run (its pods would wait for ever)."""
        from google.api_core.exceptions import NotFound

        try:
            return gke.get_node_pool(config.cluster_name, config.cpu_pool_name)
        except NotFound:
            raise AirflowFailException(
                f"cpu_pool_name: the cluster {config.cluster_name} has no node pool '{config.cpu_pool_name}', which "
                "the conversions and the Pathways head select; fix: name one of its CPU pools"
            ) from None

    def _check_local_queue(self, hook: Any, config: Any) -> None:
        if not hook.has_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, KUEUE_LOCALQUEUES, config.kueue_queue_name, config.namespace
        ):
            raise AirflowFailException(
                f"kueue_queue_name: no Kueue LocalQueue '{config.kueue_queue_name}' in namespace "
                f"'{config.namespace}'; fix: install Kueue with a ClusterQueue covering {TPU_RESOURCE}, cpu and "
                "memory and create the LocalQueue, or clear kueue_queue_name."
            )


class CreateHfTokenSecretOperator(RunScoped, BaseOperator):
    """Copies the Hugging Face token from its Airflow connection into the run's Kubernetes Secret, and makes
    sure the workloads' service account exists in the namespace. The token never reaches a log, an XCom
    or a rendered template."""

    def execute(self, context: Any) -> None:
        from airflow.sdk import BaseHook

        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        token = BaseHook.get_connection(config.hf_token_conn_id).password
        if not token:
            raise AirflowFailException(
                f"hf_token_conn_id: connection '{config.hf_token_conn_id}' has no password; fix: store the "
                "Hugging Face token in the connection's password field."
            )
        secret = hf_token_secret(config, run, token)
        hook = scope.kubernetes
        account = workload_service_account(config)
        if hook.create_service_account(account, config.namespace):
            self.log.info(
                "Created ServiceAccount %s/%s for the workloads", config.namespace, account["metadata"]["name"]
            )
        created = hook.put_secret(secret, config.namespace)
        self.log.info(
            "%s Secret %s/%s from connection '%s'",
            "Created" if created else "Updated",
            config.namespace,
            secret["metadata"]["name"],
            config.hf_token_conn_id,
        )
