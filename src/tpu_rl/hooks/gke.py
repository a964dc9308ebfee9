"""The GKE API of one project and location: clusters, their node pools and GKE's operations on them.

Through the Google provider's hooks (their connection, credentials, client options and the cluster label
``GKEHook.create_cluster`` adds); each method is one call, with "already exists" and "not found" given back
as None where the pipeline adopts or skips, and a refusal that quota, throttling, another operation or IAM explains
raised as :class:`GkeRefusedError` (the package's words, ``tpu_rl.gke.Refusal``; an IAM refusal names the permission
and the role that holds it, on the listing and getting calls too). Operators, sensors and
triggers decide what an answer means (``tpu_rl.gke`` holds the rules); they never build a client nor read the
client library's exceptions.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tpu_rl.gke import Refusal, operation_target, permission_fix, refusal
from tpu_rl.hooks.google_credentials import warm_google_credentials
from tpu_rl.hooks.in_thread import in_thread, run_to_the_end

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEAsyncHook, GKEHook
    from google.cloud.container_v1 import Cluster, ClusterManagerClient, NodePool, Operation

#: States of a GKE operation that has not ended.
UNFINISHED = ("PENDING", "RUNNING")
#: How long one call to GKE may take, and all its attempts together: a call GKE answers with an error the same
#: call may get past (:func:`call_retry`) is made again with backoff, then its error raised.
CALL_TIMEOUT_SECONDS = 60.0
CALL_RETRY_SECONDS = 240.0


def is_transient(error: BaseException, *, throttling: bool = False) -> bool:
    """Whether GKE's error is one the same call may get past: the answers Terraform's Google provider retries
    (500, 502, 503, a reset connection: magic-modules ``transport_tpg/error_retry_predicates.go``; over gRPC a reset
    is UNAVAILABLE) and a passed deadline (504); with ``throttling``, a 429 too (a read in a wait asks again a poll
    later; a request that changes something is waited out deferred instead, ``operators.gke_operations``)."""
    from google.api_core import exceptions

    transient: tuple[type[BaseException], ...] = (
        exceptions.InternalServerError,
        exceptions.BadGateway,
        exceptions.ServiceUnavailable,
        exceptions.GatewayTimeout,
        exceptions.DeadlineExceeded,
    )
    return isinstance(error, transient + ((exceptions.TooManyRequests,) if throttling else ()))


def call_retry() -> Any:
    """The retry of every GKE call on :func:`is_transient` errors, with exponential backoff from 1 s to 30 s. The
    generated client retries only its reads, on 503 and 504, for 20 s. A create retried after GKE applied it is
    answered "already exists", which the operators adopt."""
    from google.api_core import retry

    return retry.Retry(predicate=is_transient, initial=1.0, maximum=30.0, timeout=CALL_RETRY_SECONDS)


class GkeRefusedError(Exception):
    """GKE refused a request at once, for a reason the pipeline acts on: ``refusal`` says which; ``blocking`` is
    the operation GKE runs meanwhile on the cluster or the pool (for ``BUSY``, when GKE lists one)."""

    def __init__(self, refusal: Refusal, message: str, blocking: Operation | None = None) -> None:
        super().__init__(message)
        self.refusal, self.message, self.blocking = refusal, message, blocking


def _refusal_of(error: Any) -> Refusal | None:
    """How the package reads a client error of GKE (:func:`tpu_rl.gke.refusal`)."""
    status = error.grpc_status_code.name if error.grpc_status_code is not None else ""
    return refusal(status, str(error.message))


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

    @cached_property
    def _bounded(self) -> dict[str, Any]:
        """What every call passes: :func:`call_retry` and :data:`CALL_TIMEOUT_SECONDS` an attempt."""
        return {"retry": call_retry(), "timeout": CALL_TIMEOUT_SECONDS}

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
            with self._permission():
                return self.provider_hook.get_cluster(name=cluster, project_id=self.project_id, **self._bounded)
        except NotFound:
            return None

    def create_cluster(self, body: dict[str, Any]) -> str | None:
        """Asks GKE to create a cluster: its operation's name, or None when the cluster exists."""
        from google.api_core.exceptions import AlreadyExists

        try:
            with self._refusals(body["name"]):
                return self.provider_hook.create_cluster(
                    cluster=body, project_id=self.project_id, wait_to_complete=False, **self._bounded
                ).name
        except AlreadyExists:
            return None

    def delete_cluster(self, cluster: str) -> str | None:
        """Asks GKE to delete a cluster: its operation's name, or None when there is no such cluster."""
        with self._refusals(cluster):
            operation = self.provider_hook.delete_cluster(
                name=cluster, project_id=self.project_id, wait_to_complete=False, **self._bounded
            )
        return operation.name if operation is not None else None

    def list_clusters(self) -> list[Cluster]:
        with self._permission():
            return list(self.client.list_clusters(parent=self.parent, **self._bounded).clusters)

    # -- node pools -------------------------------------------------------------------------------------

    def create_node_pool(self, cluster: str, body: dict[str, Any]) -> str | None:
        """Asks GKE to create a node pool: its operation's name, or None when the pool exists."""
        from google.api_core.exceptions import AlreadyExists
        from google.cloud.container_v1 import NodePool

        try:
            with self._refusals(cluster, body["name"]):
                return self.client.create_node_pool(
                    parent=self.cluster_path(cluster), node_pool=NodePool.from_json(json.dumps(body)), **self._bounded
                ).name
        except AlreadyExists:
            return None

    def get_node_pool(self, cluster: str, pool: str) -> NodePool:
        return self.client.get_node_pool(name=self.pool_path(cluster, pool), **self._bounded)

    def delete_node_pool(self, cluster: str, pool: str) -> str | None:
        """Asks GKE to delete a node pool: its operation's name, or None when there is no such pool."""
        from google.api_core.exceptions import NotFound

        try:
            with self._refusals(cluster, pool):
                return self.client.delete_node_pool(name=self.pool_path(cluster, pool), **self._bounded).name
        except NotFound:
            return None

    @contextlib.contextmanager
    def _refusals(self, cluster: str, pool: str | None = None) -> Iterator[None]:
        """Raises GKE's refusal of a request on ``cluster`` (``pool``) as :class:`GkeRefusedError` where
        :func:`tpu_rl.gke.refusal` reads it; with the operation that blocks it when GKE is busy."""
        from google.api_core.exceptions import GoogleAPICallError

        try:
            yield
        except GoogleAPICallError as refused:
            kind = _refusal_of(refused)
            if kind is None:
                raise
            if kind is Refusal.PERMISSION:
                raise self._denied(refused) from refused
            blocking = self.running_operation(cluster, pool) if kind is Refusal.BUSY else None
            raise GkeRefusedError(kind, str(refused.message), blocking) from refused

    @contextlib.contextmanager
    def _permission(self) -> Iterator[None]:
        """A read GKE refuses for IAM, raised as :class:`GkeRefusedError` naming the role to grant; any other error
        as it is (a read's waits and retries read the client's exceptions)."""
        from google.api_core.exceptions import GoogleAPICallError

        try:
            yield
        except GoogleAPICallError as refused:
            if _refusal_of(refused) is not Refusal.PERMISSION:
                raise
            raise self._denied(refused) from refused

    def _denied(self, refused: Any) -> GkeRefusedError:
        """GKE's IAM refusal with what to grant (:func:`tpu_rl.gke.permission_fix`)."""
        message = str(refused.message)
        return GkeRefusedError(Refusal.PERMISSION, f"{message} {permission_fix(message, self.project_id)}")

    # -- operations -------------------------------------------------------------------------------------

    def get_operation(self, name: str) -> Operation:
        return self.client.get_operation(name=f"{self.parent}/operations/{name}", **self._bounded)

    def list_operations(self) -> list[Operation]:
        with self._permission():
            return list(self.client.list_operations(parent=self.parent, **self._bounded).operations)

    def running_operation(self, cluster: str, pool: str | None = None) -> Operation | None:
        """GKE's unfinished operation that makes it refuse another one on the node pool ``pool`` (one on that pool
        or on the cluster itself) or on the cluster (``pool`` None: one on the cluster or any of its pools), or
        None."""

        def blocks(target: tuple[str, str | None] | None) -> bool:
            return target is not None and target[0] == cluster and (pool is None or target[1] in (pool, None))

        return next(
            (
                op
                for op in self.list_operations()
                if op.status.name in UNFINISHED and blocks(operation_target(op.target_link))
            ),
            None,
        )


class AsyncGkeApiHook:
    """GKE's operations and a node pool's conditions from a trigger's event loop, in ``project_id``/``location``:
    the operations through the provider's ``GKEAsyncHook``; the conditions, which that hook does not read,
    through its sync hook's client (its credentials and client options, in every provider version). Nothing here
    blocks the loop: the provider's module and the GKE client's are imported in a thread on first use (about 2 s
    on a busy triggerer), and the sync client is made and called in a thread."""

    def __init__(self, gcp_conn_id: str, project_id: str, location: str, impersonation_chain: Any = None) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.project_id = project_id
        self.location = location
        self.impersonation_chain = impersonation_chain
        self._provider_hook: GKEAsyncHook | None = None

    async def provider_hook(self) -> GKEAsyncHook:
        if self._provider_hook is None:
            module = await in_thread(_import_gke_clients)
            hook = module.GKEAsyncHook(
                gcp_conn_id=self.gcp_conn_id, location=self.location, impersonation_chain=self.impersonation_chain
            )
            await warm_google_credentials(hook)
            self._provider_hook = hook
        return self._provider_hook

    async def get_operation(self, name: str) -> Operation:
        hook = await self.provider_hook()
        return await hook.get_operation(operation_name=name, project_id=self.project_id)

    async def node_pool_conditions(self, pool_path: str) -> list[dict[str, str]]:
        """The pool's ``conditions`` (GKE's reasons for its current state) as plain dicts with enum names."""
        from google.rpc.code_pb2 import Code

        sync_hook = await run_to_the_end((await self.provider_hook()).get_sync_hook())
        pool = await in_thread(
            lambda: sync_hook.get_cluster_manager_client().get_node_pool(name=pool_path, timeout=CALL_TIMEOUT_SECONDS)
        )
        return [
            {"code": c.code.name, "message": c.message, "canonical_code": Code.Name(c.canonical_code)}
            for c in pool.conditions
        ]


def _import_gke_clients() -> Any:
    """The provider's GKE hooks module, with the GKE client and the RPC codes it reads (imported in a thread)."""
    import importlib

    importlib.import_module("google.cloud.container_v1")
    importlib.import_module("google.rpc.code_pb2")
    return importlib.import_module("airflow.providers.google.cloud.hooks.kubernetes_engine")
