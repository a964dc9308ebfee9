"""What a JobSet trigger has seen of its wait so far, shared by its watches, its log follower and its reports."""

from __future__ import annotations

import asyncio
from collections import deque

from tpu_rl import jobset_status as st


class Progress:
    """What the trigger has seen so far: the JobSet, its pods, the log's tail and evaluation lines."""

    def __init__(self, tail_lines: int) -> None:
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
        #: For the watchdog (POSIX seconds): when the log last showed a new line, since when every pod of the
        #: attempt runs, the trainer's newest step of this attempt and when it was first seen, whether its event
        #: files were read at all.
        self.last_log_line: float | None = None
        self.all_running_since: float | None = None
        self.last_step: int | None = None
        self.last_step_seen: float | None = None
        self.steps_read = False
        #: Set once the watchdog found the workload stuck (``watchdog.Stuck``): the wait ends.
        self.stuck = None
        self.stuck_found = asyncio.Event()

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

    def attempt_pods(self) -> list[st.PodRecord]:
        """The pods of the JobSet's current restart attempt that still exist."""
        attempt = st.restarts(self.jobset) if self.jobset else 0
        return [p for p in self.pods.values() if p.restart_attempt == attempt and not p.deleted]

    def note_running(self, expected: int | None, now: float) -> None:
        """Keeps since when every pod of the attempt runs (reset when one stops, or a restart begins)."""
        pods = self.attempt_pods()
        started = all(p.running() or p.phase == "Succeeded" for p in pods)
        every = bool(pods) and started and (expected is None or len(pods) >= expected)
        if not every:
            self.all_running_since = None
        elif self.all_running_since is None:
            self.all_running_since = now

    def note_step(self, step: int | None, now: float) -> None:
        """The trainer's newest step of this attempt, as the event files show it (None: none yet)."""
        self.steps_read = True
        if step is not None and step != self.last_step:
            self.last_step, self.last_step_seen = step, now

    def pod_ended(self, uid: str) -> bool:
        pod = self.pods.get(uid)
        return pod is None or pod.deleted or pod.phase in ("Succeeded", "Failed")
