"""Decisions about stage outputs in Cloud Storage: check finished work, lock shared work, refuse bad
resumes, publish.

Google provider imports stay inside methods: the DAG file imports this module at parse time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from tpu_rl.checkpoints import Verdict, training_record_changes
from tpu_rl.compat import AirflowException, AirflowFailException

if TYPE_CHECKING:
    from airflow.sdk import Asset, Context


def orbax_step_verdict(
    bucket: str,
    prefix: str,
    items: Sequence[str] = ("items",),
    gcp_conn_id: str = "google_cloud_default",
    impersonation_chain: str | Sequence[str] | None = None,
) -> tuple[str, Verdict]:
    """One check, now, of an Orbax step folder (``prefix``, e.g. ``.../0/``): its URI and the verdict."""
    from tpu_rl.triggers.checkpoints import OrbaxStepCompleteTrigger

    trigger = OrbaxStepCompleteTrigger(
        bucket, prefix, items=list(items), deadline=time.time(),
        gcp_conn_id=gcp_conn_id, impersonation_chain=impersonation_chain,
    )
    verdict, _ = asyncio.run(trigger.check())
    return trigger.uri, verdict


@dataclass(frozen=True)
class LockState:
    """One generation of a lock object: who wrote it (its JSON), when (the server's clock), which generation."""

    holder: dict[str, Any]
    generation: int
    written: datetime

    def age(self) -> float:
        return (datetime.now(timezone.utc) - self.written).total_seconds()

    def stale_after(self, default: float) -> float:
        try:
            return float(self.holder.get("stale_after_seconds") or default)
        except (TypeError, ValueError):
            return default

    def describe(self) -> str:
        h = self.holder
        return (
            f"run {h.get('run_id')!r} of DAG {h.get('dag_id')!r} (task {h.get('task_id')}, try {h.get('try_number')}, "
            f"since {h.get('created') or self.written.isoformat()})"
        )


class GcsLock:
    """A lock that is one object in Cloud Storage, the only thing every run and Composer component shares.

    Acquiring creates the object only if it does not exist (``if_generation_match=0``: GCS lets exactly one
    concurrent writer succeed); it holds JSON naming the holder (dag id, run id, task id, try, created
    time, and after how many seconds it counts as stale). The same DAG run and task re-acquire their own
    lock from an earlier try (re-entrant: the object is rewritten with the new try and time). A lock older
    than its ``stale_after_seconds`` belongs to a try that cannot be running any more: it is taken over by
    rewriting it with ``if_generation_match=<its generation>``, so of several takers one wins. Releasing
    deletes it, only if it is still ours, with a generation precondition.

    :param client: a ``google.cloud.storage.Client``.
    :param owner: ``dag_id``, ``run_id``, ``task_id`` and ``try_number`` of the task taking it.
    :param stale_after: seconds after which this holder's lock may be taken over (written into the lock).
    """

    IDENTITY = ("dag_id", "run_id", "task_id")

    def __init__(self, client: Any, bucket: str, name: str, owner: Mapping[str, Any], stale_after: float, log: Any):
        self.client = client
        self.bucket = bucket
        self.name = name
        self.owner = dict(owner)
        self.stale_after = stale_after
        self.log = log

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.name}"

    def _blob(self) -> Any:
        return self.client.bucket(self.bucket).blob(self.name)

    def is_ours(self, state: LockState) -> bool:
        return all(state.holder.get(k) == self.owner[k] for k in self.IDENTITY)

    def read(self) -> LockState | None:
        """The lock's current generation, or None when nobody holds it."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        for _ in range(5):
            blob = self.client.bucket(self.bucket).get_blob(self.name)
            if blob is None:
                return None
            try:
                data = blob.download_as_bytes(if_generation_match=blob.generation)
            except (NotFound, PreconditionFailed):  # released or replaced between the two reads
                continue
            try:
                holder = json.loads(data)
                holder = holder if isinstance(holder, dict) else {}
            except ValueError:
                holder = {}
            written = blob.updated or blob.time_created or datetime.now(timezone.utc)
            return LockState(holder, int(blob.generation), written)
        raise AirflowException(f"{self.uri} keeps changing while read")

    def _write(self, if_generation_match: int) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        document = {
            **self.owner,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "stale_after_seconds": int(self.stale_after),
        }
        try:
            self._blob().upload_from_string(
                json.dumps(document, indent=2), content_type="application/json",
                if_generation_match=if_generation_match,
            )
            return True
        except PreconditionFailed:
            return False

    def acquire(self) -> tuple[bool, LockState | None]:
        """``(True, None)`` when this task holds the lock now; ``(False, state)`` when another holds it."""
        for _ in range(10):
            if self._write(if_generation_match=0):
                self.log.info("Acquired %s", self.uri)
                return True, None
            state = self.read()
            if state is None:
                continue  # released in between: try to create it again
            if self.is_ours(state):
                if state.holder.get("try_number") == self.owner.get("try_number"):
                    return True, None
                if self._write(if_generation_match=state.generation):
                    self.log.info("Re-acquired %s, held by an earlier try of this task: %s", self.uri, state.describe())
                    return True, None
                continue
            stale_after = state.stale_after(self.stale_after)
            if state.age() > stale_after:
                if self._write(if_generation_match=state.generation):
                    self.log.warning(
                        "Took over %s: it was held by %s, %.0f s ago, longer than its %.0f s limit (that try "
                        "cannot still be running)", self.uri, state.describe(), state.age(), stale_after,
                    )
                    return True, None
                continue  # another waiter took it over first
            return False, state
        raise AirflowException(f"Could not acquire or read {self.uri}: it keeps changing")

    def release(self) -> bool:
        """Delete the lock if this task (any try) holds it; True if it was deleted."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        state = self.read()
        if state is None or not self.is_ours(state):
            return False
        try:
            self._blob().delete(if_generation_match=state.generation)
        except (NotFound, PreconditionFailed):
            return False
        self.log.info("Released %s", self.uri)
        return True


def check_training_record(
    bucket: str,
    record_object: str,
    parameters: Mapping[str, Any],
    log: Any,
    gcp_conn_id: str = "google_cloud_default",
    impersonation_chain: str | Sequence[str] | None = None,
) -> str:
    """Records a run's training parameters next to its checkpoints on the first attempt, and refuses
    (AirflowFailException) any later attempt whose parameters differ. Returns the record's URI."""
    from google.api_core.exceptions import NotFound

    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    uri = f"gs://{bucket}/{record_object}"
    current = json.loads(json.dumps(dict(parameters)))  # As it reads back from JSON.
    hook = GCSHook(gcp_conn_id=gcp_conn_id, impersonation_chain=impersonation_chain)
    blob = hook.get_conn().bucket(bucket).blob(record_object)
    try:
        recorded = json.loads(blob.download_as_bytes())["parameters"]
    except NotFound:
        blob.upload_from_string(
            json.dumps({"parameters": current}, indent=2, sort_keys=True),
            content_type="application/json",
            if_generation_match=0,
        )
        log.info("Recorded the run's training parameters in %s", uri)
        return uri
    if changes := training_record_changes(recorded, current):
        raise AirflowFailException(
            f"Refusing to resume the run recorded in {uri}: its checkpoints were trained with other "
            f"parameters ({'; '.join(changes)}). Start a new DAG run, or restore the recorded values."
        )
    log.info("Training parameters match %s: resuming the same run", uri)
    return uri


class TrainingRecordCheckOperator(BaseOperator):
    """Records a run's training parameters next to its checkpoints, and refuses a resume that changes them.

    ``train_rl`` resumes from the latest checkpoint of the same run and fast-forwards the data;
    changing ``num_batches``, ``batch_size``, the dataset or the model under it corrupts the run
    silently. Run this before launching a training attempt (the DAG's ``train_rl`` also runs
    :func:`check_training_record` before each submission).

    :param bucket: bucket name, without ``gs://``.
    :param record_object: ``GcsLayout.training_record_object``.
    :param parameters: the parameters that must not change within a run (plain JSON values).

    XCom return value: the record's ``gs://`` URI.
    """

    template_fields: Sequence[str] = ("bucket", "record_object", "parameters", "gcp_conn_id")

    def __init__(
        self,
        *,
        bucket: str,
        record_object: str,
        parameters: Mapping[str, Any],
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.bucket = bucket
        self.record_object = record_object
        self.parameters = parameters
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain

    def execute(self, context: Context) -> str:
        return check_training_record(
            self.bucket, self.record_object, self.parameters, self.log, self.gcp_conn_id, self.impersonation_chain
        )


class PublishHfExportOperator(BaseOperator):
    """Copies a verified export attempt to the model's final location and emits its Asset event.

    Stale objects at the destination (an earlier, larger export) are deleted first; objects are copied
    server-side (rewrite), and the destination is compared with the source by names and sizes before
    the event tells downstream DAGs the model is there.

    :param bucket: bucket name, without ``gs://``.
    :param source_prefix: the verified attempt, ``GcsLayout.export_attempt_prefix(n)``.
    :param destination_prefix: ``GcsLayout.export_prefix``.
    :param asset: the Asset downstream DAGs schedule on; also declared as this task's outlet.
    :param final_step: the training step exported (the final checkpoint sensor's XCom).
    :param source_run: ``gs://`` URI of the training run the model comes from.

    XCom return value: the published ``gs://`` URI. Asset event extra: ``uri``, ``final_step``, ``source_run``.
    """

    template_fields: Sequence[str] = (
        "bucket", "source_prefix", "destination_prefix", "final_step", "source_run", "gcp_conn_id"
    )

    def __init__(
        self,
        *,
        bucket: str,
        source_prefix: str,
        destination_prefix: str,
        asset: Asset,
        final_step: int | str,
        source_run: str,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(outlets=[asset], **kwargs)
        self.bucket = bucket
        self.source_prefix = source_prefix
        self.destination_prefix = destination_prefix
        self.asset = asset
        self.final_step = final_step
        self.source_run = source_run
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain

    def execute(self, context: Context) -> str:
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        source, destination = self.source_prefix, self.destination_prefix
        if not (source.endswith("/") and destination.endswith("/")):
            raise ValueError("source_prefix and destination_prefix must be folders ending in '/'")
        if source.startswith(destination) or destination.startswith(source):
            raise ValueError(f"{source} and {destination} overlap")
        hook = GCSHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)
        client = hook.get_conn()

        def sizes(prefix: str) -> dict[str, int]:
            return {b.name[len(prefix) :]: b.size for b in client.list_blobs(self.bucket, prefix=prefix)}

        expected = sizes(source)
        if not expected:
            raise AirflowException(f"Nothing to publish under gs://{self.bucket}/{source}")
        stale = sizes(destination)
        for name in stale:
            hook.delete(self.bucket, destination + name)
        self.log.info("Cleared %d objects at gs://%s/%s", len(stale), self.bucket, destination)
        for name in expected:
            hook.rewrite(self.bucket, source + name, self.bucket, destination + name)
        published = sizes(destination)
        if published != expected:
            differ = sorted(n for n in expected.keys() | published.keys() if expected.get(n) != published.get(n))
            raise AirflowException(f"Published copy differs from the verified export in: {differ[:10]}")

        uri = f"gs://{self.bucket}/{destination}"
        context["outlet_events"][self.asset].extra = {
            "uri": uri,
            "final_step": int(self.final_step),
            "source_run": self.source_run,
        }
        self.log.info("Published %d objects to %s", len(published), uri)
        return uri
