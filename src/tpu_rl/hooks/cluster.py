"""Kubernetes access to the run's cluster, as the JobSet operator reaches it: through the Airflow
Kubernetes connection named by the params, or the GKE cluster with refreshed tokens; the state of a GKE
node pool that is being created."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_rl.hooks.jobset import ClusterTarget, JobSetHook

if TYPE_CHECKING:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEAsyncHook

    from tpu_rl.config import RunConfig


def cluster_target(config: RunConfig) -> ClusterTarget:
    if config.kubernetes_conn_id:
        return ClusterTarget(kubernetes_conn_id=config.kubernetes_conn_id, gcp_conn_id=config.gcp_conn_id)
    return ClusterTarget(
        project_id=config.project,
        location=config.region,
        cluster_name=config.cluster_name,
        gcp_conn_id=config.gcp_conn_id,
        use_dns_endpoint=config.uses_dns_endpoint,
    )


def kubernetes_hook_for(config: RunConfig) -> KubernetesHook:
    return JobSetHook(cluster_target(config)).kube_hook


async def node_pool_conditions(gke_async_hook: GKEAsyncHook, pool_path: str) -> list[dict[str, str]]:
    """A node pool's ``conditions`` (GKE's reasons for its current state) as plain dicts with enum names,
    read through the provider's async GKE hook (its client: the same credentials and endpoint)."""
    from google.rpc.code_pb2 import Code

    client = await gke_async_hook._get_client()
    pool = await client.get_node_pool(name=pool_path)
    return [
        {"code": c.code.name, "message": c.message, "canonical_code": Code.Name(c.canonical_code)}
        for c in pool.conditions
    ]
