"""Stages before the workloads: validate the params, the bucket, what the cluster must run, the token."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from tpu_rl.config import ConfigError
from tpu_rl.run_context import config_of, layout_of, run_of

JOBSET_CRD = "jobsets.jobset.x-k8s.io"
JOBSET_MANIFESTS_URL = "https://github.com/kubernetes-sigs/jobset/releases/download/{version}/manifests.yaml"
LOCALQUEUE_GROUP, LOCALQUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"


class ValidateRunConfigOperator(BaseOperator):
    """Fails the run, without retries, on params that cannot work; before anything is created."""

    ui_color = "#e8f4fd"

    def execute(self, context: Any) -> None:
        from airflow.exceptions import AirflowFailException

        try:
            config = config_of(context)
        except ConfigError as error:
            raise AirflowFailException(str(error)) from None
        layout = layout_of(context)
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


class EnsureBucketOperator(BaseOperator):
    """Creates the bucket in the run's region unless it exists (a 409 is success)."""

    def execute(self, context: Any) -> None:
        from airflow.providers.google.cloud.operators.gcs import GCSCreateBucketOperator

        config = config_of(context)
        GCSCreateBucketOperator(
            task_id=self.task_id,
            bucket_name=config.gcs_bucket,
            location=config.region,
            project_id=config.project,
            gcp_conn_id=config.gcp_conn_id,
        ).execute(context)


class EnsureJobSetOperator(BaseOperator):
    """Makes sure the cluster runs JobSet (installs the configured release when absent) and, when a Kueue
    queue is configured, that the LocalQueue exists."""

    def execute(self, context: Any) -> None:
        from airflow.exceptions import AirflowFailException
        from kubernetes.client import AdmissionregistrationV1Api, ApiextensionsV1Api, CustomObjectsApi
        from kubernetes.client.exceptions import ApiException

        from tpu_rl.hooks.cluster import kubernetes_hook_for

        config = config_of(context)
        api_client = kubernetes_hook_for(config).api_client
        try:
            crd = ApiextensionsV1Api(api_client).read_custom_resource_definition(JOBSET_CRD)
            webhooks = [
                w.metadata.name
                for w in AdmissionregistrationV1Api(api_client).list_mutating_webhook_configuration().items
                if any("jobset" in (h.name or "") for h in w.webhooks or [])
            ]
            versions = [v.name for v in crd.spec.versions if v.served]
            self.log.info("JobSet is installed (CRD versions %s, webhooks %s): skipping install", versions, webhooks)
        except ApiException as error:
            if error.status != 404:
                raise
            self._install_jobset(api_client, config.jobset_version)
        if config.kueue_queue_name:
            try:
                CustomObjectsApi(api_client).get_namespaced_custom_object(
                    LOCALQUEUE_GROUP, LOCALQUEUE_VERSION, config.namespace, "localqueues", config.kueue_queue_name
                )
            except ApiException as error:
                if error.status != 404:
                    raise
                raise AirflowFailException(
                    f"kueue_queue_name: no Kueue LocalQueue '{config.kueue_queue_name}' in namespace "
                    f"'{config.namespace}'; fix: install Kueue with a ClusterQueue covering google.com/tpu, cpu and "
                    "memory and create the LocalQueue, or clear kueue_queue_name."
                ) from None

    def _install_jobset(self, api_client: Any, version: str) -> None:
        import urllib.request

        import yaml
        from kubernetes import utils

        url = JOBSET_MANIFESTS_URL.format(version=version)
        self.log.info("JobSet is not installed: applying %s", url)
        with urllib.request.urlopen(url, timeout=60) as response:
            objects = [o for o in yaml.safe_load_all(response.read()) if o]
        utils.create_from_yaml(api_client, yaml_objects=objects, apply=True)


class CreateHfTokenSecretOperator(BaseOperator):
    """Copies the Hugging Face token from its Airflow connection into the run's Kubernetes Secret.
    The value never reaches a log, an XCom or a rendered template."""

    def execute(self, context: Any) -> None:
        from airflow.exceptions import AirflowFailException
        from airflow.sdk import BaseHook
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException

        from tpu_rl.hooks.cluster import kubernetes_hook_for
        from tpu_rl.manifests import hf_token_secret

        config, run = config_of(context), run_of(context)
        token = BaseHook.get_connection(config.hf_token_conn_id).password
        if not token:
            raise AirflowFailException(
                f"hf_token_conn_id: connection '{config.hf_token_conn_id}' has no password; fix: store the "
                "Hugging Face token in the connection's password field."
            )
        secret = hf_token_secret(config, run, token)
        core = CoreV1Api(kubernetes_hook_for(config).api_client)
        name = secret["metadata"]["name"]
        try:
            core.create_namespaced_secret(config.namespace, secret)
            self.log.info("Created Secret %s/%s from connection '%s'", config.namespace, name, config.hf_token_conn_id)
        except ApiException as error:
            if error.status != 409:
                raise
            core.replace_namespaced_secret(name, config.namespace, secret)
            self.log.info("Updated Secret %s/%s from connection '%s'", config.namespace, name, config.hf_token_conn_id)
