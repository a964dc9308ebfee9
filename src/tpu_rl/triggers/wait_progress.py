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
