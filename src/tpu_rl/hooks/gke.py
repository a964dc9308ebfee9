"""The GKE API of one project and location: clusters, their node pools and GKE's operations on them.

Through the Google provider's hooks (their connection, credentials, client options and the cluster label
``GKEHook.create_cluster`` adds); each method is one call, with "already exists" and "not found" given back
as None where the pipeline adopts or skips. Operators, sensors and triggers decide what an answer means
(``tpu_rl.gke`` holds the rules); they never build a client.
"""

from __future__ import annotations

import asyncio
import json
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tpu_rl.gke import operation_target

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEAsyncHook, GKEHook
    from google.cloud.container_v1 import Cluster, ClusterManagerClient, NodePool, Operation

#: States of a GKE operation that has not ended.
UNFINISHED = ("PENDING", "RUNNING")


class GkeApiHook:
    """GKE in ``project_id``/``location`` (``-``: every location, for listing), as ``gcp_conn_id`` reaches it."""

    def __init__(self, gcp_conn_id: str, project_id: str, location: str) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.project_id = project_id
        self.location = location

    @cached_property
    def provider_hook(self) -> GKEHook:
        from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

        return GKEHook(gcp_conn_id=self.gcp_conn_id, location=self.location)

    @cached_property
    def client(self) -> ClusterManagerClient:
        return self.provider_hook.get_cluster_manager_client()

    @property
    def parent(self) -> str:
        return f"projects/{self.project_id}/locations/{self.location}"

    def cluster_path(self, cluster: str) -> str:
        return f"{self.parent}/clusters/{cluster}"

    def pool_path(self, cluster: str, pool: str) -> str:
        return f"{self.cluster_path(cluster)}/nodePools/{pool}"

    # -- clusters ---------------------------------------------------------------------------------------

    def get_cluster(self, cluster: str) -> Cluster | None:
        from google.api_core.exceptions import NotFound

        try:
            return self.provider_hook.get_cluster(name=cluster, project_id=self.project_id)
        except NotFound:
            return None

    def create_cluster(self, body: dict[str, Any]) -> str | None:
        """Asks GKE to create a cluster: its operation's name, or None when the cluster exists."""
        from google.api_core.exceptions import AlreadyExists

        try:
            return self.provider_hook.create_cluster(
                cluster=body, project_id=self.project_id, wait_to_complete=False
            ).name
        except AlreadyExists:
            return None

    def delete_cluster(self, cluster: str) -> str | None:
        """Asks GKE to delete a cluster: its operation's name, or None when there is no such cluster."""
        operation = self.provider_hook.delete_cluster(name=cluster, project_id=self.project_id, wait_to_complete=False)
        return operation.name if operation is not None else None

    def list_clusters(self) -> list[Cluster]:
        return list(self.client.list_clusters(parent=self.parent).clusters)

    # -- node pools -------------------------------------------------------------------------------------

    def create_node_pool(self, cluster: str, body: dict[str, Any]) -> str | None:
        """Asks GKE to create a node pool: its operation's name, or None when the pool exists. A refusal (a
        quota, say) raises GKE's error."""
        from google.api_core.exceptions import AlreadyExists
        from google.cloud.container_v1 import NodePool

        try:
            return self.client.create_node_pool(
                parent=self.cluster_path(cluster), node_pool=NodePool.from_json(json.dumps(body))
            ).name
        except AlreadyExists:
            return None

    def get_node_pool(self, cluster: str, pool: str) -> NodePool:
        return self.client.get_node_pool(name=self.pool_path(cluster, pool))

    def delete_node_pool(self, cluster: str, pool: str) -> str | None:
        """Asks GKE to delete a node pool: its operation's name, or None when there is no such pool. GKE
        refuses (FailedPrecondition) while another operation runs on the pool or its cluster."""
        from google.api_core.exceptions import NotFound

        try:
            return self.client.delete_node_pool(name=self.pool_path(cluster, pool)).name
        except NotFound:
            return None

    # -- operations -------------------------------------------------------------------------------------

    def get_operation(self, name: str) -> Operation:
        return self.provider_hook.get_operation(name, project_id=self.project_id)

    def list_operations(self) -> list[Operation]:
        return list(self.client.list_operations(parent=self.parent).operations)

    def running_operation(self, cluster: str, pool: str) -> Operation | None:
        """GKE's unfinished operation on a node pool of the cluster, or on the cluster itself (either makes GKE
        refuse another operation on the pool), or None."""
        return next(
            (
                op
                for op in self.list_operations()
                if op.status.name in UNFINISHED
                and operation_target(op.target_link) in ((cluster, pool), (cluster, None))
            ),
            None,
        )


class AsyncGkeApiHook:
    """GKE's operations and a node pool's conditions from a trigger's event loop, in ``project_id``/``location``:
    the operations through the provider's ``GKEAsyncHook``; the conditions, which that hook does not read,
    through its sync hook's client (its credentials and client options, in every provider version), in a
    thread."""

    def __init__(self, gcp_conn_id: str, project_id: str, location: str, impersonation_chain: Any = None) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.project_id = project_id
        self.location = location
        self.impersonation_chain = impersonation_chain

    @cached_property
    def provider_hook(self) -> GKEAsyncHook:
        from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEAsyncHook

        return GKEAsyncHook(
            gcp_conn_id=self.gcp_conn_id, location=self.location, impersonation_chain=self.impersonation_chain
        )

    async def get_operation(self, name: str) -> Operation:
        return await self.provider_hook.get_operation(operation_name=name, project_id=self.project_id)

    async def node_pool_conditions(self, pool_path: str) -> list[dict[str, str]]:
        """The pool's ``conditions`` (GKE's reasons for its current state) as plain dicts with enum names."""
        from google.rpc.code_pb2 import Code

        client = (await self.provider_hook.get_sync_hook()).get_cluster_manager_client()
        pool = await asyncio.to_thread(client.get_node_pool, name=pool_path)
        return [
            {"code": c.code.name, "message": c.message, "canonical_code": Code.Name(c.canonical_code)}
            for c in pool.conditions
        ]
