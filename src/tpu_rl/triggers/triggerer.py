"""The trigger a run defers on once, before it creates anything billable, to prove that the triggerer can
import this package (on Cloud Composer 3 it can only if the distribution is installed: plugins/ never
reaches the triggerer)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

#: Seconds the trigger waits before firing. Airflow fails a task whose trigger fired and whose resumption was
#: queued before the scheduler processed the executor's report of its deferral (seen here: the worker took
#: 5.4 s to report on a loaded machine); the task's retries cover what this wait does not.
HOLD_SECONDS = 10.0


class TriggererCheckTrigger(BaseTrigger):
    """Fires after ``hold_seconds`` with the version of ``tpu_rl`` the triggerer imported and its host.

    :param sent_by: the version of the worker that deferred (carried for the triggerer's log).
    """

    def __init__(self, *, sent_by: str, hold_seconds: float = HOLD_SECONDS) -> None:
        super().__init__()
        self.sent_by = sent_by
        self.hold_seconds = hold_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "sent_by": self.sent_by,
            "hold_seconds": self.hold_seconds,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from tpu_rl import __version__

        self.log.info("tpu-rl %s in the triggerer (the worker runs %s)", __version__, self.sent_by)
        await asyncio.sleep(self.hold_seconds)
        yield TriggerEvent({"version": __version__, "host": socket.gethostname()})
