"""Kubernetes access to the run's cluster: through an Airflow Kubernetes connection, or GKE credentials."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    from tpu_rl.config import RunConfig


def kubernetes_hook(
    *,
    kubernetes_conn_id: str | None = None,
    project_id: str | None = None,
    location: str | None = None,
    cluster_name: str | None = None,
    gcp_conn_id: str = "google_cloud_default",
) -> KubernetesHook:
    """A Kubernetes connection wins; otherwise the GKE cluster's endpoint and CA with refreshed tokens."""
    if kubernetes_conn_id:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(conn_id=kubernetes_conn_id)
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook, GKEKubernetesHook

    cluster = GKEHook(gcp_conn_id=gcp_conn_id, location=location).get_cluster(name=cluster_name, project_id=project_id)
    return GKEKubernetesHook(
        gcp_conn_id=gcp_conn_id,
        cluster_url=f"https://{cluster.endpoint}",
        ssl_ca_cert=cluster.master_auth.cluster_ca_certificate,
        enable_tcp_keepalive=True,
    )


def kubernetes_hook_for(config: RunConfig) -> KubernetesHook:
    return kubernetes_hook(
        kubernetes_conn_id=config.kubernetes_conn_id or None,
        project_id=config.project,
        location=config.region,
        cluster_name=config.cluster_name,
        gcp_conn_id=config.gcp_conn_id,
    )
