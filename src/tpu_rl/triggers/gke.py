"""Triggers that wait for GKE's operations: any operation, and a TPU node pool's create with GKE's capacity.

The module imports neither the Google provider nor the GKE client: the triggerer imports a trigger's module on its
event loop, and the provider's ``kubernetes_engine`` triggers took about 2 s to import there, stalling every
trigger of that triggerer (Airflow's "async thread was blocked" warning); :class:`AsyncGkeApiHook` loads them in a
thread on first use. The provider's ``GKEOperationTrigger`` also ended its wait at GKE's first passing error.

GKE keeps a create it cannot get capacity for RUNNING while it retries, for about 35 minutes, before it
fails it with GCE_STOCKOUT (observed: "Not all instances running in IGM after 35m", Cluster Toolkit PR 6278);
no source shows it saying so in the pool meanwhile. A create can also be merely slow: one took about 35 minutes
and showed the pool in ERROR before GKE made it RUNNING (NVIDIA/aicr 2065). So :class:`TpuPoolCreateTrigger` gives
up only on what GKE reports: past the run's capacity deadline, a pool whose conditions name a stockout; otherwise
it waits until GKE ends the create (DONE, with its error if it failed, which the operator reads). A create running
longer than one with capacity takes (``create_seconds``) is named in the log, with GKE's reason when it gives one,
at most once a minute.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from tpu_rl.gke import capacity_wait_reason, quota_reason
from tpu_rl.hooks.gke import AsyncGkeApiHook, is_transient
from tpu_rl.timestamps import posix_time

#: The log says at most this often that the pool still waits for capacity.
CAPACITY_LOG_SECONDS = 60
#: How long a TPU slice pool's create takes when GKE has the capacity: GKE documents no figure; a create
#: still running after this is most likely GKE retrying for capacity.
CREATE_SECONDS = 15 * 60
#: How many looks in a row may meet an error GKE may get past (``hooks.gke.is_transient``) before the wait fails.
TRANSIENT_ERRORS = 10


class GkeOperationTrigger(BaseTrigger):
    """Fires ``success`` once GKE's operation is DONE (the operator reads its error: GKE marks a failed operation
    DONE too), or ``error`` (with ``message``) when it cannot be read; GKE's passing errors and its throttling (429)
    are asked again a poll later, up to :data:`TRANSIENT_ERRORS` looks in a row. The provider's
    ``GKEOperationTrigger``'s arguments and events.

    :param use_dns_endpoint: serialised by the provider's trigger, which this one's subclass extended before 2.2.0;
        not read (the operation is GKE's API, not the cluster's).
    """

    def __init__(
        self,
        *,
        operation_name: str,
        project_id: str,
        location: str,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: Any = None,
        poll_interval: float = 10,
        use_dns_endpoint: bool = False,
    ) -> None:
        super().__init__()
        self.operation_name = operation_name
        self.project_id = project_id
        self.location = location
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{__name__}.{type(self).__name__}",
            {
                "operation_name": self.operation_name,
                "project_id": self.project_id,
                "location": self.location,
                "gcp_conn_id": self.gcp_conn_id,
                "impersonation_chain": self.impersonation_chain,
                "poll_interval": self.poll_interval,
            },
        )

    def gke_api(self) -> AsyncGkeApiHook:
        return AsyncGkeApiHook(self.gcp_conn_id, self.project_id, self.location, self.impersonation_chain)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook, transient = self.gke_api(), 0
        try:
            while True:
                try:
                    event = await self._look(hook)
                except Exception as error:
                    transient = transient + 1 if is_transient(error, throttling=True) else TRANSIENT_ERRORS
                    if transient >= TRANSIENT_ERRORS:
                        raise
                    self.log.warning("GKE did not answer (%s: %s); asking again", type(error).__name__, error)
                    await asyncio.sleep(self.poll_interval)
                    continue
                transient = 0
                if event is not None:
                    yield TriggerEvent(event)
                    return
                await asyncio.sleep(self.poll_interval)
        except Exception as error:  # noqa: BLE001 - reported to the task as the provider's trigger does
            self.log.exception("Could not read GKE's operation %s", self.operation_name)
            yield TriggerEvent({"status": "error", "message": str(error), "operation_name": self.operation_name})

    async def _look(self, hook: AsyncGkeApiHook) -> dict[str, Any] | None:
        """One look: the event to fire, or None to look again."""
        operation = await hook.get_operation(self.operation_name)
        if operation.status.name == "DONE":
            return {"status": "success", "operation_name": operation.name}
        return None


class TpuPoolCreateTrigger(GkeOperationTrigger):
    """The operation wait (same events), plus ``quota`` and ``capacity_timeout`` (with the pool's name as
    ``node_pool``, GKE's reason as ``message``): the pool's conditions name missing quota, or it still waits for
    capacity at ``capacity_deadline``.

    :param pool_path: ``projects/P/locations/L/clusters/C/nodePools/N``.
    :param capacity_deadline: POSIX time after which a pool that waits for capacity is given up.
    :param create_seconds: how long a create with capacity takes (:data:`CREATE_SECONDS`).
    """

    def __init__(
        self, *, pool_path: str, capacity_deadline: float, create_seconds: float = CREATE_SECONDS, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.pool_path = pool_path
        self.capacity_deadline = capacity_deadline
        self.create_seconds = create_seconds
        self._logged_at: float | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        return (
            classpath,
            {
                **kwargs,
                "pool_path": self.pool_path,
                "capacity_deadline": self.capacity_deadline,
                "create_seconds": self.create_seconds,
            },
        )

    async def _look(self, hook: AsyncGkeApiHook) -> dict[str, Any] | None:
        """One look at the operation and, while GKE creates it, at the pool."""
        pool = self.pool_path.rsplit("/", 1)[-1]
        operation = await hook.get_operation(self.operation_name)
        if operation.status.name == "DONE":
            return {"status": "success", "operation_name": operation.name}
        if operation.operation_type.name != "CREATE_NODE_POOL":  # a pool replaced, GKE's own operation
            return None
        conditions = await hook.node_pool_conditions(self.pool_path)
        if (quota := quota_reason(conditions)) is not None:  # no wait brings quota
            return {"status": "quota", "operation_name": operation.name, "node_pool": pool, "message": quota}
        reported = capacity_wait_reason(conditions)
        running = time.time() - (posix_time(operation.start_time) or time.time())
        reason = reported
        if reason is None and running >= self.create_seconds:
            reason = (
                f"GKE has been creating the pool for {running / 60:.0f} minutes and names no reason: a slow create, "
                "or GKE retrying for capacity (it does for about 35 minutes, then ends the create with "
                "GCE_STOCKOUT); waiting for GKE to end it"
            )
        if reason is None:
            return None
        if reported is not None and time.time() >= self.capacity_deadline:
            # GKE may have ended the create between the two reads: its error then says why
            ended = await hook.get_operation(self.operation_name)
            if ended.status.name == "DONE":
                return {"status": "success", "operation_name": operation.name}
            return {
                "status": "capacity_timeout",
                "operation_name": operation.name,
                "node_pool": pool,
                "message": reason,
            }
        if self._logged_at is None or time.monotonic() - self._logged_at >= CAPACITY_LOG_SECONDS:
            if reported is None:
                self.log.info("Node pool %s: %s", pool, reason)
            else:
                until = datetime.fromtimestamp(self.capacity_deadline, UTC)
                self.log.info(
                    "Node pool %s waits for TPU capacity (GKE: %s); waiting until %s",
                    pool,
                    reason,
                    until.strftime("%Y-%m-%d %H:%M:%S UTC"),
                )
            self._logged_at = time.monotonic()
        return None
