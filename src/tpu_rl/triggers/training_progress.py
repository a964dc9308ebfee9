"""The training's progress, read by the JobSet trigger from the trainer's TensorBoard event files in the
bucket: one listing of their folder per read, and of each event file only the bytes the trainer added since
the last read (GCS replaces the object at each flush, with the earlier bytes unchanged)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tpu_rl.hooks.gcs import GcsReader
from tpu_rl.training_metrics import Scalars, attempt_progress, is_event_file, read_scalars

#: Seconds between two reads, and so between two progress lines, while the training runs.
PROGRESS_INTERVAL_SECONDS = 60


@dataclass(frozen=True)
class _EventFile:
    size: int
    updated: datetime
    data: bytes
    scalars: Scalars


class TrainingProgress:
    """What the trigger read of the event files under ``prefix`` so far, and when it last logged a line.

    :param source: ``bucket``, ``prefix`` (``GcsLayout.tensorboard_prefix``), ``train_steps``, ``gcp_conn_id``
        and ``interval`` (seconds, default :data:`PROGRESS_INTERVAL_SECONDS`): the trigger's serialised
        ``training`` keyword.
    """

    def __init__(self, source: Mapping[str, Any]) -> None:
        self.bucket = source["bucket"]
        self.prefix = source["prefix"]
        self.train_steps = int(source["train_steps"])
        self.gcp_conn_id = source.get("gcp_conn_id") or "google_cloud_default"
        self.interval = float(source.get("interval") or PROGRESS_INTERVAL_SECONDS)
        self.files: dict[str, _EventFile] = {}
        self.logged_at: float | None = None
        #: The event files' sizes when the last line was logged.
        self.logged_sizes: dict[str, int] = {}

    def due(self) -> bool:
        """Whether a line may be logged now: none in the last ``interval`` (less a second: the event loop may
        wake a waiter a little early)."""
        return self.logged_at is None or time.monotonic() - self.logged_at >= self.interval - 1

    async def refresh(self, reader: GcsReader) -> None:
        """List the folder once; read only the event files that changed, only their new bytes when they grew."""
        listing, _ = await reader.list(self.prefix)
        for name, stored in sorted(listing.items()):
            known = self.files.get(name)
            if (
                not is_event_file(name)
                or not stored.size
                or (known and (known.size, known.updated) == (stored.size, stored.updated))
            ):
                continue
            if known and stored.size > known.size:
                data = known.data + await reader.read(self.prefix + name, known.size, stored.size - 1)
            else:
                data = await reader.read(self.prefix + name)
            # Parsing is CPU work: off the triggerer's event loop.
            scalars = await asyncio.to_thread(read_scalars, [data])
            self.files[name] = _EventFile(stored.size, stored.updated, data, scalars)

    async def report(
        self, reader: GcsReader, log: Any, attempt_started: float | None = None, only_news: bool = False
    ) -> None:
        """Read what changed and log the progress line (nothing before the trainer wrote its first file).
        ``attempt_started``: when the JobSet of the current attempt was created (POSIX seconds); ``only_news``:
        log only if the event files grew since the last line."""
        started = time.monotonic()
        await self.refresh(reader)
        sizes = {name: f.size for name, f in self.files.items()}
        if only_news and sizes == self.logged_sizes:
            return
        line = attempt_progress(
            {name: f.scalars for name, f in self.files.items()}, self.train_steps, time.time(), attempt_started
        )
        if line:
            log.info("Training progress: %s", line)
            self.logged_at, self.logged_sizes = started, sizes
