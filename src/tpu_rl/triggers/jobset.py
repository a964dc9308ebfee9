"""Trigger that waits for a JobSet to finish, in the triggerer, without holding a worker slot.

It keeps three long-lived requests open: a watch of the JobSet, a watch of its pods, and the followed
log of the workload container. Progress and log lines go to the task's log; the pods' last state
and the log's tail stay in memory, because a finished JobSet's pods can vanish before anyone reads them.
So do the trainer's evaluation lines, which a long log would scroll out of the tail. For the training it
also reads the trainer's TensorBoard event files at most once a minute and logs its progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from tpu_rl import jobset_status as st
from tpu_rl.hooks.gcs import GcsReadHook
from tpu_rl.hooks.kubernetes import AsyncKubernetesApiHook, ClusterTarget
from tpu_rl.training_metrics import kept_line_kind
from tpu_rl.triggers.training_progress import TrainingProgress
from tpu_rl.vocabulary import ANNOTATION_LOG_CURSOR

#: After the JobSet finished, how long the log stream may take to deliver the last lines.
LOG_DRAIN_SECONDS = 10
#: A pod's log stream is closed this long after the pod ended (a stream may stay open after that).
POD_END_GRACE_SECONDS = 3
#: After the JobSet finished, how long the training's last progress read may take.
TRAINING_LAST_READ_SECONDS = 30
#: With a log cursor, how often the lines read are logged: each batch is recorded on the JobSet first (one
#: small patch a batch), so the task log lags the workload by at most this long.
LOG_BATCH_SECONDS = 60
#: Once the JobSet finished, how long the wait's helpers (pods, log, progress) may take to stop when cancelled.
HELPERS_STOP_SECONDS = 30
#: Once cancelled, how long the trigger may take to read its task's state and delete the JobSet (Airflow 3.3
#: gives ``on_kill`` 30 s by default).
CANCEL_DECISION_SECONDS = 30


class _Progress:
    """What the trigger has seen so far: the JobSet, its pods and the log tail."""

    def __init__(self, tail_lines: int, printer: _LogPrinter) -> None:
        self.printer = printer
        self.jobset: dict = {}
        self.pods: dict[str, st.PodRecord] = {}
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.log_pod = ""
        self.kueue_note = ""
        self.log_idle = True
        self.pods_changed = asyncio.Event()
        #: The last line of each kind the run reads after the training (``Pre``, ``Post``, ``Completed``: its
        #: evaluation and success lines, ``training_metrics.kept_line_kind``) the log showed.
        self.evaluation: dict[str, str] = {}
        self.finished = asyncio.Event()

    def line(self) -> str:
        return st.progress_line(self.jobset, self.pods.values(), self.kueue_note)

    def record_pod(self, kind: str, pod: dict) -> None:
        record = st.PodRecord.from_pod(pod)
        if kind == "DELETED":
            # Keep what the pod said before it went: the failure report needs it.
            known = self.pods.get(record.uid, record)
            known.deleted = True
            if record.failed() and not known.failed():
                record.deleted = True
                known = record
            self.pods[record.uid] = known
        else:
            self.pods[record.uid] = record
        self.pods_changed.set()

    def pod_ended(self, uid: str) -> bool:
        pod = self.pods.get(uid)
        return pod is None or pod.deleted or pod.phase in ("Succeeded", "Failed")


class _LogCursor:
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
    def from_dict(cls, saved: Mapping[str, Any]) -> _LogCursor:
        return cls(str(saved.get("last_ts", "")), set(saved.get("at_last_ts") or ()))


class _JobSetCursorStore:
    """Where a JobSet's trigger records how far it logged: an annotation of that JobSet. It goes with the JobSet
    (a replacement starts with none), needs no permission beyond the JobSet's, and costs a Kubernetes request a
    batch, no storage request.

    A trigger writes the record only where it still reads what this trigger last read or wrote (compare and swap),
    and makes it its own when it starts (:meth:`claim`): a trigger whose wait went to another triggerer while it was
    paused finds the record changed when it wakes up, and logs no more (the other one logs those lines)."""

    #: How often :meth:`claim` reads the record again when another trigger changed it in between.
    CLAIM_ATTEMPTS = 3

    def __init__(self, hook: AsyncKubernetesApiHook, name: str, namespace: str, uid: str) -> None:
        self.hook, self.name, self.namespace, self.uid = hook, name, namespace, uid
        self.owner = secrets.token_hex(6)
        #: The record as this trigger last read or wrote it (None: there was none).
        self.held: str | None = None

    @staticmethod
    def recorded(jobset: Mapping[str, Any], uid: str) -> str | None:
        """The record on the JobSet of incarnation ``uid`` (None: none, or another incarnation)."""
        meta = jobset.get("metadata") or {}
        return (meta.get("annotations") or {}).get(ANNOTATION_LOG_CURSOR) if meta.get("uid") == uid else None

    async def claim(self) -> dict[str, Any]:
        """Reads what an earlier trigger of this wait recorded and marks the record this trigger's."""
        for _ in range(self.CLAIM_ATTEMPTS):
            self.held = self.recorded(await self.hook.get_jobset(self.name, self.namespace), self.uid)
            saved = json.loads(self.held) if self.held else {}
            if await self.save(saved):
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


class _LogPrinter:
    """Logs the workload's lines into the task log. With a cursor store (the trigger's ``log_cursor``) it logs
    them in batches, each recorded (pod, last line) before it is logged: a trigger that takes the wait over from a
    triggerer that died or stalled (Airflow reassigns its triggers) reads the log again from its start, for the
    tail and the evaluation lines, and logs only what comes after the last line logged: no line twice, none
    skipped. Once another trigger recorded, this one logs nothing more."""

    def __init__(self, log: Any, store: _JobSetCursorStore | None = None, saved: Any = None) -> None:
        self.log, self.store = log, store
        saved = saved if isinstance(saved, Mapping) else {}
        #: What an earlier trigger of this wait logged (of the pod ``resumed_pod``).
        self.resumed_pod = str(saved.get("pod", ""))
        self.resumed = _LogCursor.from_dict(saved)
        self.logged_pod, self.logged = self.resumed_pod, _LogCursor.from_dict(saved)
        self.pending: list[tuple[st.PodRecord, str, str]] = []
        self.store_failed = False
        #: Another trigger of this wait records (and logs) now.
        self.superseded = False

    def logged_before(self, pod: st.PodRecord, raw: str) -> bool:
        """Whether an earlier trigger of this wait logged this line already."""
        return pod.uid == self.resumed_pod and not self.resumed.is_new(raw)

    def add(self, pod: st.PodRecord, raw: str, text: str) -> None:
        if self.store is None:
            self.log.info("[%s] %s", pod.name, text)
        elif not self.superseded:
            self.pending.append((pod, raw, text))

    async def flush(self) -> None:
        """Records the pending lines as logged, then logs them."""
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        for pod, raw, _ in batch:
            if pod.uid != self.logged_pod:
                self.logged_pod, self.logged = pod.uid, _LogCursor()
            self.logged.new_text(raw)
        try:
            if not await self.store.save({"pod": self.logged_pod, **self.logged.to_dict()}):
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
        for pod, _, text in batch:
            self.log.info("[%s] %s", pod.name, text)


class JobSetTrigger(BaseTrigger):
    """Fires once the JobSet ``namespace/name`` (that incarnation: ``uid``) is Completed, Failed or gone.

    :param cluster: the cluster (a :class:`~tpu_rl.hooks.kubernetes.ClusterTarget`, or its ``to_dict()``), a GKE
        cluster with its endpoint resolved.
    :param progress_interval: seconds between progress lines when nothing changes (changes are
        logged when they happen).
    :param log_tail_lines: how many last lines of the workload log the event carries.
    :param delete_on_kill: delete the JobSet when the task leaves the deferral while the trigger waits (a user
        marks it failed or clears it, its timeout expires); never when the wait goes to another triggerer.
    :param training: for the training, where its event files are (see
        :class:`~tpu_rl.triggers.training_progress.TrainingProgress`): its progress is logged at most once
        per interval, and once more when it ended if the trainer wrote more since (the step it got to).
    :param log_cursor: record on the JobSet how far the workload's log was logged (the annotation
        ``tpu-rl.dev/log-cursor``), so that the wait taken over by another triggerer goes on after the last line
        logged (see :class:`_LogPrinter`); lines are then logged once a minute. Without it, lines are logged as
        they come, and a takeover logs the log again from its start. A mapping (a bucket object, as 2.0.0's
        triggers were serialised) counts as true: that object is not read, so a wait deferred under 2.0.0 and
        taken over after the upgrade logs the log once more from its start.
    :param connection: instead of ``cluster``, the keywords a trigger serialised before ``cluster`` existed
        named it by (``kubernetes_conn_id``, or ``cluster_url``, ``ssl_ca_cert``, ``gcp_conn_id``,
        ``use_dns_endpoint``): a task deferred across a deploy resumes its wait.
    """

    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        uid: str,
        log_replicated_job: str,
        log_container: str,
        cluster: ClusterTarget | Mapping[str, Any] | None = None,
        progress_interval: float = 300,
        log_tail_lines: int = 100,
        delete_on_kill: bool = True,
        training: Mapping[str, Any] | None = None,
        log_cursor: bool | Mapping[str, Any] | None = None,
        **connection: Any,
    ) -> None:
        super().__init__()
        self.name = name
        self.namespace = namespace
        self.uid = uid
        self.log_replicated_job = log_replicated_job
        self.log_container = log_container
        self.cluster = _cluster_target(cluster, connection)
        self.progress_interval = progress_interval
        self.log_tail_lines = log_tail_lines
        self.delete_on_kill = delete_on_kill
        self.training = dict(training) if training else None
        self.log_cursor = bool(log_cursor)

    #: Serialised as they are; ``cluster`` as its ``to_dict()``.
    _SERIALIZED = (
        "name",
        "namespace",
        "uid",
        "log_replicated_job",
        "log_container",
        "progress_interval",
        "log_tail_lines",
        "delete_on_kill",
        "training",
        "log_cursor",
    )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {key: getattr(self, key) for key in self._SERIALIZED}
        return f"{type(self).__module__}.{type(self).__qualname__}", {**kwargs, "cluster": self.cluster.to_dict()}

    def hook(self) -> AsyncKubernetesApiHook:
        return AsyncKubernetesApiHook(self.cluster)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self.hook()
        async with contextlib.AsyncExitStack() as sessions:
            progress = _Progress(self.log_tail_lines, await self._log_printer(hook))
            waits = [self._watch_pods, self._follow_log, self._report]
            if progress.printer.store is not None:
                waits.append(self._flush_log)
            helpers = [asyncio.create_task(self._keep_running(fn, hook, progress)) for fn in waits]
            if self.training:
                helpers.append(asyncio.create_task(self._report_training(progress, sessions)))
            printer: _LogPrinter | None = progress.printer
            try:
                final = await self._watch_jobset(hook, progress)
                if final:
                    await self._drain_log(progress)
                if self.training:
                    progress.finished.set()
                    await asyncio.wait(helpers[-1:], timeout=TRAINING_LAST_READ_SECONDS)
                event = await self._event(hook, progress, final)
            except asyncio.CancelledError:
                if not await self._cancelled_with_the_task():
                    printer = None  # the wait goes on elsewhere: its successor logs what this one has not
                raise
            finally:
                await self._stop(helpers, printer)
        yield TriggerEvent(event)

    async def _cancelled_with_the_task(self) -> bool:
        """Whether the task left this wait (and the JobSet, with ``delete_on_kill``, was deleted).

        Airflow cancels a trigger when its task left the deferral (a user marked it or cleared it, or its
        timeout expired), but also when the wait went to another triggerer (this one's heartbeat lapsed: a pause,
        CPU throttling, a network cut) and when this triggerer stops. Airflow 3.3 then calls ``on_kill`` for the
        first two alike (``TriggerRunner.cancel_triggers``; apache/airflow PR 73454), and before 3.3 for neither:
        only the task's state tells them apart, as the provider triggers' ``safe_to_cancel`` reads it. A JobSet
        is deleted only when that state says the task left; unknown keeps it (the run's teardown deletes its
        pools). Bounded, as Airflow bounds ``on_kill``."""
        try:
            async with asyncio.timeout(CANCEL_DECISION_SECONDS):
                state = await self._task_state()
                if state is None or state == "deferred":
                    self.log.info(
                        "The wait for JobSet %s (uid %s) was cancelled while its task is %s: another triggerer "
                        "goes on with it (or this one stops); the JobSet keeps running",
                        self.ref,
                        self.uid,
                        state or "of unknown state",
                    )
                    return False
                if self.delete_on_kill:
                    self.log.info(
                        "The task left the wait (it is %s): deleting JobSet %s (uid %s)", state, self.ref, self.uid
                    )
                    await self.hook().delete_jobset(self.name, self.namespace, self.uid)
                return True
        except Exception as e:
            self.log.warning(
                "The wait for JobSet %s was cancelled; the JobSet is kept (%s: %s)",
                self.ref,
                type(e).__name__,
                str(e)[:300],
            )
            return False

    async def _task_state(self) -> str | None:
        """The state of the deferred task instance, read through the triggerer's supervisor (None: no task)."""
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
        from asgiref.sync import sync_to_async

        ti = self.task_instance
        if ti is None:
            return None
        states = await sync_to_async(RuntimeTaskInstance.get_task_states)(
            dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index
        )
        return states.get(ti.run_id, {}).get(ti.task_id)

    async def _stop(self, helpers: list[asyncio.Task], printer: _LogPrinter | None) -> None:
        """Cancels the wait's helpers and logs what the printer holds. Bounded: the event must fire even if a
        helper failed to stop (it would hold the slice)."""
        for task in helpers:
            task.cancel()
        _, running = await asyncio.wait(helpers, timeout=HELPERS_STOP_SECONDS)
        if running:
            self.log.warning("%d helper(s) of the wait did not stop when cancelled", len(running))
        if printer is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await printer.flush()

    async def _log_printer(self, hook: AsyncKubernetesApiHook) -> _LogPrinter:
        """The printer of the workload's log, with what an earlier trigger of this wait logged of it."""
        if not self.log_cursor:
            return _LogPrinter(self.log)
        store = _JobSetCursorStore(hook, self.name, self.namespace, self.uid)
        try:
            saved = await store.claim()
        except Exception as e:
            self.log.warning(
                "Cannot read the log cursor of JobSet %s (%s: %s): lines are logged as they come",
                self.ref,
                type(e).__name__,
                str(e)[:300],
            )
            return _LogPrinter(self.log)
        return _LogPrinter(self.log, store, saved)

    async def _flush_log(self, hook: AsyncKubernetesApiHook, progress: _Progress) -> None:
        while True:
            await asyncio.sleep(LOG_BATCH_SECONDS)
            await progress.printer.flush()

    async def _keep_running(self, fn, hook: AsyncKubernetesApiHook, progress: _Progress) -> None:
        """Pods, log and progress only inform: an API error there is logged and retried, never fatal."""
        while True:
            try:
                await fn(hook, progress)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.log.warning("%s failed (%s: %s); retrying in 10 s", fn.__name__, type(e).__name__, str(e)[:300])
                await asyncio.sleep(10)

    async def _watch_jobset(self, hook: AsyncKubernetesApiHook, progress: _Progress) -> dict | None:
        """The JobSet once finished, or None once deleted (or replaced by another of the same name)."""
        first = await hook.get_jobset(self.name, self.namespace)
        if first.get("metadata", {}).get("uid") != self.uid:
            return None
        seen = False
        async for kind, jobset in hook.watch_jobset(self.name, self.namespace):
            if jobset["metadata"]["uid"] != self.uid or kind == "DELETED":
                if kind == "DELETED" or seen:
                    return None
                continue
            seen = True
            before = progress.jobset
            progress.jobset = jobset
            if st.restarts(jobset) > st.restarts(before or jobset):
                self.log.warning("JobSet %s restarted: restart %d", self.ref, st.restarts(jobset))
            if st.terminal_condition(jobset):
                return jobset
        return None

    async def _watch_pods(self, hook: AsyncKubernetesApiHook, progress: _Progress) -> None:
        async for kind, pod in hook.watch_pods(self.name, self.namespace, self.uid):
            progress.record_pod(kind, pod)

    def _log_target(self, progress: _Progress) -> st.PodRecord | None:
        """The workload pod of the latest restart attempt whose container has started."""
        candidates = [
            p
            for p in progress.pods.values()
            if p.replicated_job == self.log_replicated_job
            and p.job_index == "0"
            and p.completion_index == "0"
            and p.phase in ("Running", "Succeeded", "Failed")
            and not p.deleted
        ]
        return max(candidates, key=lambda p: p.restart_attempt, default=None)

    async def _follow_log(self, hook: AsyncKubernetesApiHook, progress: _Progress) -> None:
        """Stream the workload log into the task log. Switch to the new pod after a restart (even if
        the old stream stays open), reconnect after silences and dropped streams without repeating
        lines, and stop following a pod shortly after it ended."""
        cursor = _LogCursor()
        pod: st.PodRecord | None = None
        finished: set[str] = set()  # pods whose log was read to the end
        failed_reads: dict[str, int] = {}
        retry_delay = 1.0
        while True:
            target = self._log_target(progress)
            if target is None or target.uid in finished:
                await self._wait_for_pods(progress)
                continue
            progress.log_idle = False
            if pod is None or target.uid != pod.uid:
                if pod is not None:
                    progress.tail.append(f"--- pod {target.name} (restart attempt {target.restart_attempt}) ---")
                pod, cursor = target, _LogCursor()
                progress.log_pod = pod.name
                if pod.uid == progress.printer.resumed_pod:
                    self.log.info(
                        "Following %s of pod %s after the last line an earlier trigger of this wait logged (%sZ)",
                        self.log_container,
                        pod.name,
                        progress.printer.resumed.last_ts,
                    )
                else:
                    self.log.info("Following %s of pod %s", self.log_container, pod.name)
            received, clean = await self._stream_while_current(hook, pod, cursor, progress)
            if progress.pod_ended(pod.uid):
                # An ended pod's log is still readable: after an error, try again (its last lines
                # are what a failure report needs).
                failed_reads[pod.uid] = failed_reads.get(pod.uid, 0) + (not clean)
                if clean or failed_reads[pod.uid] >= 3:
                    finished.add(pod.uid)
                else:
                    await asyncio.sleep(2)
            elif self._log_target(progress) is target:
                # The stream ended while the container runs: reconnect, backing off while it stays quiet.
                retry_delay = 1 if received else min(retry_delay * 2, 30)
                await self._back_off(progress, pod, retry_delay)

    async def _back_off(self, progress: _Progress, pod: st.PodRecord, seconds: float) -> None:
        """Wait up to ``seconds`` before reconnecting, and no longer once the pod ended or another pod is the one
        to follow: a pod that fails during a long back-off still has its log read while it can be."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            progress.pods_changed.clear()
            target = self._log_target(progress)
            if progress.pod_ended(pod.uid) or (target is not None and target.uid != pod.uid):
                return
            await _wait_event(progress.pods_changed, left)

    @staticmethod
    async def _wait_for_pods(progress: _Progress) -> None:
        """Nothing to follow: wait (at most 10 s) for the pods to change."""
        progress.log_idle = True
        progress.pods_changed.clear()
        await _wait_event(progress.pods_changed, 10)

    async def _stream_while_current(
        self, hook: AsyncKubernetesApiHook, pod: st.PodRecord, cursor: _LogCursor, progress: _Progress
    ) -> tuple[bool, bool]:
        """:meth:`_stream_log`, stopped when a newer pod is the one to follow, or shortly after this one ended."""
        stream = asyncio.create_task(self._stream_log(hook, pod, cursor, progress))
        ended_at = None
        try:
            while not stream.done():
                await asyncio.wait({stream}, timeout=2)
                newer = self._log_target(progress)
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

    async def _stream_log(
        self, hook: AsyncKubernetesApiHook, pod: st.PodRecord, cursor: _LogCursor, progress: _Progress
    ) -> tuple[bool, bool]:
        """One log request: (whether it brought new lines, whether it ended without an error)."""
        received = False
        since = int(time.time() - _epoch(cursor.last_ts)) + 5 if cursor.last_ts else None
        try:
            async for raw in hook.follow_log(pod.name, self.namespace, self.log_container, since):
                text = cursor.new_text(raw)
                if text is not None:
                    received = True
                    progress.tail.append(text)
                    if kind := kept_line_kind(text):
                        progress.evaluation[kind] = text
                    if not progress.printer.logged_before(pod, raw):
                        progress.printer.add(pod, raw, text)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # not started yet, gone, or the API restarted: look again shortly
            self.log.info("Log stream of %s ended: %s", pod.name, str(e)[:200])
            return received, False
        return received, True

    async def _drain_log(self, progress: _Progress) -> None:
        """Give the log stream a moment to deliver what the pod printed last."""
        deadline = time.monotonic() + LOG_DRAIN_SECONDS
        while not progress.log_idle and time.monotonic() < deadline:
            await asyncio.sleep(0.5)

    async def _report(self, hook: AsyncKubernetesApiHook, progress: _Progress) -> None:
        """Log progress when it changes (checked every few seconds) and every progress_interval anyway."""
        last_line, last_time, started, kueue_checked = "", 0.0, time.monotonic(), 0.0
        while True:
            await asyncio.sleep(5)
            if not progress.jobset:
                continue
            now = time.monotonic()
            if st.is_suspended(progress.jobset) and now - kueue_checked > 60:
                kueue_checked = now
                try:
                    progress.kueue_note = st.kueue_note(await hook.kueue_workloads(self.namespace, self.uid))
                except Exception as e:
                    progress.kueue_note = f"Kueue Workload unreadable: {str(e)[:100]}"
            line = progress.line()
            if line != last_line or now - last_time >= self.progress_interval:
                elapsed = int(now - started)
                self.log.info("JobSet %s after %dm%02ds: %s", self.ref, elapsed // 60, elapsed % 60, line)
                last_line, last_time = line, now

    async def _report_training(self, progress: _Progress, sessions: contextlib.AsyncExitStack) -> None:
        """The training's progress line at most once per interval while it runs, and once more when it ended if
        the event files grew since the last line (the step it got to). A failed read is logged and tried at the
        next one: progress only informs. One HTTP session for the whole wait."""
        training = TrainingProgress(self.training)
        try:
            reader = await sessions.enter_async_context(GcsReadHook(training.gcp_conn_id).reader(training.bucket))
        except Exception as e:  # No reader (credentials, network): the wait goes on without progress lines.
            self.log.warning(
                "No training progress: cannot read gs://%s (%s: %s)", training.bucket, type(e).__name__, str(e)[:300]
            )
            return
        while True:
            ended = progress.finished.is_set()
            if ended or training.due():
                try:
                    await training.report(
                        reader, self.log, _created(progress.jobset), only_news=ended and not training.due()
                    )
                except Exception as e:
                    self.log.warning(
                        "Could not read the training's event files under gs://%s/%s (%s: %s)",
                        training.bucket,
                        training.prefix,
                        type(e).__name__,
                        str(e)[:300],
                    )
            if ended:
                return
            await _wait_event(progress.finished, training.interval)

    async def _event(self, hook: AsyncKubernetesApiHook, progress: _Progress, final: dict | None) -> dict[str, Any]:
        event: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
            "log_tail": list(progress.tail),
            "log_pod": progress.log_pod,
            "evaluation_lines": list(progress.evaluation.values()),
        }
        if final is None:
            return {**event, "status": "deleted", "message": self._deleted_message(progress)}
        condition = st.terminal_condition(final) or {}
        event.update(
            condition={k: condition.get(k, "") for k in ("type", "reason", "message")},
            restarts=st.restarts(final),
        )
        if condition.get("type") == st.COMPLETED:
            return {
                **event,
                "status": "success",
                "message": f"JobSet {self.ref} completed: {condition.get('message', '')}",
            }
        lost = await self._lost_nodes(hook, progress)
        message = st.explain_failure(final, progress.pods.values(), lost, event["log_tail"], progress.log_pod)
        preemption = st.preemption(final, progress.pods.values(), lost)
        return {**event, "status": "failed", "message": message, "preemption": preemption}

    def _deleted_message(self, progress: _Progress) -> str:
        message = (
            f"JobSet {self.ref} (uid {self.uid}) was deleted while the task waited for it "
            f"(by someone or something outside this task, or its TTL). Last progress: "
            f"{progress.line() if progress.jobset else 'none seen'}."
        )
        if progress.tail:
            message += "\nLast lines of the workload log:\n" + "\n".join(f"  | {x}" for x in progress.tail)
        return message

    async def _lost_nodes(self, hook: AsyncKubernetesApiHook, progress: _Progress) -> list[str]:
        nodes = {p.node for p in progress.pods.values() if p.node and (p.failed() or p.deleted)}
        lost = []
        for node in sorted(nodes)[:20]:
            if await hook.node_exists(node) is False:
                lost.append(node)
        return lost


async def _wait_event(event: asyncio.Event, seconds: float) -> None:
    """Until ``event`` is set, at most ``seconds``. Not ``asyncio.wait_for``: on Python 3.11 (Composer 3's), a
    task cancelled just as the event is set returns from it instead of being cancelled (CPython gh-86296), and
    a helper that loops on such a wait then ran on for ever: the trigger waited for it, and never fired."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


def _cluster_target(cluster: ClusterTarget | Mapping[str, Any] | None, connection: dict[str, Any]) -> ClusterTarget:
    if cluster is None:
        if connection.get("impersonation_chain") is None:  # Serialised, always None, before it was dropped.
            connection.pop("impersonation_chain", None)
        return ClusterTarget(**connection)
    if connection:
        raise TypeError(f"Give the cluster as cluster=, not also {sorted(connection)}")
    return ClusterTarget.from_dict(cluster) if isinstance(cluster, Mapping) else cluster


def _digest(raw: str) -> str:
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def _sortable(stamp: str) -> str:
    """A kubelet timestamp (RFC 3339, UTC, up to 9 fraction digits, trailing zeros dropped) padded so
    that string order is time order."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return f"{head}.{frac.ljust(9, '0')}"


def _created(obj: dict) -> float | None:
    """When a Kubernetes object was created (POSIX seconds), or None before it was read."""
    return st.posix_time((obj.get("metadata") or {}).get("creationTimestamp"))


def _epoch(sortable: str) -> float:
    return datetime.fromisoformat(sortable.partition(".")[0]).replace(tzinfo=UTC).timestamp()
