"""The trigger that polls Cloud Storage until a stage's output is complete, or reports what is missing.

Each poll runs one check of :mod:`tpu_rl.output_checks` (which lists objects and reads only the small
documents the rules in :mod:`tpu_rl.checkpoints` need) and decides. The trigger has a wall-clock deadline of
its own and, when it passes, fires an ``incomplete`` event carrying the last list of problems: the task then
fails with what is missing instead of a bare deferral timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import ClientError
from airflow.triggers.base import BaseTrigger, TriggerEvent

from tpu_rl.checkpoints import Verdict
from tpu_rl.hooks.gcs import GcsReadHook
from tpu_rl.output_checks import OutputCheck


class GcsOutputTrigger(BaseTrigger):
    """Polls until ``check`` finds ``gs://<bucket>/<check.prefix>`` complete, the check ends the wait, or the
    deadline passes.

    :param bucket: bucket name, without ``gs://``.
    :param check: the check, or its serialised form.
    :param deadline: POSIX time after which an incomplete output is reported as such.
    :param poll_interval: seconds between checks.
    """

    def __init__(
        self,
        bucket: str,
        check: OutputCheck | Mapping[str, Any],
        *,
        deadline: float,
        poll_interval: float = 60.0,
        gcp_conn_id: str = "google_cloud_default",
    ) -> None:
        super().__init__()
        self.bucket = bucket
        self.check = check if isinstance(check, OutputCheck) else OutputCheck.deserialize(check)
        self.deadline = deadline
        self.poll_interval = poll_interval
        self.gcp_conn_id = gcp_conn_id
        self._hook = GcsReadHook(gcp_conn_id)

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.check.prefix}"

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {
            "bucket": self.bucket,
            "check": self.check.serialize(),
            "deadline": self.deadline,
            "poll_interval": self.poll_interval,
            "gcp_conn_id": self.gcp_conn_id,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                verdict, found = await self._hook.run(self.bucket, self.check)  # in a fresh HTTP session
            except (TimeoutError, ClientError) as error:
                verdict, found = Verdict((f"could not read {self.uri}: {error!r}",)), {}
            if note := found.pop("note", None):
                self.log.info("%s", note)
            if verdict.complete:
                yield TriggerEvent({"status": "complete", "uri": self.uri, **found})
                return
            if (other := self.check.ends_wait(found)) is not None:
                yield TriggerEvent({"uri": self.uri, **other})
                return
            if time.time() >= self.deadline:
                message = f"{self.uri} is incomplete: {verdict.describe()}"
                yield TriggerEvent({"status": "incomplete", "uri": self.uri, "message": message})
                return
            self.log.info("%s not complete yet: %s", self.uri, verdict.describe())
            await asyncio.sleep(max(0.0, min(self.poll_interval, self.deadline - time.time())))
