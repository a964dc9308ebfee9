"""Triggers that poll Cloud Storage until a stage's output is complete, or report what is missing.

They list objects and read only the small documents the rules in :mod:`tpu_rl.checkpoints` need
(``_CHECKPOINT_METADATA``, ``_METADATA``, the export index, each shard's header through a ranged
read), so a check costs a few listing pages, never a download of the checkpoint. Each trigger has a
wall-clock deadline of its own and, when it passes, fires an ``incomplete`` event carrying the last
list of problems: the task then fails with what is missing instead of a bare deferral timeout.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timezone
from typing import Any

from aiohttp import ClientError, ClientResponseError, ClientSession
from airflow.providers.google.cloud.hooks.gcs import GCSAsyncHook
from airflow.triggers.base import BaseTrigger, TriggerEvent

from tpu_rl import checkpoints as rules
from tpu_rl.checkpoints import StoredObject, Verdict


def _parse_time(text: str) -> datetime:
    """GCS RFC 3339 timestamps; some servers give nanoseconds, which datetime cannot hold."""
    head, _, fraction = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(fraction + '000000')[:6]}+00:00")


def parse_not_before(text: str | None) -> datetime | None:
    """An ISO 8601 time (UTC when it names no zone); raises ValueError for anything else."""
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


class GcsReader:
    """Lists and reads one bucket's objects with the gcloud-aio client that GCSAsyncHook provides."""

    def __init__(self, storage: Any, bucket: str) -> None:
        self.storage = storage
        self.bucket = bucket

    async def list(self, prefix: str, delimiter: str | None = None) -> tuple[dict[str, StoredObject], list[str]]:
        """Objects under ``prefix`` keyed by name relative to it, and the sub-folders (with a delimiter)."""
        params = {"prefix": prefix, **({"delimiter": delimiter} if delimiter else {})}
        objects: dict[str, StoredObject] = {}
        folders: list[str] = []
        while True:
            page = await self.storage.list_objects(self.bucket, params=params)
            for item in page.get("items", []):
                name = item["name"][len(prefix) :]
                objects[name] = StoredObject(name, int(item["size"]), _parse_time(item["updated"]))
            folders += [p[len(prefix) :] for p in page.get("prefixes", [])]
            if not page.get("nextPageToken"):
                return objects, folders
            params["pageToken"] = page["nextPageToken"]

    async def read(self, name: str, first: int | None = None, last: int | None = None) -> bytes:
        """An object's bytes, or only bytes ``first..last`` (inclusive) with a ranged download."""
        headers = {"Range": f"bytes={first}-{last}"} if first is not None else None
        return await self.storage.download(self.bucket, name, headers=headers)


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
        self._hook: Any = None

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
        """One check in a fresh HTTP session (also used by sensors in poke mode and by operators)."""
        if self._hook is None:
            self._hook = GCSAsyncHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)
        async with ClientSession() as session:
            storage = await self._hook.get_storage_client(session)
            return await self.probe(GcsReader(storage, self.bucket))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                verdict, found = await self.check()
            except (ClientError, asyncio.TimeoutError) as error:
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


async def _probe_orbax_step(reader: GcsReader, step_prefix: str, label: str, items: Sequence[str]) -> Verdict:
    listing, _ = await reader.list(step_prefix)
    documents = {
        name: (await reader.read(step_prefix + name) if name in listing else None)
        for name in rules.orbax_documents(items)
    }
    return rules.check_orbax_step(label, listing, documents, items)


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
        label = self.prefix.rstrip("/").rsplit("/", 1)[-1] + "/"
        return await _probe_orbax_step(reader, self.prefix, label, self.items), {}


class ConversionLockTrigger(OrbaxStepCompleteTrigger):
    """Waits while another DAG run holds the lock on a shared conversion (see ``tpu_rl.operators.outputs.GcsLock``).

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

    async def _read_lock(self, reader: GcsReader) -> tuple[dict[str, Any], datetime] | None:
        page = await reader.storage.list_objects(self.bucket, params={"prefix": self.lock_object})
        item = next((i for i in page.get("items", []) if i["name"] == self.lock_object), None)
        if item is None:
            return None
        try:
            holder = json.loads(await reader.read(self.lock_object))
        except ClientResponseError as error:
            if error.status == 404:
                return None
            raise
        except ValueError:
            holder = {}
        return (holder if isinstance(holder, dict) else {}), _parse_time(item.get("updated") or item["timeCreated"])

    async def probe(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        lock = await self._read_lock(reader)  # Before the step: a holder deletes its lock only after it converted.
        if lock is not None and lock[0] != self.holder:
            self.log.info("%s is now held by %s", self.lock_object, lock[0])
            self.holder = lock[0]
        verdict, _ = await super().probe(reader)
        found: dict[str, Any] = {"holder": self.holder, "lock": "held"}
        if lock is None:
            found["lock"] = "released"
        else:
            age = (datetime.now(timezone.utc) - lock[1]).total_seconds()
            try:
                limit = float(lock[0].get("stale_after_seconds") or self.stale_after)
            except (TypeError, ValueError):
                limit = self.stale_after
            if age > limit:
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
        _, folders = await reader.list(self.prefix, delimiter="/")
        step, uncommitted = None, []
        for candidate in rules.step_numbers(folders):  # Orbax ignores steps without commit_success.txt.
            marker, _ = await reader.list(f"{self.prefix}{candidate}/{rules.COMMIT_SUCCESS}")
            if "" in marker:  # The marker's own name, relative to itself.
                step = candidate
                break
            uncommitted.append(candidate)
        verdict = rules.check_final_step(
            step, self.train_steps, self.checkpoint_period, uncommitted, self.trainer_completed
        )
        if verdict.complete:
            verdict = await _probe_orbax_step(reader, f"{self.prefix}{step}/", f"actor/{step}/", self.items)
        return verdict, {"step": step}


class HfExportCompleteTrigger(GcsOutputTrigger):
    """Fires when a Hugging Face export under ``prefix`` is whole and written by this attempt.

    :param not_before: ISO 8601 time the export stage started; older objects count as stale.
    """

    def __init__(self, bucket: str, prefix: str, *, not_before: str | None = None, **kwargs: Any) -> None:
        super().__init__(bucket, prefix, **kwargs)
        self.not_before = not_before

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {**self._common_kwargs(), "not_before": self.not_before}

    async def _shard_problem(self, reader: GcsReader, shard: StoredObject) -> str | None:
        if shard.size < 8:
            return f"{shard.name}: only {shard.size} bytes"
        length = rules.safetensors_header_length(await reader.read(self.prefix + shard.name, 0, 7))
        header = None
        if 0 < length <= min(shard.size - 8, rules.MAX_SAFETENSORS_HEADER):
            header = await reader.read(self.prefix + shard.name, 8, 8 + length - 1)
        return rules.check_shard(shard.name, shard.size, length, header)

    async def probe(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        listing, _ = await reader.list(self.prefix)
        index = await reader.read(self.prefix + rules.HF_INDEX) if rules.HF_INDEX in listing else None
        shards, index_verdict = rules.expected_shards(listing, index)
        problems = list(index_verdict.problems)
        for name in shards:
            if name in listing and (problem := await self._shard_problem(reader, listing[name])):
                problems.append(problem)
        verdict = rules.check_hf_export(listing, shards, problems, parse_not_before(self.not_before))
        return verdict, {"shards": len(shards)}
