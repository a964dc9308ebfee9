"""The training's progress, read by the JobSet trigger from the trainer's TensorBoard event files in the
bucket (through :class:`~tpu_rl.hooks.gcs.EventFileFolder`: of each file only the bytes the trainer added since
the last read), logged at most once per interval."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from tpu_rl.hooks.gcs import EventFileFolder, GcsReader
from tpu_rl.training_metrics import attempt_progress, attempt_step

#: Seconds between two reads, and so between two progress lines, while the training runs.
PROGRESS_INTERVAL_SECONDS = 60


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
        self.events = EventFileFolder(self.prefix)
        self.logged_at: float | None = None
        #: The event files' sizes when the last line was logged.
        self.logged_sizes: dict[str, int] = {}

    def due(self) -> bool:
        """Whether a line may be logged now: none in the last ``interval`` (less a second: the event loop may
        wake a waiter a little early)."""
        return self.logged_at is None or time.monotonic() - self.logged_at >= self.interval - 1

    async def report(
        self, reader: GcsReader, log: Any, attempt_started: float | None = None, only_news: bool = False
    ) -> None:
        """Read what changed and log the progress line (nothing before the trainer wrote its first file).
        ``attempt_started``: when the JobSet of the current attempt was created (POSIX seconds); ``only_news``:
        log only if the event files grew since the last line."""
        started = time.monotonic()
        await self.events.refresh(reader)
        sizes = self.events.sizes()
        if only_news and sizes == self.logged_sizes:
            return
        line = attempt_progress(self.events.scalars(), self.train_steps, time.time(), attempt_started)
        if line:
            log.info("Training progress: %s", line)
            self.logged_at, self.logged_sizes = started, sizes

    def step(self, attempt_started: float | None = None) -> int | None:
        """The current attempt's newest step, as last read (None: none yet)."""
        return attempt_step(self.events.scalars(), attempt_started)
