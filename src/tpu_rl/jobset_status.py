"""Reading JobSet, pod and Kueue objects: what state a JobSet is in, and why it failed.

Pure functions of the API objects (plain dicts as the API returns them), so the operator, the
trigger and the tests share one reading, and real objects captured from a cluster can be replayed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tpu_rl.timestamps import posix_time
from tpu_rl.vocabulary import (
    ANNOTATION_LOG_CURSOR,
    ANNOTATION_LOG_UPLOADED_PREFIX,
    COMPLETION_INDEX_LABEL,
    JOB_INDEX_LABEL,
    PATHWAYS_HEAD,
    REPLICATED_JOB_LABEL,
    RESTART_ATTEMPT_LABEL,
    WORKLOAD_CONTAINER,
)

COMPLETED = "Completed"
FAILED = "Failed"

# --- What counts as a preemption, and where Kubernetes and GKE say so ----------------------------------------
#
# A training whose pods were taken away (a Spot VM reclaimed, TPU host maintenance, a lost host) is resumed by
# ``train_rl`` from its newest complete checkpoint (tpu_rl.preemption holds the budget); these are the signals:
#
# - the pod condition ``DisruptionTarget``: its reasons are Kubernetes' ("Disruptions", section "Pod disruption
#   conditions", Kubernetes 1.26+), listed in DISRUPTION_REASONS;
# - the pod's status after a graceful node shutdown: reason ``Terminated``, "Pod was terminated in response to
#   imminent node shutdown." (kubelet 1.21+; ``Shutdown`` in 1.20: KEP 2000 "Graceful node shutdown"). GKE
#   Standard nodes shut down gracefully when a Spot VM gets its termination notice, 30 s before it stops (GKE
#   "Spot VMs", "Termination and graceful shutdown of Spot VMs"), and on TPU host maintenance, which TPU VMs
#   cannot live-migrate (GKE "Manage GKE node disruption for GPUs and TPUs");
# - exit code 143 (128 + SIGTERM) of the first failed Job's pod: the kubelet's SIGTERM on shutdown or eviction,
#   also what a Kueue preemption or a Spot eviction leaves (ml-auto-solutions PR #1348; shared reference gke.md);
# - the pod's node gone: the VM was deleted (pod GC then marks the pod ``DeletionByPodGC``, or the trigger finds
#   the node missing).

#: ``DisruptionTarget`` reasons, in the words a TPU user needs.
DISRUPTION_REASONS = {
    "TerminationByKubelet": (
        "TPU host maintenance or node shutdown, e.g. a Spot VM reclaimed (the kubelet terminated the pod)"
    ),
    "PreemptionByScheduler": "preempted by a higher-priority workload",
    "EvictionByEvictionAPI": "evicted (TPU host maintenance, node drain or upgrade)",
    "DeletionByTaintManager": "host lost or under maintenance (node tainted NoExecute)",
    "DeletionByPodGC": "host lost (its node no longer exists)",
}
#: Pod ``status.reason`` the kubelet sets on a graceful node shutdown (``Shutdown`` before Kubernetes 1.21).
NODE_SHUTDOWN_REASONS = ("Terminated", "Shutdown")
#: 128 + SIGTERM (15): the container was ended by the kubelet's SIGTERM.
SIGTERM_EXIT_CODE = 143


def log_record_text(jobset: Mapping, uid: str) -> str | None:
    """The record the trigger of a wait on ``jobset`` keeps of its workload's log, as stored (its writer compares
    it before it writes); None: none, or a record of another incarnation than ``uid``."""
    meta = jobset.get("metadata") or {}
    return (meta.get("annotations") or {}).get(ANNOTATION_LOG_CURSOR) if meta.get("uid") == uid else None


def log_uploaded(jobset: Mapping, uid: str, owner: str) -> bool:
    """Whether the trigger ``owner`` of a wait on ``jobset`` (incarnation ``uid``) said it ended in a live
    triggerer, whose Airflow then uploaded its log."""
    meta = jobset.get("metadata") or {}
    return meta.get("uid") == uid and ANNOTATION_LOG_UPLOADED_PREFIX + owner in (meta.get("annotations") or {})


def log_record(jobset: Mapping, uid: str) -> dict:
    """:func:`log_record_text` read (``{}``: nothing): how far the trigger logged, and the lines the run reads after
    the training (``kept``, by kind), which a log the kubelet rotated or a pod already gone no longer shows."""
    try:
        record = json.loads(log_record_text(jobset, uid) or "{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def is_pathways(manifest: Mapping) -> bool:
    return any(rj.get("name") == PATHWAYS_HEAD for rj in manifest.get("spec", {}).get("replicatedJobs", []))


def log_source(manifest: Mapping) -> tuple[str, str]:
    """(replicated job, container) whose index-0 pod prints what a user reads: the workload's log."""
    replicated = manifest.get("spec", {}).get("replicatedJobs", [])
    if is_pathways(manifest):
        return PATHWAYS_HEAD, WORKLOAD_CONTAINER
    name = replicated[0]["name"] if replicated else ""
    containers = _pod_spec(replicated[0]).get("containers", []) if replicated else []
    names = [c.get("name") for c in containers]
    container = WORKLOAD_CONTAINER if WORKLOAD_CONTAINER in names or not names else names[0]
    return name, container


def _pod_spec(replicated_job: Mapping) -> Mapping:
    return replicated_job.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})


def terminal_condition(jobset: Mapping) -> dict | None:
    """The Completed or Failed condition that ended the JobSet, or None while it runs."""
    for condition in jobset.get("status", {}).get("conditions") or []:
        if condition.get("type") in (COMPLETED, FAILED) and condition.get("status") == "True":
            return dict(condition)
    return None


def restarts(jobset: Mapping) -> int:
    return int(jobset.get("status", {}).get("restarts") or 0)


def expected_pods(jobset: Mapping) -> int | None:
    """How many pods an attempt of the JobSet has: each replicated job's replicas times its Jobs' parallelism
    (JobSet v0.10.1 ``ReplicatedJob.replicas``, batch/v1 ``JobSpec.parallelism``, default 1); None: no spec."""
    replicated = (jobset.get("spec") or {}).get("replicatedJobs") or []
    if not replicated:
        return None
    return sum(
        int(rj.get("replicas") or 1) * int(((rj.get("template") or {}).get("spec") or {}).get("parallelism") or 1)
        for rj in replicated
    )


def is_suspended(jobset: Mapping) -> bool:
    return bool(jobset.get("spec", {}).get("suspend"))


def failed_job_name(condition: Mapping) -> str | None:
    """JobSet names the first failed child Job in its condition message."""
    match = re.search(r"\(first failed job: ([^)]+)\)", condition.get("message") or "")
    return match.group(1) if match else None


def replicated_job_of(job_name: str, jobset: Mapping) -> str | None:
    """Child Jobs are named ``<jobset>-<replicated job>-<index>``."""
    prefix = jobset.get("metadata", {}).get("name", "") + "-"
    for rj in jobset.get("spec", {}).get("replicatedJobs", []):
        if re.fullmatch(re.escape(prefix + rj["name"]) + r"-\d+", job_name):
            return rj["name"]
    return None


@dataclass(frozen=True)
class ContainerExit:
    container: str
    exit_code: int
    reason: str
    message: str

    def describe(self) -> str:
        text = f"{self.container} exited {self.exit_code}"
        if self.reason:
            text += f" ({self.reason})"
        if self.message:
            text += f": {self.message.strip()[:300]}"
        return text


@dataclass(frozen=True)
class ContainerWaiting:
    """A container the kubelet has not started (yet), in its words: ImagePullBackOff, ErrImagePull,
    CreateContainerConfigError, CrashLoopBackOff, ContainerCreating."""

    container: str
    reason: str
    message: str
    image: str = ""

    def describe(self) -> str:
        text = f"{self.container} waiting: {self.reason}"
        if self.message:
            text += f": {self.message.strip()[:300]}"
        elif self.image:
            text += f" (image {self.image})"
        return text


@dataclass
class PodRecord:
    """What we last saw of one JobSet pod: kept because pods of a failed JobSet can vanish."""

    name: str
    uid: str
    replicated_job: str
    job_index: str
    completion_index: str
    restart_attempt: int
    node: str
    phase: str
    ready: bool
    deleted: bool = False
    exits: list[ContainerExit] = field(default_factory=list)
    disruption: tuple[str, str] | None = None
    status_reason: str = ""
    status_message: str = ""
    waiting: list[ContainerWaiting] = field(default_factory=list)
    #: The scheduler's reason the pod has no node (its PodScheduled condition), while it has none.
    unschedulable: str = ""
    #: When the pod got its node (POSIX seconds; None: not yet, or not said).
    scheduled_at: float | None = None

    @classmethod
    def from_pod(cls, pod: Mapping) -> PodRecord:
        meta, status = pod.get("metadata", {}), pod.get("status", {}) or {}
        labels = meta.get("labels") or {}
        exits = []
        for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            for state_key in ("state", "lastState"):
                terminated = (cs.get(state_key) or {}).get("terminated")
                if terminated and terminated.get("exitCode", 0) != 0:
                    exits.append(
                        ContainerExit(
                            cs.get("name", ""),
                            int(terminated.get("exitCode")),
                            terminated.get("reason") or "",
                            terminated.get("message") or "",
                        )
                    )
                    break
        disruption, ready, unschedulable, scheduled_at = None, False, "", None
        for condition in status.get("conditions") or []:
            if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
                disruption = (condition.get("reason") or "", condition.get("message") or "")
            if condition.get("type") == "Ready" and condition.get("status") == "True":
                ready = True
            if condition.get("type") == "PodScheduled":
                if condition.get("status") == "True":
                    scheduled_at = posix_time(condition.get("lastTransitionTime"))
                elif condition.get("reason") == "Unschedulable":
                    unschedulable = condition.get("message") or "Unschedulable"
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            replicated_job=labels.get(REPLICATED_JOB_LABEL, ""),
            job_index=labels.get(JOB_INDEX_LABEL, ""),
            completion_index=labels.get(COMPLETION_INDEX_LABEL, ""),
            restart_attempt=int(labels.get(RESTART_ATTEMPT_LABEL) or 0),
            node=(pod.get("spec") or {}).get("nodeName") or "",
            phase=status.get("phase") or "",
            ready=ready,
            exits=exits,
            disruption=disruption,
            status_reason=status.get("reason") or "",
            status_message=status.get("message") or "",
            waiting=_waiting(status),
            unschedulable=unschedulable,
            scheduled_at=scheduled_at,
        )

    def running(self) -> bool:
        """Every container of the pod started: the kubelet runs it (Ready, or Running with none waiting)."""
        return not self.deleted and (self.ready or (self.phase == "Running" and not self.waiting))

    def failed(self) -> bool:
        return bool(self.exits or self.disruption or self.phase == "Failed")

    def cause(self, lost_nodes: Iterable[str] = ()) -> str:
        """Why the pod failed, without which pod it was: pods failing alike are reported together."""
        parts = [e.describe() for e in self.exits]
        if self.disruption:
            reason, message = self.disruption
            meaning = DISRUPTION_REASONS.get(reason, "disrupted")
            parts.append(f"{meaning} [DisruptionTarget {reason}: {message.strip()}]")
        if self.node and self.node in set(lost_nodes) and (self.disruption or ("",))[0] != "DeletionByPodGC":
            parts.append("host lost: its node no longer exists")
        if self.status_reason:
            parts.append(f"pod {self.status_reason}: {self.status_message.strip()}".rstrip(": "))
        return "; ".join(parts) or f"phase {self.phase or 'unknown'}"


def _waiting(status: Mapping) -> list[ContainerWaiting]:
    """The containers the kubelet has not started, with its reason (a pod's init and main containers)."""
    found = []
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            found.append(
                ContainerWaiting(
                    cs.get("name", ""), waiting.get("reason") or "", waiting.get("message") or "", cs.get("image") or ""
                )
            )
    return found


def progress_line(jobset: Mapping, pods: Iterable[PodRecord], kueue_note: str = "") -> str:
    """One line a user can follow: suspension, restarts, and Jobs and pods per replicated job."""
    if is_suspended(jobset):
        state = "suspended (waiting for Kueue admission" + (f": {kueue_note}" if kueue_note else "") + ")"
    else:
        state = "running"
    pods_by_rj: dict[str, dict[str, int]] = {}
    attempt = restarts(jobset)
    for pod in pods:
        if pod.deleted or pod.restart_attempt != attempt:
            continue
        counts = pods_by_rj.setdefault(pod.replicated_job, {})
        key = "ready" if pod.ready else pod.phase.lower() or "unknown"
        counts[key] = counts.get(key, 0) + 1
    parts = [state, f"restarts {attempt}"]
    for rj in jobset.get("status", {}).get("replicatedJobsStatus") or []:
        jobs = ", ".join(f"{k} {rj.get(k) or 0}" for k in ("active", "ready", "succeeded", "failed"))
        pod_counts = pods_by_rj.get(rj["name"], {})
        pod_text = ", ".join(f"{v} {k}" for k, v in sorted(pod_counts.items())) or "none"
        parts.append(f"{rj['name']}: jobs {jobs}; pods {pod_text}")
    return "; ".join(parts)


def kueue_note(workloads: Iterable[Mapping]) -> str:
    """Why Kueue has not admitted the workload yet (the QuotaReserved/Admitted condition messages)."""
    notes = []
    for workload in workloads:
        for condition in workload.get("status", {}).get("conditions") or []:
            if condition.get("type") in ("QuotaReserved", "Admitted") and condition.get("status") != "True":
                notes.append(condition.get("message") or condition.get("reason") or "")
    return "; ".join(n for n in dict.fromkeys(notes) if n)


def explain_failure(
    jobset: Mapping,
    pods: Iterable[PodRecord],
    lost_nodes: Iterable[str] = (),
    log_tail: Iterable[str] = (),
    log_pod: str = "",
) -> str:
    """The error a user reads first: JobSet condition, failed replicated job, pod exits, last log lines."""
    name = jobset.get("metadata", {}).get("name", "")
    condition = terminal_condition(jobset) or {}
    lines = [
        f"JobSet {jobset.get('metadata', {}).get('namespace', '')}/{name} failed: "
        f"{condition.get('type', 'Failed')} ({condition.get('reason', 'unknown reason')}): "
        f"{condition.get('message', '')} [restarts: {restarts(jobset)}]"
    ]
    job = failed_job_name(condition)
    if job:
        lines.append(f"Failed replicated job: {replicated_job_of(job, jobset) or 'unknown'} (child Job {job})")
    lost = set(lost_nodes)
    failed = sorted((p for p in pods if p.failed() or p.node in lost), key=lambda p: (-p.restart_attempt, p.name))
    host_loss = [p for p in failed if p.node in lost or (p.disruption or ("",))[0] == "DeletionByPodGC"]
    maintenance = [p for p in failed if p.disruption and p.disruption[0] != "DeletionByPodGC"]
    if host_loss:
        nodes = sorted({p.node for p in host_loss})
        lines.append(f"Cause: TPU host lost (node gone: {', '.join(nodes)})")
    elif maintenance:
        lines.append("Cause: TPU host maintenance or preemption (pod condition DisruptionTarget)")
    groups: dict[tuple[int, str, str], list[PodRecord]] = {}
    for pod in failed:
        groups.setdefault((pod.restart_attempt, pod.replicated_job, pod.cause(lost)), []).append(pod)
    if groups:
        lines.append("Failed pods (newest restart attempt first):")
    for (attempt, replicated, cause), members in list(groups.items())[:10]:
        first = sorted(members, key=lambda p: (p.job_index, p.completion_index))[0]
        nodes = sorted({p.node for p in members if p.node})
        where = f"nodes {', '.join(nodes)}" if len(nodes) <= 4 else f"{len(nodes)} nodes"
        lines.append(
            f"  attempt {attempt}, {replicated}: {len(members)} pod(s): {cause} "
            f"(e.g. pod {first.name}, job {first.job_index} index {first.completion_index}; {where})"
        )
    tail = list(log_tail)
    if tail:
        lines.append(
            f"Last {len(tail)} lines of the workload log{f' (last pod followed: {log_pod})' if log_pod else ''}:"
        )
        lines += [f"  | {line}" for line in tail]
    else:
        lines.append("No workload log was captured.")
    return "\n".join(lines)


def preemption(jobset: Mapping, pods: Iterable[PodRecord], lost_nodes: Iterable[str] = ()) -> dict[str, str] | None:
    """Why the JobSet's last attempt counts as preempted (``reason``, ``pod``, ``node``), or None when its failure
    is the workload's own.

    One pod of the last attempt disrupted, shut down with its node, or on a node that is gone makes the whole
    attempt preempted: a Pathways trainer fails when one of its TPU workers goes. Exit code 143 counts only on
    a pod of the Job that failed first, because JobSet's own teardown of an attempt SIGTERMs the others.
    """
    attempt, lost = restarts(jobset), set(lost_nodes)
    current = [p for p in pods if p.restart_attempt == attempt]

    def found(reason: str, pod: PodRecord) -> dict[str, str]:
        return {"reason": reason, "pod": pod.name, "node": pod.node}

    for pod in current:
        if pod.disruption and pod.disruption[0] in DISRUPTION_REASONS:
            return found(f"DisruptionTarget {pod.disruption[0]}: {DISRUPTION_REASONS[pod.disruption[0]]}", pod)
        if pod.node and pod.node in lost:
            return found(f"host lost: node {pod.node} no longer exists", pod)
        if pod.phase == "Failed" and pod.status_reason in NODE_SHUTDOWN_REASONS:
            return found(f"pod {pod.status_reason}: {pod.status_message.strip() or 'node shutdown'}", pod)
    first_failed = failed_job_name(terminal_condition(jobset) or {})
    name = jobset.get("metadata", {}).get("name", "")
    for pod in current:
        in_first_failed = first_failed is None or f"{name}-{pod.replicated_job}-{pod.job_index}" == first_failed
        if in_first_failed and any(e.exit_code == SIGTERM_EXIT_CODE for e in pod.exits):
            return found(f"exit code {SIGTERM_EXIT_CODE}: SIGTERM, the node shut down or the pod was evicted", pod)
    return None
