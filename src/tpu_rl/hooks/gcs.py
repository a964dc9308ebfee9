"""Cloud Storage I/O of the pipeline, in one place.

- :class:`GcsReadHook` runs read-only checks of a bucket's objects, each in a fresh HTTP session, from a
  trigger's poll (``await hook.run``) or from synchronous code, a sensor's poke or an operator (``run_now``);
  the checks a stage's output is waited on with are the objects of :mod:`tpu_rl.output_checks`.
- The reads behind them (:func:`orbax_step`, :func:`final_training_step`, :func:`hf_export`, :func:`read_lock`)
  list objects and read only the small documents the rules in :mod:`tpu_rl.checkpoints` need: a few listing
  pages, never a download of a checkpoint. They return the rules' verdict; triggers and sensors decide.
- :class:`GcsBucketHook` is one bucket through ``google-cloud-storage``: what publishing the export does (sizes,
  deletes, server-side copies), the folder move that sets a step folder aside before a resume, and its JSON
  objects; :func:`training_state` reads what a preempted training left.
- :class:`GcsJsonObject` is a small JSON object several runs write at once (a lease, the training record, the
  lock): written only while the generation it was read at is current.
- :class:`GcsLock` is the cross-run lock on a shared conversion, and :func:`parse_lock_holder` and
  :class:`LockState` the one reading of a lock object (its JSON, its age, when it counts as stale), for
  the lock and for the trigger that waits on it.

Only light imports at module level (the DAG file imports the operators that import this): the Google
clients and aiohttp are imported where they are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from tpu_rl import checkpoints as rules
from tpu_rl.checkpoints import StoredObject, Verdict
from tpu_rl.compat import AirflowException
from tpu_rl.hooks.backoff import REQUEST_ATTEMPTS, backoff_seconds
from tpu_rl.hooks.google_credentials import warm_google_credentials
from tpu_rl.hooks.in_thread import in_thread
from tpu_rl.timestamps import parse_optional_time, parse_time

if TYPE_CHECKING:
    from tpu_rl.training_metrics import GrowingEventFile, Scalars

T = TypeVar("T")


# -- reading a bucket ----------------------------------------------------------------------------------


#: Cloud Storage's answers to make a request again after ("Retry strategy": 408, 429 and 5xx; connection errors
#: too). gcloud-aio, the Google provider's async client, retries none of them.
RETRYABLE_STATUSES = (408, 429, 500, 502, 503, 504)


class GcsReader:
    """Lists and reads one bucket's objects with the gcloud-aio client that GCSAsyncHook provides, and writes the
    small documents a wait keeps for whoever takes it over (a trigger's log cursor). Every request is made again
    after an answer Cloud Storage says to retry (:data:`RETRYABLE_STATUSES`), with backoff
    (:mod:`tpu_rl.hooks.backoff`); reads and these small whole-object writes are safe to repeat."""

    def __init__(self, storage: Any, bucket: str) -> None:
        self.storage = storage
        self.bucket = bucket

    async def _retried(self, call: Callable[[], Awaitable[T]]) -> T:
        from aiohttp import ClientConnectionError, ClientResponseError

        for attempt in range(1, REQUEST_ATTEMPTS):
            try:
                return await call()
            except ClientResponseError as e:
                if e.status not in RETRYABLE_STATUSES:
                    raise
            except (ClientConnectionError, TimeoutError):
                pass
            await asyncio.sleep(backoff_seconds(attempt))
        return await call()

    async def list(self, prefix: str, delimiter: str | None = None) -> tuple[dict[str, StoredObject], list[str]]:
        """Objects under ``prefix`` keyed by name relative to it, and the sub-folders (with a delimiter)."""
        params = {"prefix": prefix, **({"delimiter": delimiter} if delimiter else {})}
        objects: dict[str, StoredObject] = {}
        folders: list[str] = []
        while True:
            page = await self._retried(lambda: self.storage.list_objects(self.bucket, params=dict(params)))
            for item in page.get("items", []):
                name = item["name"][len(prefix) :]
                generation = int(item.get("generation") or 0)
                objects[name] = StoredObject(name, int(item["size"]), parse_time(item["updated"]), generation)
            folders += [p[len(prefix) :] for p in page.get("prefixes", [])]
            if not page.get("nextPageToken"):
                return objects, folders
            params["pageToken"] = page["nextPageToken"]

    async def read(self, name: str, first: int | None = None, last: int | None = None) -> bytes:
        """An object's bytes, or only bytes ``first..last`` (inclusive) with a ranged download."""
        headers = {"Range": f"bytes={first}-{last}"} if first is not None else None
        return await self._retried(lambda: self.storage.download(self.bucket, name, headers=headers))

    async def read_json(self, name: str) -> Any:
        """A JSON object's document, or None when there is no such object."""
        from aiohttp import ClientResponseError

        try:
            return json.loads(await self.read(name))
        except ClientResponseError as e:
            if e.status == 404:
                return None
            raise

    async def write_json(self, name: str, document: Any) -> None:
        """Replaces (or creates) a small JSON object."""
        text = json.dumps(document)
        await self._retried(lambda: self.storage.upload(self.bucket, name, text, content_type="application/json"))


class GcsReadHook:
    """Runs a check (an async function of a :class:`GcsReader`) against one bucket, in a fresh HTTP session.

    :param gcp_conn_id: the Google Cloud connection (a service account to impersonate is its
        ``impersonation_chain`` field, which every Google hook reads).
    """

    def __init__(self, gcp_conn_id: str = "google_cloud_default") -> None:
        self.gcp_conn_id = gcp_conn_id
        self._hook: Any = None

    async def run(self, bucket: str, check: Callable[[GcsReader], Awaitable[T]]) -> T:
        async with self.reader(bucket) as reader:
            return await check(reader)

    @contextlib.asynccontextmanager
    async def reader(self, bucket: str) -> AsyncIterator[GcsReader]:
        """A reader on one HTTP session and one access token, for a watch that reads again and again (the
        token is refreshed when it expires, not fetched for every read). The provider's module (Cloud Storage's
        clients with it) is imported, and the credentials read, in a thread: on a trigger's event loop they would
        stall every trigger."""
        from aiohttp import ClientSession

        if self._hook is None:
            module = await in_thread(importlib.import_module, "airflow.providers.google.cloud.hooks.gcs")
            self._hook = module.GCSAsyncHook(gcp_conn_id=self.gcp_conn_id)
            await warm_google_credentials(self._hook)
        async with ClientSession() as session:
            yield GcsReader(await self._hook.get_storage_client(session), bucket)

    def run_now(self, bucket: str, check: Callable[[GcsReader], Awaitable[T]]) -> T:
        """:meth:`run` from synchronous code (a sensor's poke, an operator)."""
        return asyncio.run(self.run(bucket, check))


# -- event files ------------------------------------------------------------------------------------------


@dataclass
class EventFile:
    """One TensorBoard event file as last listed, and its curves read so far."""

    listed: StoredObject
    curves: GrowingEventFile

    def unchanged(self, listed: StoredObject) -> bool:
        """Whether the listing shows the version already read (the same generation, size and time)."""
        known = self.listed
        return (self.curves.size, known.generation, known.updated) == (listed.size, listed.generation, listed.updated)


class EventFileFolder:
    """The TensorBoard event files under ``prefix``, read incrementally: one listing a read, and of each event file
    only the bytes its writer added since the last read, parsed alone (the kept curves take their scalars; no file's
    bytes are kept). The training's progress (the JobSet trigger) and the Training tab read the trainer's through it.

    Why reading only the new bytes is right: an event file's writer only appends records, and tensorboardX's GCS
    writer uploads the whole, longer file at each flush: a new generation whose first bytes are the ones read. A
    new generation that is not longer than what was read (the object was replaced, or written again) is read
    again from its first byte; an object no longer listed is dropped."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        #: What was read so far, by file name (the name under ``prefix``).
        self.files: dict[str, EventFile] = {}

    async def refresh(self, reader: GcsReader) -> None:
        """List the folder once; read only the event files that changed, only their new bytes when they grew."""
        from tpu_rl.training_metrics import GrowingEventFile, is_event_file

        listing, _ = await reader.list(self.prefix)
        listed = {name: stored for name, stored in sorted(listing.items()) if is_event_file(name) and stored.size}
        self.files = {name: file for name, file in self.files.items() if name in listed}
        for name, stored in listed.items():
            # Out of the folder while it is read: a read that fails or is cancelled (its parse may go on in its
            # thread) leaves no half-fed file behind; the next refresh reads that file from its first byte.
            known = self.files.pop(name, None)
            if known and known.unchanged(stored):
                self.files[name] = known
                continue
            if known and stored.size > known.curves.size:
                curves, first = known.curves, known.curves.size
            else:
                curves, first = GrowingEventFile(), 0
            piece = await self._read(reader, name, first, stored.size - 1)
            if piece is None:  # replaced or deleted since the listing: the next read starts over
                continue
            # Parsing is CPU work: off a triggerer's (or the api-server's) event loop.
            await in_thread(curves.feed, piece)
            self.files[name] = EventFile(stored, curves)

    async def _read(self, reader: GcsReader, name: str, first: int, last: int) -> bytes | None:
        """Bytes ``first..last`` of an event file; None when the object shrank or went since it was listed."""
        from aiohttp import ClientResponseError

        try:
            return await reader.read(self.prefix + name, first, last)
        except ClientResponseError as error:
            if error.status in (404, 416):  # 416: the range starts past a shorter object's end
                return None
            raise

    def scalars(self) -> dict[str, Scalars]:
        """Each event file's scalars, by file name."""
        return {name: file.curves.scalars() for name, file in self.files.items()}

    def sizes(self) -> dict[str, int]:
        return {name: file.curves.size for name, file in self.files.items()}

    def points(self) -> int:
        """The (step, value) points kept of all the files: what the folder costs in memory."""
        return sum(file.curves.points() for file in self.files.values())


# -- the checks of a stage's output --------------------------------------------------------------------


async def probe_orbax_step(reader: GcsReader, step_prefix: str, label: str, items: Sequence[str]) -> Verdict:
    """Whether the Orbax step folder ``step_prefix`` holds a committed, whole save (``label`` names it)."""
    listing, _ = await reader.list(step_prefix)
    documents = {
        name: (await reader.read(step_prefix + name) if name in listing else None)
        for name in rules.orbax_documents(items)
    }
    return rules.check_orbax_step(label, listing, documents, items)


async def orbax_step(reader: GcsReader, prefix: str, items: Sequence[str]) -> tuple[Verdict, dict[str, Any]]:
    """An Orbax step folder (``prefix``, e.g. ``.../0/``): its verdict; nothing else to report."""
    label = prefix.rstrip("/").rsplit("/", 1)[-1] + "/"
    return await probe_orbax_step(reader, prefix, label, items), {}


async def final_training_step(
    reader: GcsReader,
    prefix: str,
    *,
    train_steps: int,
    checkpoint_period: int,
    items: Sequence[str],
    trainer_completed: bool,
) -> tuple[Verdict, dict[str, Any]]:
    """The run's final step under ``checkpoints/actor/`` (``prefix``), and whether its save is whole."""
    _, folders = await reader.list(prefix, delimiter="/")
    step, uncommitted = None, []
    for candidate in rules.step_numbers(folders):  # Orbax ignores steps without commit_success.txt.
        marker, _ = await reader.list(f"{prefix}{candidate}/{rules.COMMIT_SUCCESS}")
        if "" in marker:  # The marker's own name, relative to itself.
            step = candidate
            break
        uncommitted.append(candidate)
    verdict = rules.check_final_step(step, train_steps, checkpoint_period, uncommitted, trainer_completed)
    if not verdict.complete:
        return verdict, {"step": step}
    verdict, warning = rules.as_restored(await probe_orbax_step(reader, f"{prefix}{step}/", f"actor/{step}/", items))
    return verdict, {"step": step, **({"warning": f"actor/{step}/ is committed, but {warning}"} if warning else {})}


@dataclass(frozen=True)
class TrainingState:
    """What a preempted training left in the bucket: its step folders' verdicts (newest first, down to the newest
    complete one), when that one was committed, and the last step the trainer logged or started to save."""

    steps: list[tuple[int, Verdict]]
    committed_at: datetime | None
    last_step: int


async def training_state(
    reader: GcsReader, actor_prefix: str, tensorboard_prefix: str, items: Sequence[str]
) -> TrainingState:
    """Reads the step folders under ``actor_prefix`` from the newest down to the first complete one, and the
    last step of the policy's loss in the TensorBoard event files (the trainer's progress)."""
    from tpu_rl import training_metrics

    _, folders = await reader.list(actor_prefix, delimiter="/")
    numbers = rules.step_numbers(folders)
    steps, committed_at = [], None
    for step in numbers:
        verdict = await probe_orbax_step(reader, f"{actor_prefix}{step}/", f"actor/{step}/", items)
        steps.append((step, verdict))
        if rules.is_committed(verdict):  # the step Orbax restores (rules.plan_resume)
            marker, _ = await reader.list(f"{actor_prefix}{step}/{rules.COMMIT_SUCCESS}")
            committed_at = marker[""].updated if "" in marker else None
            break
    events, _ = await reader.list(tensorboard_prefix)
    files = [
        await reader.read(tensorboard_prefix + name) for name in sorted(events) if training_metrics.is_event_file(name)
    ]
    loss = training_metrics.read_scalars(files).get(training_metrics.LOSS_TAG, []) if files else []
    logged = loss[-1][0] if loss else 0
    return TrainingState(steps, committed_at, max(numbers[:1] + [logged]))


async def _shard_problem(reader: GcsReader, prefix: str, shard: StoredObject) -> str | None:
    if shard.size < 8:
        return f"{shard.name}: only {shard.size} bytes"
    length = rules.safetensors_header_length(await reader.read(prefix + shard.name, 0, 7))
    header = None
    if 0 < length <= min(shard.size - 8, rules.MAX_SAFETENSORS_HEADER):
        header = await reader.read(prefix + shard.name, 8, 8 + length - 1)
    return rules.check_shard(shard.name, shard.size, length, header)


async def hf_export(
    reader: GcsReader, prefix: str, *, not_before: str | None, also_required: Sequence[str] = ()
) -> tuple[Verdict, dict[str, Any]]:
    """Whether a Hugging Face export under ``prefix`` is whole (with ``also_required``) and written since
    ``not_before``."""
    listing, _ = await reader.list(prefix)
    index = await reader.read(prefix + rules.HF_INDEX) if rules.HF_INDEX in listing else None
    shards, index_verdict = rules.expected_shards(listing, index)
    problems = list(index_verdict.problems)
    for name in shards:
        if name in listing and (problem := await _shard_problem(reader, prefix, listing[name])):
            problems.append(problem)
    verdict = rules.check_hf_export(listing, shards, problems, parse_optional_time(not_before), also_required)
    return verdict, {"shards": len(shards)}


# -- small documents, read and written with google-cloud-storage ----------------------------------------


def storage_client(gcp_conn_id: str = "google_cloud_default") -> Any:
    """A ``google.cloud.storage.Client`` through the Google provider's GCSHook (the connection's credentials)."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    return GCSHook(gcp_conn_id=gcp_conn_id).get_conn()


@dataclass(frozen=True)
class StoredJson:
    """One generation of a JSON object: its bytes, its generation, when it was written (the server's clock)."""

    data: bytes
    generation: int
    written: datetime

    def document(self) -> Any:
        return json.loads(self.data)


class GcsJsonObject:
    """A small JSON object several runs (and Composer components) may write at once: read with its generation,
    written only while that generation is still current (``if_generation_match``; 0: only while absent), so
    of two writers one wins and the other reads again. The lease documents, the training record and the
    conversion lock are such objects.

    :param client: a ``google.cloud.storage.Client`` (:meth:`GcsBucketHook.json_object` gives one its bucket's).
    """

    def __init__(self, client: Any, bucket: str, name: str) -> None:
        self.client, self.bucket, self.name = client, bucket, name

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.name}"

    def read(self, attempts: int = 5) -> StoredJson | None:
        """Its current generation, or None when it does not exist. The download asks for the generation the
        metadata named, so the bytes and the generation belong together."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        for _ in range(attempts):
            blob = self.client.bucket(self.bucket).get_blob(self.name)
            if blob is None:
                return None
            try:
                data = blob.download_as_bytes(if_generation_match=blob.generation)
            except (NotFound, PreconditionFailed):  # deleted or replaced between the two reads
                continue
            return StoredJson(data, int(blob.generation), blob.updated or blob.time_created or datetime.now(UTC))
        raise AirflowException(f"{self.uri} keeps changing while read")

    def write(self, document: Any, generation: int) -> bool:
        """Writes ``document`` (JSON text as it is, anything else serialised) if the object is still at
        ``generation`` (0: still absent); False when another writer came first (or deleted it)."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        text = document if isinstance(document, str) else json.dumps(document, indent=2, sort_keys=True)
        try:
            self.client.bucket(self.bucket).blob(self.name).upload_from_string(
                text, content_type="application/json", if_generation_match=generation
            )
            return True
        except (PreconditionFailed, NotFound):
            return False

    def delete(self, generation: int) -> bool:
        """Deletes it if it is still at ``generation``; False when it changed or is gone."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        try:
            self.client.bucket(self.bucket).blob(self.name).delete(if_generation_match=generation)
            return True
        except (NotFound, PreconditionFailed):
            return False

    def read_or_create(self, document: Any) -> tuple[bool, Any]:
        """``(False, its JSON)`` when it exists; else ``(True, None)`` once ``document`` is written there."""
        for _ in range(5):
            stored = self.read()
            if stored is not None:
                return False, stored.document()
            if self.write(document, generation=0):
                return True, None
        raise AirflowException(f"{self.uri} keeps changing while it is created")

    def update(self, change: Callable[[Any], Any], attempts: int = 5) -> Any:
        """Rewrites the existing object with ``change(its JSON)``, reading and changing again after another
        writer came first. Returns the document written."""
        for _ in range(attempts):
            stored = self.read()
            if stored is None:
                raise AirflowException(f"{self.uri} does not exist")
            document = change(stored.document())
            if self.write(document, stored.generation):
                return document
        raise AirflowException(f"{self.uri} kept changing while it was updated ({attempts} attempts)")


# -- one bucket, through google-cloud-storage ---------------------------------------------------------------


class GcsBucketHook:
    """One bucket through a ``google.cloud.storage.Client`` of the connection (made on first use, through the
    Google provider's GCSHook, and kept: one per task execution): the sizes of a folder's objects, deletes,
    server-side copies and folder moves, and its small JSON objects (:class:`GcsJsonObject`).

    :param client: a client to share (e.g. with :meth:`other`), instead of one made from ``gcp_conn_id``.
    """

    def __init__(self, bucket: str, gcp_conn_id: str = "google_cloud_default", *, client: Any = None) -> None:
        self.bucket, self.gcp_conn_id, self._client = bucket, gcp_conn_id, client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = storage_client(self.gcp_conn_id)
        return self._client

    def other(self, bucket: str) -> GcsBucketHook:
        """Another bucket, through the same client."""
        return GcsBucketHook(bucket, self.gcp_conn_id, client=self.client)

    def uri(self, name: str = "") -> str:
        return f"gs://{self.bucket}/{name}"

    def json_object(self, name: str) -> GcsJsonObject:
        return GcsJsonObject(self.client, self.bucket, name)

    def object_sizes(self, prefix: str) -> dict[str, int]:
        """The sizes of the objects under ``prefix``, keyed by name relative to it."""
        return {blob.name[len(prefix) :]: blob.size for blob in self.client.list_blobs(self.bucket, prefix=prefix)}

    def delete_objects(self, names: Iterable[str]) -> None:
        """Deletes them; one already gone is not an error (google-cloud-storage retries a delete whose answer was
        lost, and the second try finds nothing)."""
        from google.api_core.exceptions import NotFound

        handle = self.client.bucket(self.bucket)
        for name in names:
            with contextlib.suppress(NotFound):
                handle.blob(name).delete()

    def rewrite_object(self, source: str, destination: str) -> None:
        """A server-side copy within the bucket (a rewrite, continued until GCS says it is done)."""
        from google.cloud.storage.retry import DEFAULT_RETRY

        handle = self.client.bucket(self.bucket)
        token = None
        while True:
            # Retried like a read (google-cloud-storage retries a rewrite only with a precondition): copying the
            # same source again gives the same object.
            token, _, _ = handle.blob(destination).rewrite(handle.blob(source), token=token, retry=DEFAULT_RETRY)
            if token is None:
                return

    def move_folder(self, source: str, destination: str) -> int:
        """Copies every object under ``source`` to ``destination`` (server-side), then deletes the originals:
        nothing is removed before its copy exists. Returns how many objects moved."""
        names = list(self.object_sizes(source))
        for name in names:
            self.rewrite_object(source + name, destination + name)
        self.delete_objects([source + name for name in names])
        return len(names)


# -- the conversion lock ---------------------------------------------------------------------------------


def parse_lock_holder(data: bytes) -> dict[str, Any]:
    """A lock object's JSON (who holds it); {} when it is not a JSON object."""
    try:
        holder = json.loads(data)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


@dataclass(frozen=True)
class LockState:
    """One generation of a lock object: who wrote it (its JSON), when (the server's clock), which generation."""

    holder: dict[str, Any]
    generation: int
    written: datetime

    def age(self) -> float:
        return (datetime.now(UTC) - self.written).total_seconds()

    def stale_after(self, default: float) -> float:
        """The holder's own limit (``stale_after_seconds``), else ``default``."""
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


async def read_lock(reader: GcsReader, lock_object: str) -> LockState | None:
    """The lock's current state, or None when nobody holds it."""
    from aiohttp import ClientResponseError

    page = await reader.storage.list_objects(reader.bucket, params={"prefix": lock_object})
    item = next((i for i in page.get("items", []) if i["name"] == lock_object), None)
    if item is None:
        return None
    try:
        data = await reader.read(lock_object)
    except ClientResponseError as error:
        if error.status == 404:
            return None
        raise
    written = parse_time(item.get("updated") or item["timeCreated"])
    return LockState(parse_lock_holder(data), int(item.get("generation") or 0), written)


class GcsLock:
    """A lock that is one object in Cloud Storage, the only thing every run and Composer component shares.

    Acquiring creates the object only if it does not exist (``if_generation_match=0``: GCS lets exactly one
    concurrent writer succeed); it holds JSON naming the holder (dag id, run id, task id, try, created
    time, and after how many seconds it counts as stale). The same DAG run and task re-acquire their own
    lock from an earlier try (re-entrant: the object is rewritten with the new try and time). A lock older
    than its ``stale_after_seconds`` belongs to a try that cannot be running any more: it is taken over by
    rewriting it with ``if_generation_match=<its generation>``, so of several takers one wins. Releasing
    deletes it, only if it is still ours, with a generation precondition.

    :param lock_object: the lock's object (:meth:`GcsBucketHook.json_object`).
    :param owner: ``dag_id``, ``run_id``, ``task_id`` and ``try_number`` of the task taking it.
    :param stale_after: seconds after which this holder's lock may be taken over (written into the lock).
    """

    IDENTITY = ("dag_id", "run_id", "task_id")

    def __init__(self, lock_object: GcsJsonObject, owner: Mapping[str, Any], stale_after: float, log: Any):
        self.object = lock_object
        self.owner = dict(owner)
        self.stale_after = stale_after
        self.log = log

    @property
    def uri(self) -> str:
        return self.object.uri

    def is_ours(self, state: LockState) -> bool:
        return all(state.holder.get(k) == self.owner[k] for k in self.IDENTITY)

    def read(self) -> LockState | None:
        """The lock's current generation, or None when nobody holds it."""
        stored = self.object.read()
        return None if stored is None else LockState(parse_lock_holder(stored.data), stored.generation, stored.written)

    def _write(self, if_generation_match: int) -> bool:
        document = {
            **self.owner,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "stale_after_seconds": int(self.stale_after),
        }
        return self.object.write(document, if_generation_match)

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
                        "cannot still be running)",
                        self.uri,
                        state.describe(),
                        state.age(),
                        stale_after,
                    )
                    return True, None
                continue  # another waiter took it over first
            return False, state
        raise AirflowException(f"Could not acquire or read {self.uri}: it keeps changing")

    def release(self) -> bool:
        """Delete the lock if this task (any try) holds it; True if it was deleted."""
        state = self.read()
        if state is None or not self.is_ours(state) or not self.object.delete(state.generation):
            return False
        self.log.info("Released %s", self.uri)
        return True
