"""What the reaper decides about each resource a run of this package left, and the report a person reads.

Pure: the operator (operators/reaper.py) lists the resources and asks Airflow about their runs; this
module decides keep or reap and formats the table. A resource is only ever considered when it carries
this package's ownership marks (gke.cluster_owner / gke.pool_owner, the run annotations of JobSets and
Secrets); everything else is never listed.

Two Airflow environments may share a project (``tpu_rl.environment``): this Airflow knows only its own runs, and
would call another environment's live run missing. So the marks name the run's environment, and
(:func:`tpu_rl.environment.elsewhere`):

=====================  ====================  ===============================================================
this reaper            the resource's mark   decision
=====================  ====================  ===============================================================
unnamed or named E     none                  judged as always (made before the mark, or by an unnamed one)
named E                E                     judged as always
named E                F                     kept: "created by Airflow environment F, not this one (E)"
unnamed                F                     kept: "... not this one (unnamed)": it is someone's
=====================  ====================  ===============================================================

Another environment's run is not asked about (:data:`NOT_ASKED`), and what it has in a cluster (a pool, a JobSet,
a Secret, a holder of a shared cluster's lease) keeps that cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tpu_rl.environment import called, elsewhere
from tpu_rl.run import RunIdentity

#: Airflow DAG-run states in which a run may still use what it created.
LIVE_STATES = ("queued", "running")
#: The states after which a run uses nothing any more; any other state keeps what it made.
ENDED_STATES = ("success", "failed")
#: The run is not in Airflow's metadata database (deleted, or the database was lost or restored).
MISSING = "missing"
#: The run is of another Airflow environment: this one does not know it, and was not asked.
NOT_ASKED = "not asked"

CLUSTER, NODE_POOL, JOBSET, SECRET = "cluster", "node pool", "JobSet", "Secret"


@dataclass(frozen=True)
class Resource:
    """One resource with this package's ownership marks.

    ``where``: (project, location) for GKE resources; with the cluster (and namespace) for the others.
    ``chips``: TPU chips it holds (a TPU pool's; a cluster's own TPU pools'); ``kept_by_design``: why it
    must never be deleted whatever its run's state (keep_cluster); ``lease``: a shared cluster's lease
    (``gs://`` URI), whose live holders use it; ``being_deleted``: what is deleting it when GKE shows it STOPPING
    (its delete operation, or its cluster's), empty otherwise.
    """

    kind: str
    name: str
    owner: RunIdentity
    created: datetime
    project: str
    location: str
    cluster: str = ""
    namespace: str = ""
    chips: int = 0
    kept_by_design: str = ""
    uid: str = ""
    lease: str = ""
    being_deleted: str = ""

    @property
    def path(self) -> str:
        if self.kind == CLUSTER:
            return f"projects/{self.project}/locations/{self.location}/clusters/{self.name}"
        if self.kind == NODE_POOL:
            return f"projects/{self.project}/locations/{self.location}/clusters/{self.cluster}/nodePools/{self.name}"
        return f"{self.cluster}: {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Decision:
    resource: Resource
    run_state: str
    reap: bool
    reason: str
    age: timedelta
    #: Chip-hours the resource has billed since it was created (Airflow's task API gives a run's state,
    #: not when it ended).
    chip_hours: float = 0.0
    deleted: bool = field(default=False, compare=False)

    @property
    def word(self) -> str:
        """reap, keep, or being deleted (by someone else: nobody needs to remove it)."""
        if self.resource.being_deleted:
            return "being deleted"
        return "reap" if self.reap else "keep"

    def row(self) -> dict[str, object]:
        r = self.resource
        return {
            "kind": r.kind,
            "resource": r.path,
            "owner_dag_id": r.owner.dag_id,
            "owner_run_id": r.owner.run_id,
            "owner_environment": r.owner.environment,
            "run_state": self.run_state,
            "age_minutes": round(self.age.total_seconds() / 60, 1),
            "decision": self.word,
            "reason": self.reason,
            "tpu_chips": r.chips,
            "chip_hours": round(self.chip_hours, 2),
            "deleted": self.deleted,
        }


def asks_about(run: RunIdentity, here: str) -> bool:
    """Whether this Airflow (environment ``here``) is asked for the run's state: not about another environment's."""
    return not elsewhere(run.environment, here)


def may_use(run_state: str) -> bool:
    """A run in this state may be using what it has in a cluster: it is live, or of another environment."""
    return run_state in LIVE_STATES or run_state == NOT_ASKED


def decide(
    resource: Resource,
    run_state: str,
    now: datetime,
    grace: timedelta,
    users: tuple[RunIdentity, ...] = (),
    here: str = "",
) -> Decision:
    """Keep or reap one resource.

    ``run_state``: its run's DAG-run state, MISSING, or NOT_ASKED. ``users``: the runs that may use it, having
    objects inside it (a cluster another run adopted keeps running for that run). ``here``: the reaper's own
    Airflow environment ("" unnamed); a resource another one made is kept (the module's table)."""
    age = now - resource.created
    chip_hours = resource.chips * max(age.total_seconds(), 0) / 3600

    def keep(reason: str) -> Decision:
        return Decision(resource, run_state, False, reason, age, chip_hours)

    owner = resource.owner
    if resource.being_deleted:
        return keep(f"being deleted: {resource.being_deleted}")
    if elsewhere(owner.environment, here):
        return keep(f"created by Airflow environment {owner.environment}, not this one ({called(here)})")
    if resource.kept_by_design:
        return keep(resource.kept_by_design)
    if run_state not in ENDED_STATES and run_state != MISSING:
        return keep(f"its run is {run_state}")
    if users:
        return keep(_in_use_by(users[0], here))
    if age < grace:
        return keep(f"younger than the grace period ({_minutes(grace)})")
    ended = "no longer exists in Airflow" if run_state == MISSING else f"ended ({run_state})"
    return Decision(resource, run_state, True, f"its run {ended}", age, chip_hours)


def _in_use_by(user: RunIdentity, here: str) -> str:
    if elsewhere(user.environment, here):
        return f"in use by the run {user.dag_id} / {user.run_id} of Airflow environment {user.environment}"
    return f"in use by the live run {user.dag_id} / {user.run_id}"


def _minutes(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 60:.1f} min"


def left_behind_capacity(decisions: list[Decision]) -> list[Decision]:
    """Reapable TPU capacity that is still there (not deleted by this reaper run)."""
    return [d for d in decisions if d.reap and d.resource.chips and not d.deleted]


def _owner(run: RunIdentity) -> str:
    return f"{run.dag_id} / {run.run_id}" + (f" ({run.environment})" if run.environment else "")


def report(decisions: list[Decision]) -> str:
    """The table a person reads in the task log."""
    if not decisions:
        return "No resource with this package's ownership marks was found."
    header = ("decision", "kind", "resource", "owner run", "run state", "age", "TPU chips", "chip-hours", "reason")
    rows = [header] + [
        (
            d.word + (" (deleted)" if d.deleted else ""),
            d.resource.kind,
            d.resource.path,
            _owner(d.resource.owner),
            d.run_state,
            _minutes(d.age),
            str(d.resource.chips),
            f"{d.chip_hours:.2f}",
            d.reason,
        )
        for d in decisions
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
