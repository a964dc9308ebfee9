"""Triggers that poll Cloud Storage until a stage's output is complete, or report what is missing.

Each poll is one check of :mod:`tpu_rl.hooks.gcs` (which lists objects and reads only the small documents
the rules in :mod:`tpu_rl.checkpoints` need); a trigger serialises its arguments, calls the check and
decides. Each trigger has a wall-clock deadline of its own and, when it passes, fires an ``incomplete``
event carrying the last list of problems: the task then fails with what is missing instead of a bare
deferral timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aiohttp import ClientError
from airflow.triggers.base import BaseTrigger, TriggerEvent

from tpu_rl.checkpoints import Verdict
from tpu_rl.hooks import gcs
from tpu_rl.hooks.gcs import GcsReader, GcsReadHook


class GcsOutputTrigger(BaseTrigger):
    """Polls until :meth:`probe` finds the output complete or the deadline passes.

    :param bucket: bucket name, without ``gs://``.
    :param prefix: the folder to check, ending in ``/``.
    :param deadline: POSIX time after which an incomplete output is reported as such.
    :param poll_interval: seconds between checks.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str,
        *,
        deadline: float,
        poll_interval: float = 60.0,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.bucket = bucket
        self.prefix = prefix
        self.deadline = deadline
        self.poll_interval = poll_interval
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self._hook = GcsReadHook(gcp_conn_id, impersonation_chain)

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    def _common_kwargs(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "prefix": self.prefix,
            "deadline": self.deadline,
            "poll_interval": self.poll_interval,
            "gcp_conn_id": self.gcp_conn_id,
            "impersonation_chain": self.impersonation_chain,
        }

    async def probe(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        """Check the output once; return the verdict and what the event should carry when complete."""
        raise NotImplementedError

    def other_event(self, found: dict[str, Any]) -> dict[str, Any] | None:
        """An event (with its ``status``) that ends the wait before the output is complete; None: keep waiting."""
        return None

    async def check(self) -> tuple[Verdict, dict[str, Any]]:
        """One check, in a fresh HTTP session."""
        return await self._hook.run(self.bucket, self.probe)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                verdict, found = await self.check()
            except (TimeoutError, ClientError) as error:
                verdict, found = Verdict((f"could not read {self.uri}: {error!r}",)), {}
            if verdict.complete:
                yield TriggerEvent({"status": "complete", "uri": self.uri, **found})
                return
            if (other := self.other_event(found)) is not None:
                yield TriggerEvent({"uri": self.uri, **other})
                return
            if time.time() >= self.deadline:
                message = f"{self.uri} is incomplete: {verdict.describe()}"
                yield TriggerEvent({"status": "incomplete", "uri": self.uri, "message": message})
                return
            self.log.info("%s not complete yet: %s", self.uri, verdict.describe())
            await asyncio.sleep(max(0.0, min(self.poll_interval, self.deadline - time.time())))


class OrbaxStepCompleteTrigger(GcsOutputTrigger):
    """Fires when an Orbax step folder (``prefix``, e.g. ``.../0/``) holds a committed, whole save.

    :param items: the item folders the step must hold, e.g. ``["items"]``.
    """

    def __init__(self, bucket: str, prefix: str, *, items: Sequence[str], **kwargs: Any) -> None:
        super().__init__(bucket, prefix, **kwargs)
        self.items = list(items)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {**self._common_kwargs(), "items": self.items}

    async def probe(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        return await gcs.orbax_step(reader, self.prefix, self.items)


class ConversionLockTrigger(OrbaxStepCompleteTrigger):
    """Waits while another DAG run holds the lock on a shared conversion (see :class:`tpu_rl.hooks.gcs.GcsLock`).

    Each poll reads the lock object, then the step folder. Events: ``complete`` (the step is whole: the
    holder converted it; ``holder`` is the last lock seen), ``released`` (the lock is gone and the step
    is not whole: the holder failed, try again), ``stale`` (the lock is older than its
    ``stale_after_seconds``: take it over), or ``incomplete`` at the deadline.

    :param lock_object: the lock's object name in the bucket.
    :param holder: the lock's JSON when the task deferred.
    :param stale_after: seconds after which a lock that names no limit of its own counts as stale.
    """

    def __init__(
        self, bucket: str, prefix: str, *, lock_object: str, holder: dict[str, Any], stale_after: float, **kwargs: Any
    ) -> None:
        super().__init__(bucket, prefix, **kwargs)
        self.lock_object = lock_object
        self.holder = dict(holder)
        self.stale_after = stale_after

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {
            **self._common_kwargs(),
            "items": self.items,
            "lock_object": self.lock_object,
            "holder": self.holder,
            "stale_after": self.stale_after,
        }

    async def probe(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        # The lock before the step: a holder deletes its lock only after it converted.
        lock = await gcs.read_lock(reader, self.lock_object)
        if lock is not None and lock.holder != self.holder:
            self.log.info("%s is now held by %s", self.lock_object, lock.holder)
            self.holder = lock.holder
        verdict, _ = await super().probe(reader)
        found: dict[str, Any] = {"holder": self.holder, "lock": "held"}
        if lock is None:
            found["lock"] = "released"
        elif (age := lock.age()) > lock.stale_after(self.stale_after):
            found.update(lock="stale", age=age)
        return verdict, found

    def other_event(self, found: dict[str, Any]) -> dict[str, Any] | None:
        if found.get("lock") in ("released", "stale"):
            return {"status": found["lock"], **found}
        return None


class FinalTrainingCheckpointTrigger(GcsOutputTrigger):
    """Fires with the run's final step once ``checkpoints/actor/`` (``prefix``) holds the end-of-run save.

    :param train_steps: planned steps, ``num_batches * rl.num_iterations``.
    :param checkpoint_period: ``train_rl``'s ``checkpoint_period``.
    :param items: item folders of a training step.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str,
        *,
        train_steps: int,
        checkpoint_period: int,
        items: Sequence[str] = ("model_params", "optimizer_state"),
        trainer_completed: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(bucket, prefix, **kwargs)
        self.train_steps = train_steps
        self.checkpoint_period = checkpoint_period
        self.items = list(items)
        self.trainer_completed = trainer_completed

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {
            **self._common_kwargs(),
            "train_steps": self.train_steps,
            "checkpoint_period": self.checkpoint_period,
            "items": self.items,
            "trainer_completed": self.trainer_completed,
        }

    async def probe(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        return await gcs.final_training_step(
            reader,
            self.prefix,
            train_steps=self.train_steps,
            checkpoint_period=self.checkpoint_period,
            items=self.items,
            trainer_completed=self.trainer_completed,
        )


class HfExportCompleteTrigger(GcsOutputTrigger):
    """Fires when a Hugging Face export under ``prefix`` is whole and written by this attempt.

    :param not_before: ISO 8601 time the export stage started; older objects count as stale.
    """

    def __init__(self, bucket: str, prefix: str, *, not_before: str | None = None, **kwargs: Any) -> None:
        super().__init__(bucket, prefix, **kwargs)
        self.not_before = not_before

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {**self._common_kwargs(), "not_before": self.not_before}

    async def probe(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        return await gcs.hf_export(reader, self.prefix, not_before=self.not_before)
