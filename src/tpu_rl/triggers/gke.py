"""Trigger that waits for a TPU node pool's create operation, and for GKE capacity while it waits.

GKE keeps a pool that has no capacity yet in its create operation and says why in the pool's conditions
(GCE_STOCKOUT). The provider's ``GKEOperationTrigger`` would wait silently until its task's timeout; this
one logs GKE's reason at most once a minute and gives up at the run's capacity deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from airflow.providers.google.cloud.triggers.kubernetes_engine import GKEOperationTrigger
from airflow.triggers.base import TriggerEvent

from tpu_rl.gke import capacity_wait_reason, quota_reason
from tpu_rl.hooks.cluster import node_pool_conditions

#: The log says at most this often that the pool still waits for capacity.
CAPACITY_LOG_SECONDS = 60


class TpuPoolCreateTrigger(GKEOperationTrigger):
    """The provider's operation wait (same events: ``success`` once the operation is DONE, ``error``), plus
    ``capacity_timeout`` (with the pool's name as ``node_pool``, GKE's reason as ``message``) when the pool still waits for capacity at
    ``capacity_deadline``.

    :param pool_path: ``projects/P/locations/L/clusters/C/nodePools/N``.
    :param capacity_deadline: POSIX time after which a pool that waits for capacity is given up.
    """

    def __init__(self, *, pool_path: str, capacity_deadline: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool_path = pool_path
        self.capacity_deadline = capacity_deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return (f"{__name__}.{type(self).__name__}",
                {**kwargs, "pool_path": self.pool_path, "capacity_deadline": self.capacity_deadline})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from google.cloud.container_v1 import Operation

        hook = self._get_hook()
        pool = self.pool_path.rsplit("/", 1)[-1]
        logged_at = None
        try:
            while True:
                operation = await hook.get_operation(operation_name=self.operation_name, project_id=self.project_id)
                if operation.status == Operation.Status.DONE:
                    yield TriggerEvent({"status": "success", "operation_name": operation.name})
                    return
                if operation.operation_type != Operation.Type.CREATE_NODE_POOL:  # a pool replaced or reconciled
                    await asyncio.sleep(self.poll_interval)
                    continue
                conditions = await node_pool_conditions(hook, self.pool_path)
                if (quota := quota_reason(conditions)) is not None:  # no wait brings quota
                    yield TriggerEvent({"status": "quota", "operation_name": operation.name, "node_pool": pool,
                                        "message": quota})
                    return
                reason = capacity_wait_reason(conditions)
                if reason is not None:
                    if time.time() >= self.capacity_deadline:
                        yield TriggerEvent({"status": "capacity_timeout", "operation_name": operation.name,
                                            "node_pool": pool, "message": reason})
                        return
                    if logged_at is None or time.monotonic() - logged_at >= CAPACITY_LOG_SECONDS:
                        until = datetime.fromtimestamp(self.capacity_deadline, timezone.utc)
                        self.log.info("Node pool %s waits for TPU capacity (GKE: %s); waiting until %s",
                                      pool, reason, until.strftime("%Y-%m-%d %H:%M:%S UTC"))
                        logged_at = time.monotonic()
                await asyncio.sleep(self.poll_interval)
        except Exception as error:  # noqa: BLE001 - reported to the task as the provider's trigger does
            self.log.exception("Could not read operation %s or node pool %s", self.operation_name, pool)
            yield TriggerEvent({"status": "error", "message": str(error)})
