"""The watchdog of a workload's wait: whether a JobSet that runs (so holds its nodes, the TPU slice for the
training) makes no progress a user pays for, decided from what the JobSet trigger saw of it.

Three windows, each from the run's parameters (0 turns it off):

- **start**: every pod of the attempt runs within ``start_seconds``: counted from when each pod got its node (the
  image pull, a container config error, a crash loop), and, where the run's own pools should hold every pod
  (``bound_scheduling``: the run created its slice on demand, Spot or a reservation), from the attempt's creation
  for a pod the scheduler cannot place. A pod waiting for capacity that is not the run's to hold (flex-start's
  autoscaler, another run's slice on an existing pool, Kueue) is not bounded here;
- **first step**: the trainer writes its first step within ``first_step_seconds`` of all its pods running
  (loading the model, the evaluation before training, XLA's compilation);
- **stall**: after a step, a new step or a log line within ``stall_seconds``.

Pure: no I/O, no clock; the trigger hands in what it saw and the time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpu_rl.jobset_status import PodRecord

START = "start"
FIRST_STEP = "first-step"
STALL = "stall"


@dataclass(frozen=True)
class Windows:
    """The watchdog's windows, in seconds (0: off); the trigger's serialised ``watchdog`` keyword."""

    start_seconds: float = 0.0
    first_step_seconds: float = 0.0
    stall_seconds: float = 0.0
    #: The run created the pools the pods should land on (no autoscaler, queue or other run to wait for).
    bound_scheduling: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "start_seconds": self.start_seconds,
            "first_step_seconds": self.first_step_seconds,
            "stall_seconds": self.stall_seconds,
            "bound_scheduling": self.bound_scheduling,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Windows:
        """The windows a trigger was serialised with; none (a trigger of an earlier release): every window off."""
        return cls(**{k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__})

    @property
    def on(self) -> bool:
        return bool(self.start_seconds or self.first_step_seconds or self.stall_seconds)


@dataclass(frozen=True)
class Seen:
    """What the trigger saw of the current attempt, in POSIX seconds."""

    #: When the attempt's JobSet was created (None: not read yet).
    created: float | None
    #: The attempt's pods (deleted ones left out by the caller or marked so).
    pods: Sequence[PodRecord]
    #: How many pods the attempt has in all (the JobSet's replicas x parallelism); None: unknown.
    expected_pods: int | None = None
    #: Since when every pod has run (None: not all yet).
    all_running_since: float | None = None
    #: The trainer's newest step and when the trigger first saw it (None: no step yet, or not a training).
    last_step: int | None = None
    last_step_seen: float | None = None
    #: When the workload's log last showed a line.
    last_log_line: float | None = None
    #: The JobSet is suspended (Kueue has not admitted it): its pods are not created yet.
    suspended: bool = False
    #: Whether this is the training (the first-step and stall windows apply to it only).
    training: bool = False


@dataclass(frozen=True)
class Stuck:
    """The workload makes no progress: which window passed, at what step, and the message a user reads."""

    kind: str
    step: int | None
    message: str


def check(windows: Windows, seen: Seen, now: float) -> Stuck | None:
    """The window that passed, or None while the workload runs as it should."""
    if seen.suspended or seen.created is None:
        return None
    if windows.start_seconds and seen.all_running_since is None:
        late = _late_pods(windows, seen, now)
        if late:
            return Stuck(START, None, _start_message(windows, seen, late, now))
    if not seen.training or seen.all_running_since is None:
        return None
    if seen.last_step is None:
        waited = now - seen.all_running_since
        if windows.first_step_seconds and waited > windows.first_step_seconds:
            return Stuck(FIRST_STEP, None, _first_step_message(windows, seen))
        return None
    quiet_since = max(seen.last_step_seen or 0.0, seen.last_log_line or 0.0)
    if windows.stall_seconds and now - quiet_since > windows.stall_seconds:
        return Stuck(STALL, seen.last_step, _stall_message(windows, seen))
    return None


def _late_pods(windows: Windows, seen: Seen, now: float) -> list[PodRecord]:
    """The pods past the start window: not running, counted from their node, or (bound scheduling) unplaced
    since the attempt began; and, with bound scheduling, the attempt short of pods past the window."""
    late = []
    for pod in seen.pods:
        if pod.deleted or pod.running() or pod.phase in ("Succeeded", "Failed"):  # an ended pod started
            continue
        since = pod.scheduled_at
        if since is None and windows.bound_scheduling:
            since = seen.created
        if since is not None and now - since > windows.start_seconds:
            late.append(pod)
    missing = seen.expected_pods is not None and len([p for p in seen.pods if not p.deleted]) < seen.expected_pods
    if missing and windows.bound_scheduling and now - seen.created > windows.start_seconds and not late:
        late.append(PodRecord("(not created)", "", "", "", "", 0, "", "", False, status_reason="NotCreated"))
    return late


def describe_pod(pod: PodRecord) -> str:
    """Why a pod does not run, in the kubelet's or the scheduler's words."""
    if pod.waiting:
        return "; ".join(w.describe() for w in pod.waiting)
    if pod.unschedulable:
        return f"unschedulable: {pod.unschedulable.strip()[:300]}"
    if pod.status_reason == "NotCreated":
        return "not created by its Job"
    return f"phase {pod.phase or 'unknown'}, not running"


def _minutes(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 60 else f"{seconds / 60:g} min"


def _start_message(windows: Windows, seen: Seen, late: list[PodRecord], now: float) -> str:
    groups: dict[tuple[str, str], list[PodRecord]] = {}
    for pod in late:
        groups.setdefault((pod.replicated_job, describe_pod(pod)), []).append(pod)
    running = sum(1 for p in seen.pods if p.running())
    lines = [
        f"the workload's pods did not all run within {_minutes(windows.start_seconds)} "
        f"({running} of {seen.expected_pods or len(seen.pods)} running):"
    ]
    for (replicated, why), pods in list(groups.items())[:8]:
        lines.append(f"  {len(pods)} pod(s) of {replicated or 'the workload'} (e.g. {pods[0].name}): {why}")
    reasons = {w.reason for p in late for w in p.waiting}
    lines.append("fix: " + _start_fix(reasons, any(p.unschedulable for p in late)))
    return "\n".join(lines)


def _start_fix(reasons: set[str], unschedulable: bool) -> str:
    if reasons & {"ImagePullBackOff", "ErrImagePull", "InvalidImageName"}:
        return (
            "check that the image exists (cloud_image_name, pathways_image_tag) and that the nodes' service account "
            "may pull it (roles/artifactregistry.reader on its repository)"
        )
    if "CreateContainerConfigError" in reasons:
        return "a Secret or ConfigMap the pods name is missing: see the pod's events (kubectl describe pod)"
    if "CrashLoopBackOff" in reasons:
        return "the container exits at start: read its log (kubectl logs --previous) and the image's entrypoint"
    if unschedulable:
        return (
            "the run's TPU pools cannot hold the pods: check the pools' nodes are Ready and match the slice "
            "(tpu_type, topology, compute_type), and that no other workload holds them"
        )
    return "see the pods' events (kubectl describe pod) and raise start_timeout_minutes if the start is only slow"


def _first_step_message(windows: Windows, seen: Seen) -> str:
    return (
        f"the trainer wrote no step within {_minutes(windows.first_step_seconds)} of its pods running (loading the "
        "model, the evaluation before training and XLA's compilation take part of that; a Pathways worker that "
        "never joined, or a hung rollout, take all of it)\n"
        "fix: read the workload's last log lines below; raise first_step_timeout_minutes if the model only loads "
        "slowly"
    )


def _stall_message(windows: Windows, seen: Seen) -> str:
    return (
        f"the training stalled at step {seen.last_step}: no new step and no log line for "
        f"{_minutes(windows.stall_seconds)}\n"
        "fix: read the workload's last log lines below; a retry resumes from the newest complete checkpoint; raise "
        "stall_timeout_minutes if a step, an evaluation or a checkpoint save takes that long"
    )


def repeated(earlier: Sequence[Mapping[str, Any]], stuck: Mapping[str, Any]) -> bool:
    """Whether the run was stuck the same way before (the same window, at the same step): a retry would be too."""
    return any(e.get("kind") == stuck.get("kind") and e.get("step") == stuck.get("step") for e in earlier)


def repeated_message(stuck: Mapping[str, Any], config: Any) -> str:
    """Why the task fails for good: its retries would each hold the slice for the window, to stall there again."""
    where = f"at step {stuck['step']}" if stuck.get("step") is not None else "before its first step"
    window = {START: "start_timeout_minutes", FIRST_STEP: "first_step_timeout_minutes"}.get(
        stuck.get("kind"), "stall_timeout_minutes"
    )
    return (
        f"train_rl was stuck {where} ({stuck.get('kind')}) in an earlier try too: not retried, since each try would "
        f"hold the slice for its window and stall again; fix: read the log below, change what makes it stall "
        f"(or raise {window} = {getattr(config, window, '?')} if it is only slow), then clear train_rl: it "
        "resumes from the newest complete checkpoint"
    )
