"""The workload's log, followed by a JobSet trigger into the task log.

Which pod to follow (the workload pod of the latest restart attempt), one stream at a time, reconnects that
repeat no line, and each line logged once even when the wait moves to another triggerer (a record on the
JobSet). Beside the trigger, as the cncf provider keeps its pod log consumer beside the pod operator: the
trigger owns the JobSet, this module its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import secrets
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from tpu_rl import jobset_status as st
from tpu_rl.hooks.kubernetes import AsyncKubernetesApiHook
from tpu_rl.timestamps import parse_time
from tpu_rl.training_metrics import kept_line_kind
from tpu_rl.vocabulary import ANNOTATION_LOG_CURSOR, ANNOTATION_LOG_UPLOADED_PREFIX

if TYPE_CHECKING:
    from tpu_rl.triggers.wait_progress import Progress

T = TypeVar("T")

#: After the JobSet finished, how long the log stream may take to deliver the last lines.
LOG_DRAIN_SECONDS = 10
#: A pod's log stream is closed this long after the pod ended (a stream may stay open after that).
POD_END_GRACE_SECONDS = 3
#: With a log cursor, how often the lines read are logged: each batch is recorded on the JobSet first (one
#: small patch a batch), so the task log lags the workload by at most this long.
LOG_BATCH_SECONDS = 60
#: With remote logging, how long a trigger that took a wait over waits for the one before it to confirm that its
#: log was uploaded, before it logs that one's lines again: longer than a triggerer's heartbeat timeout (30 s) and
#: a takeover, so a paused triggerer woken by the takeover confirms in time.
UPLOAD_CONFIRM_SECONDS = 120
#: How much of the workload's log a minute goes into the task log besides the lines that always do: a trainer that
#: logs every rollout (Tunix, "Rollout string metric": megabytes a step at the upstream recipe's batch) would make
#: a task log no one reads, and the UI could not load. The rest is counted, and said in one line a minute.
LOG_LINES_A_MINUTE = 300
LOG_BYTES_A_MINUTE = 256 * 1024
#: A longer line is cut in the task log (a batch of prompts on one line).
LOG_LINE_CHARS = 2000
#: Lines always copied: a warning, an error or a fatal (absl's W/E/F prefix, Python's level names), a traceback.
_NOTICE = re.compile(r"^[WEF]\d{4} |\b(?:WARNING|ERROR|CRITICAL|FATAL|Traceback)\b")


#: A line of a followed log with ``timestamps=true``: the kubelet's RFC 3339 time (``Z`` on GKE's nodes, which run
#: in UTC), a space, the container's text.
KUBELET_LINE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2}) ")


class LogUnavailable(Exception):
    """The log stream brought the kubelet's error instead of the container's lines: read again shortly."""


class LogCursor:
    """Where a pod's log was read up to, by the kubelet's line timestamps: a reconnect asks for a
    little more than needed (``sinceSeconds``) and drops the lines already seen. The lines of the last
    timestamp are kept as short digests (a program may print many lines at once)."""

    def __init__(self, last_ts: str = "", at_last_ts: set[str] | None = None) -> None:
        self.last_ts = last_ts
        self.at_last_ts: set[str] = at_last_ts or set()

    def is_new(self, raw: str) -> bool:
        return self._is_new(_sortable(raw.partition(" ")[0]), raw)

    def _is_new(self, ts: str, raw: str) -> bool:
        return ts > self.last_ts or (ts == self.last_ts and _digest(raw) not in self.at_last_ts)

    def new_text(self, raw: str) -> str | None:
        stamp, _, text = raw.partition(" ")
        ts = _sortable(stamp)
        if not self._is_new(ts, raw):
            return None
        if ts != self.last_ts:
            self.last_ts, self.at_last_ts = ts, set()
        self.at_last_ts.add(_digest(raw))
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"last_ts": self.last_ts, "at_last_ts": sorted(self.at_last_ts)}

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> LogCursor:
        return cls(str(saved.get("last_ts", "")), set(saved.get("at_last_ts") or ()))


class JobSetLogRecord:
    """Where a JobSet's trigger records how far it logged: an annotation of that JobSet. It goes with the JobSet
    (a replacement starts with none), needs no permission beyond the JobSet's, and costs a Kubernetes request a
    batch, no storage request.

    A trigger writes the record only where it still reads what this trigger last read or wrote (compare and swap),
    and makes it its own when it starts (:meth:`claim`): a trigger whose wait went to another triggerer while it was
    paused finds the record changed when it wakes up, and logs no more (the other one logs those lines).

    With remote logging (Composer's), Airflow uploads a trigger's log only when the trigger ends in a live
    triggerer; one that dies uploads nothing, and the lines it logged are lost from the task log. So the record
    also says where its owner began (``since``): lines after that point are in the owner's log only. An owner that
    ends says so (:meth:`mark_uploaded`); a trigger taking the wait over from one that did not logs its lines again
    (:class:`LogPrinter`)."""

    #: How often :meth:`claim` reads the record again when another trigger changed it in between.
    CLAIM_ATTEMPTS = 3

    def __init__(self, hook: AsyncKubernetesApiHook, name: str, namespace: str, uid: str) -> None:
        self.hook, self.name, self.namespace, self.uid = hook, name, namespace, uid
        self.owner = secrets.token_hex(6)
        #: The record as this trigger last read or wrote it (None: there was none).
        self.held: str | None = None
        #: Remote logging is on: uploads are confirmed and checked (see :meth:`claim`).
        self.recover = False
        #: The trigger before this one logged lines whose upload it never confirmed.
        self.unconfirmed = False

    async def claim(self, recover: bool = False) -> dict[str, Any]:
        """Reads what an earlier trigger of this wait recorded and marks the record this trigger's. With
        ``recover`` (remote logging), when that trigger did not confirm its log's upload, the record says this one
        logged nothing past that trigger's start yet: it is to log that trigger's lines again."""
        self.recover = recover
        for _ in range(self.CLAIM_ATTEMPTS):
            jobset = await self.hook.get_jobset(self.name, self.namespace) or {}
            self.held, saved = st.log_record_text(jobset, self.uid), st.log_record(jobset, self.uid)
            previous = str(saved.get("owner") or "")
            # A record without ``since`` is of a version that never confirmed uploads: taken as uploaded.
            self.unconfirmed = bool(
                recover and previous and "since" in saved and not st.log_uploaded(jobset, self.uid, previous)
            )
            if await self.save(_start_record(saved, self.unconfirmed)):
                return saved
        raise RuntimeError(f"the record changed {self.CLAIM_ATTEMPTS} times while this trigger claimed it")

    async def save(self, cursor: Mapping[str, Any]) -> bool:
        """Records ``cursor``; False when another trigger of this wait recorded since this one (or the JobSet was
        replaced)."""
        text = json.dumps({**cursor, "owner": self.owner}, separators=(",", ":"), sort_keys=True)
        if not await self.hook.annotate_jobset(
            self.name, self.namespace, self.uid, ANNOTATION_LOG_CURSOR, text, replacing=self.held
        ):
            return False
        self.held = text
        return True

    async def uploaded(self, owner: str) -> bool:
        """Whether the trigger ``owner`` said it ended in a live triggerer (so its log was uploaded)."""
        return st.log_uploaded(await self.hook.get_jobset(self.name, self.namespace) or {}, self.uid, owner)

    async def mark_uploaded(self) -> None:
        """Says that this trigger ends in a live triggerer, which uploads its log (an annotation of its own: no
        compare and swap, a successor may own the record by now)."""
        key = ANNOTATION_LOG_UPLOADED_PREFIX + self.owner
        await self.hook.annotate_jobset(self.name, self.namespace, self.uid, key, "true")


#: A record's position: the pod (uid) and the cursor in its log.
_POSITION_KEYS = ("pod", "last_ts", "at_last_ts")


def _position(record: Mapping[str, Any]) -> dict[str, Any]:
    return {key: record[key] for key in _POSITION_KEYS if key in record}


def _start_record(saved: Mapping[str, Any], unconfirmed: bool) -> dict[str, Any]:
    """The record a trigger writes as it takes a wait over: where it begins (``since``) and how far it logged. After
    a trigger that confirmed its upload (or without remote logging), both are where that one stopped; after one
    that did not, both are where that one began, whose lines this trigger is to log again."""
    since = dict(saved.get("since") or {}) if unconfirmed else _position(saved)
    rest = {key: value for key, value in saved.items() if key not in _POSITION_KEYS}
    return {**rest, **since, "since": since}


class LogBudget:
    """What of the workload's log a window (a minute, or a batch) copies into the task log: every line the run reads
    after the training (:func:`kept_line_kind`), every warning and error, and the others up to
    :data:`LOG_LINES_A_MINUTE` lines and :data:`LOG_BYTES_A_MINUTE`; the others are counted."""

    def __init__(self) -> None:
        self._start_window()

    def _start_window(self) -> None:
        self.started = time.monotonic()
        self.lines = self.size = self.skipped = self.skipped_size = 0

    def admits(self, text: str, kind: str | None) -> bool:
        """Whether ``text`` (of :func:`kept_line_kind` ``kind``) goes into the task log; counted either way."""
        if (self.lines < LOG_LINES_A_MINUTE and self.size < LOG_BYTES_A_MINUTE) or always_copied(text, kind):
            self.lines, self.size = self.lines + 1, self.size + len(text)
            return True
        self.skipped, self.skipped_size = self.skipped + 1, self.skipped_size + len(text)
        return False

    @property
    def due(self) -> bool:
        return time.monotonic() - self.started >= 60

    def close(self, pod: str) -> str | None:
        """What the window did not copy, in a line (None: it copied everything); a new window starts."""
        skipped, size, seconds = self.skipped, self.skipped_size, time.monotonic() - self.started
        self._start_window()
        if not skipped:
            return None
        return (
            f"{skipped} line(s) ({size / 2**20:.1f} MiB) of the workload's log not copied here in the last "
            f"{seconds:.0f} s: beyond {LOG_LINES_A_MINUTE} lines or {LOG_BYTES_A_MINUTE // 1024} KiB a minute only "
            f"the evaluation, warnings and errors are (a trainer that logs every rollout writes megabytes a step); "
            f"`kubectl logs {pod}` has them until the kubelet rotates them away (10 MiB)"
        )


def always_copied(text: str, kind: str | None) -> bool:
    """Whether the task log gets this line (of :func:`kept_line_kind` ``kind``) whatever the workload logged around
    it."""
    return kind is not None or _NOTICE.search(text) is not None


def clipped(text: str) -> str:
    if len(text) <= LOG_LINE_CHARS:
        return text
    return f"{text[:LOG_LINE_CHARS]} ... ({len(text) - LOG_LINE_CHARS} characters more)"


class LogPrinter:
    """Logs the workload's lines into the task log. With a cursor store (the trigger's ``log_cursor``) it logs
    them in batches, each recorded (pod, last line) before it is logged: a trigger that takes the wait over from a
    triggerer that died or stalled (Airflow reassigns its triggers) reads the log again from its start, for the
    tail and the evaluation lines, and logs only what comes after the last line logged: no line twice, none
    skipped. Once another trigger recorded, this one logs nothing more.

    With remote logging, the trigger before this one may have died with its lines never uploaded (``unconfirmed``):
    the lines it logged are held (and the others after them) until it confirms its upload, or for
    :data:`UPLOAD_CONFIRM_SECONDS`, then logged again here: a paused triggerer that wakes up confirms when it
    cancels the wait it lost, a dead one never does."""

    def __init__(self, log: Any, store: JobSetLogRecord | None = None, saved: Any = None, unconfirmed: bool = False):
        self.log, self.store = log, store
        saved = saved if isinstance(saved, Mapping) else {}
        #: What an earlier trigger of this wait logged (of the pod ``resumed_pod``).
        self.resumed_pod = str(saved.get("pod", ""))
        self.resumed = LogCursor.from_dict(saved)
        self.previous_owner = str(saved.get("owner", ""))
        #: That trigger's lines are held until it confirms its upload, or until this deadline.
        self.recovering = unconfirmed and store is not None
        self.recover_by = time.monotonic() + UPLOAD_CONFIRM_SECONDS
        self.recovered: list[tuple[str, str]] = []
        #: Where this trigger begins logging: where that trigger stopped, or where it began when its lines are to
        #: be logged again (what was logged before this point is in an uploaded log).
        since = saved.get("since") if self.recovering and isinstance(saved.get("since"), Mapping) else saved
        self.since_pod, self.since = str(since.get("pod", "")), LogCursor.from_dict(since)
        self.logged_pod, self.logged = self.since_pod, LogCursor.from_dict(since)
        #: The lines the run reads after the training (by kind) among those logged, recorded with each batch: a
        #: trigger that takes the wait over after the kubelet rotated the log (a trainer that logs every rollout
        #: fills its 10 MiB fast) still has them.
        self.kept: dict[str, str] = dict(saved.get("kept") or {})
        #: The lines to log at the next batch: (pod name, text).
        self.pending: list[tuple[str, str]] = []
        #: Lines were read since the record was last written.
        self.dirty = False
        #: A line the run reads after the training was read: the batch goes now, so the record keeps it (the
        #: kubelet may rotate it out of the log before a minute is over).
        self.kept_read = asyncio.Event()
        self.budget, self.pod_name = LogBudget(), ""
        self.store_failed = False
        #: Another trigger of this wait records (and logs) now.
        self.superseded = False

    @classmethod
    async def resumed(cls, log: Any, record: JobSetLogRecord, recover: bool = False) -> LogPrinter:
        """The printer of a wait whose record is on the JobSet, with what an earlier trigger of this wait logged;
        without a record if it cannot be read (lines are then logged as they come). ``recover``: remote logging
        is on (see :meth:`JobSetLogRecord.claim`)."""
        try:
            saved = await record.claim(recover)
        except Exception as e:
            log.warning(
                "Cannot read the log cursor of JobSet %s/%s (%s: %s): lines are logged as they come",
                record.namespace,
                record.name,
                type(e).__name__,
                str(e)[:300],
            )
            return cls(log)
        printer = cls(log, record, saved, record.unconfirmed)
        if printer.recovering:
            log.info(
                "The trigger of this wait before this one has not confirmed that its log was uploaded (its triggerer "
                "may have died: remote logging keeps a trigger's log only when the trigger ends): the lines it "
                "logged after %s are logged again here unless it confirms within %d s",
                f"{printer.since.last_ts}Z" if printer.since.last_ts else "the log's start",
                UPLOAD_CONFIRM_SECONDS,
            )
        return printer

    def logged_before(self, pod: st.PodRecord, raw: str) -> bool:
        """Whether an earlier trigger of this wait logged this line already (into a log that was uploaded, when
        this one recovers the lines of one that did not confirm it)."""
        if self.recovering:
            return pod.uid == self.since_pod and not self.since.is_new(raw)
        return pod.uid == self.resumed_pod and not self.resumed.is_new(raw)

    def add(self, pod: st.PodRecord, raw: str, text: str) -> None:
        self.pod_name, kind = pod.name, kept_line_kind(text)
        copied = self.budget.admits(text, kind)
        if self.store is None:
            if copied:
                self.log.info("[%s] %s", pod.name, clipped(text))
            if self.budget.due:
                self._say_skipped()
            return
        if self.superseded:
            return
        if pod.uid != self.logged_pod:
            self.logged_pod, self.logged = pod.uid, LogCursor()
        self.logged.new_text(raw)
        self.dirty = True
        if kind:
            self.kept[kind] = text
            self.kept_read.set()
        if copied:
            previous = self.recovering and pod.uid == self.resumed_pod and not self.resumed.is_new(raw)
            (self.recovered if previous else self.pending).append((pod.name, clipped(text)))

    def _say_skipped(self) -> None:
        if summary := self.budget.close(self.pod_name):
            self.log.info(summary)

    async def flush(self, final: bool = False) -> None:
        """Records how far the log was read (and the kept lines), then logs the pending lines; each minute (and at
        the end) one line says what was not copied. While the previous trigger's lines are held, nothing (but at
        the end)."""
        if self.recovering and not await self._recovery_decided(final):
            return
        if self.store is None or not self.dirty:
            if final:
                self._say_skipped()
            return
        batch, self.pending, self.dirty = self.pending, [], False
        since = {"pod": self.since_pod, **self.since.to_dict()}
        try:
            record = {"pod": self.logged_pod, **self.logged.to_dict(), "kept": self.kept, "since": since}
            if not await self.store.save(record):
                self.superseded = True
                self.log.warning(
                    "Another trigger of this wait logs the workload's log now (this triggerer lost the wait while "
                    "it stalled): %d line(s) left to it",
                    len(batch),
                )
                return
        except Exception as e:  # The log goes on; only a takeover after this would repeat lines.
            if not self.store_failed:
                self.log.warning("Could not record how far the log was logged (%s: %s)", type(e).__name__, str(e)[:200])
            self.store_failed = True
        for pod_name, text in batch:
            self.log.info("[%s] %s", pod_name, text)
        if final or self.budget.due:
            self._say_skipped()

    async def _recovery_decided(self, final: bool) -> bool:
        """Whether the previous trigger's held lines are settled: dropped once it confirmed its upload (they are in
        its log), logged before the others once the wait for it ran out (or this trigger ends)."""
        assert self.store is not None
        try:
            uploaded = await self.store.uploaded(self.previous_owner)
        except Exception:  # Asked again at the next batch; at the end, logged (a repeat is better than a loss).
            uploaded = False
        if uploaded:
            self.recovered = []
            self.since_pod, self.since = self.resumed_pod, LogCursor.from_dict(self.resumed.to_dict())
            if self.logged_pod == self.resumed_pod and self.resumed.last_ts > self.logged.last_ts:
                self.logged = LogCursor.from_dict(self.resumed.to_dict())
        elif final or time.monotonic() >= self.recover_by:
            self.log.info(
                "The trigger of this wait before this one never confirmed its log's upload: %d line(s) it logged "
                "are logged again here (those the kubelet still had)",
                len(self.recovered),
            )
            self.pending, self.recovered = self.recovered + self.pending, []
            self.dirty = True
        else:
            return False
        self.recovering = False
        return True

    async def confirm_upload(self) -> None:
        """Says that this trigger ends in a live triggerer (its log is then uploaded), for a trigger that takes
        the wait over later. Bounded; a failure only makes that one log these lines again."""
        if self.store is None or not self.store.recover:
            return
        try:
            async with asyncio.timeout(10):
                await self.store.mark_uploaded()
        except Exception as e:
            self.log.warning("Could not say that this trigger's log is uploaded (%s: %s)", type(e).__name__, str(e))


class WorkloadLogFollower:
    """Follows the log of ``container`` in the workload pod (replicated job ``replicated_job``, job 0, index 0) of
    a JobSet's latest restart attempt: into ``progress`` (its tail and evaluation lines) and, through ``printer``,
    into the task log."""

    def __init__(self, log: Any, namespace: str, container: str, replicated_job: str, printer: LogPrinter) -> None:
        self.log, self.namespace, self.container, self.replicated_job = log, namespace, container, replicated_job
        self.printer = printer

    async def log_batches(self, hook: AsyncKubernetesApiHook, progress: Progress) -> None:
        """With a record on the JobSet: logs the lines read, a batch every :data:`LOG_BATCH_SECONDS`, and at once
        when a line the run reads after the training came."""
        while True:
            await wait_event(self.printer.kept_read, LOG_BATCH_SECONDS)
            self.printer.kept_read.clear()
            await self.printer.flush()

    def target(self, progress: Progress) -> st.PodRecord | None:
        """The workload pod of the latest restart attempt whose container has started."""
        candidates = [
            p
            for p in progress.pods.values()
            if p.replicated_job == self.replicated_job
            and p.job_index == "0"
            and p.completion_index == "0"
            and p.phase in ("Running", "Succeeded", "Failed")
            and not p.deleted
        ]
        return max(candidates, key=lambda p: p.restart_attempt, default=None)

    async def follow(self, hook: AsyncKubernetesApiHook, progress: Progress) -> None:
        """Stream the workload log into the task log. Switch to the new pod after a restart (even if
        the old stream stays open), reconnect after silences and dropped streams without repeating
        lines, and stop following a pod shortly after it ended."""
        cursor = LogCursor()
        pod: st.PodRecord | None = None
        finished: set[str] = set()  # pods whose log was read to the end
        failed_reads: dict[str, int] = {}
        retry_delay = 1.0
        while True:
            target = self.target(progress)
            if target is None or target.uid in finished:
                await self.wait_for_pods(progress)
                continue
            progress.log_idle = False
            if pod is None or target.uid != pod.uid:
                if pod is not None:
                    progress.tail.append(f"--- pod {target.name} (restart attempt {target.restart_attempt}) ---")
                pod, cursor = target, LogCursor()
                progress.log_pod = pod.name
                if pod.uid == self.printer.resumed_pod:
                    self.log.info(
                        "Following %s of pod %s after the last line an earlier trigger of this wait logged (%sZ)",
                        self.container,
                        pod.name,
                        self.printer.resumed.last_ts,
                    )
                else:
                    self.log.info("Following %s of pod %s", self.container, pod.name)
            received, clean = await self._stream_while_current(hook, pod, cursor, progress)
            if progress.pod_ended(pod.uid):
                # An ended pod's log is still readable: after an error, try again (its last lines
                # are what a failure report needs).
                failed_reads[pod.uid] = failed_reads.get(pod.uid, 0) + (not clean)
                if clean or failed_reads[pod.uid] >= 3:
                    finished.add(pod.uid)
                else:
                    await asyncio.sleep(2)
            elif self.target(progress) is target:
                # The stream ended while the container runs: reconnect, backing off while it stays quiet.
                retry_delay = 1 if received else min(retry_delay * 2, 30)
                await self._back_off(progress, pod, retry_delay)

    async def _back_off(self, progress: Progress, pod: st.PodRecord, seconds: float) -> None:
        """Wait up to ``seconds`` before reconnecting, and no longer once the pod ended or another pod is the one
        to follow: a pod that fails during a long back-off still has its log read while it can be."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            progress.pods_changed.clear()
            target = self.target(progress)
            if progress.pod_ended(pod.uid) or (target is not None and target.uid != pod.uid):
                return
            await wait_event(progress.pods_changed, left)

    @staticmethod
    async def wait_for_pods(progress: Progress) -> None:
        """Nothing to follow: wait (at most 10 s) for the pods to change."""
        progress.log_idle = True
        progress.pods_changed.clear()
        await wait_event(progress.pods_changed, 10)

    async def _stream_while_current(
        self, hook: AsyncKubernetesApiHook, pod: st.PodRecord, cursor: LogCursor, progress: Progress
    ) -> tuple[bool, bool]:
        """:meth:`read`, stopped when a newer pod is the one to follow, or shortly after this one ended."""
        stream = asyncio.create_task(self.read(hook, pod, cursor, progress))
        ended_at = None
        try:
            while not stream.done():
                await asyncio.wait({stream}, timeout=2)
                newer = self.target(progress)
                if progress.pod_ended(pod.uid):
                    ended_at = ended_at or time.monotonic()
                if (newer is not None and newer.uid != pod.uid) or (
                    ended_at and time.monotonic() - ended_at > POD_END_GRACE_SECONDS
                ):
                    stream.cancel()
                    await asyncio.gather(stream, return_exceptions=True)
        finally:
            if not stream.done():  # This follower is cancelled: so is its stream.
                stream.cancel()
        return stream.result() if not stream.cancelled() else (False, True)

    async def read(
        self, hook: AsyncKubernetesApiHook, pod: st.PodRecord, cursor: LogCursor, progress: Progress
    ) -> tuple[bool, bool]:
        """One log request: (whether it brought new lines, whether it ended without an error)."""
        received = False
        since = int(time.time() - parse_time(cursor.last_ts).timestamp()) + 5 if cursor.last_ts else None
        try:
            async for raw in hook.follow_log(pod.name, self.namespace, self.container, since):
                if not KUBELET_LINE.match(raw):
                    # The kubelet's own error, written into a stream it had answered 200 (its log server writes
                    # an error after the headers), e.g. "failed to try resolving symlinks in path ..." while the
                    # container's log file is not there yet (kubernetes/kubernetes#102170; "failed to open log file"
                    # is another): no line of the container, and no place in its log.
                    raise LogUnavailable(raw.strip())
                text = cursor.new_text(raw)
                if text is not None:
                    received = True
                    progress.tail.append(text)
                    progress.last_log_line = time.time()
                    if kind := kept_line_kind(text):
                        progress.evaluation[kind] = text
                    if not self.printer.logged_before(pod, raw):
                        self.printer.add(pod, raw, text)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # not started yet, gone, or the API restarted: look again shortly
            self.log.info("Log stream of %s ended: %s", pod.name, str(e)[:200])
            return received, False
        return received, True

    @staticmethod
    async def drain(progress: Progress) -> None:
        """Give the log stream a moment to deliver what the pod printed last."""
        deadline = time.monotonic() + LOG_DRAIN_SECONDS
        while not progress.log_idle and time.monotonic() < deadline:
            await asyncio.sleep(0.5)


def remote_logging() -> bool:
    """Whether this triggerer uploads its triggers' logs to remote storage (Composer's: the environment's bucket)."""
    from airflow.configuration import conf

    return conf.getboolean("logging", "remote_logging", fallback=False)


async def carried_through(awaitable: Awaitable[T]) -> T:
    """``awaitable`` awaited to its end even when the caller is cancelled meanwhile, as Airflow cancels a trigger it
    no longer holds again on each pass of its loop until the trigger is done: cut short, what a trigger does as it
    ends (its decision on the JobSet, its last lines, its upload confirmation) would be lost. The caller's own
    cancellation goes on once it returns."""
    task = asyncio.ensure_future(awaitable)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()


async def wait_event(event: asyncio.Event, seconds: float) -> None:
    """Until ``event`` is set, at most ``seconds``. Not ``asyncio.wait_for``: on Python 3.11 (Composer 3's), a
    task cancelled just as the event is set returns from it instead of being cancelled (CPython gh-86296), and
    a helper that loops on such a wait then ran on for ever: the trigger waited for it, and never fired."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


def _digest(raw: str) -> str:
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def _sortable(stamp: str) -> str:
    """A kubelet timestamp (RFC 3339, UTC, up to 9 fraction digits, trailing zeros dropped) padded so
    that string order is time order."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return f"{head}.{frac.ljust(9, '0')}"
