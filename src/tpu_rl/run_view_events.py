"""The Training tab's event files, kept between page views in the api-server's process.

Without it every view of a run's page listed the run's TensorBoard folder, downloaded every event file whole and
parsed all of it: with a 72-hour run's files and the page reloading itself every minute, the api-server's heaviest
request. Here each (Google Cloud connection, bucket, prefix) keeps one :class:`~tpu_rl.hooks.gcs.EventFileFolder`
between views, so a view after the first costs a listing and the bytes the trainer added since the view before.

Why a kept folder shows what a fresh one would: an event file only grows (its writer appends records, and
tensorboardX's GCS writer uploads the whole, longer file as a new generation), and the folder reads a generation
that is not longer than what it read again from its first byte, and drops a file no longer listed. Views of one run
at the same time take turns on its folder (an ``asyncio.Lock`` each): the first reads the new bytes, the next finds
them read; two never feed one file at once, which would parse its bytes twice or out of order.

Bounded: at most :data:`MAX_FOLDERS` folders and :data:`MAX_POINTS` points, the least recently viewed dropped
first (the folder a view has just read stays, whatever its size). The cache and its locks belong to the event loop
of the api-server's worker process that made them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tpu_rl.hooks.gcs import EventFileFolder

#: Runs whose event files are kept: the runs a team looks at in a day.
MAX_FOLDERS = 32
#: (step, value) points kept of all runs, about 110 MiB: a 72-hour run (a step every 45 s, MaxText's 19 curves and
#: the step times) keeps 115,000 points, 13 MiB in the api-server (``make bench-run-view``); eight such runs fit.
MAX_POINTS = 1_000_000


@dataclass
class _Entry:
    folder: EventFileFolder
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class EventFileCache:
    """One :class:`EventFileFolder` per (connection, bucket, prefix), least recently viewed dropped first."""

    def __init__(self, max_folders: int = MAX_FOLDERS, max_points: int = MAX_POINTS) -> None:
        self.max_folders, self.max_points = max_folders, max_points
        self._entries: OrderedDict[tuple[str, str, str], _Entry] = OrderedDict()

    @contextlib.asynccontextmanager
    async def folder(self, gcp_conn_id: str, bucket: str, prefix: str) -> AsyncIterator[EventFileFolder]:
        """The run's folder as last read, for this view alone until the block ends."""
        key = (gcp_conn_id, bucket, prefix)
        entry = self._entries.get(key) or _Entry(EventFileFolder(prefix))
        self._entries[key] = entry
        self._entries.move_to_end(key)
        async with entry.lock:
            yield entry.folder
        self._shrink(keep=key)

    def _shrink(self, keep: tuple[str, str, str]) -> None:
        """Drops the least recently viewed folders beyond the bounds (never ``keep``)."""
        points = sum(entry.folder.points() for entry in self._entries.values())
        for key in list(self._entries):
            if len(self._entries) <= self.max_folders and points <= self.max_points:
                return
            if key != keep:
                points -= self._entries.pop(key).folder.points()

    def __len__(self) -> int:
        return len(self._entries)
