"""Leases: what runs that share something (a cluster, a group of TPU capacity) record about each other.

One JSON document per shared thing lists its holders: the runs using it now, each with the TPU slices it
holds and since when. Every run reads and rewrites the whole document with a generation precondition
(``operators/leases.py``), so concurrent runs never lose each other's entries; this module is the pure
part: the protocol's decisions (a run joins or leaves a shared cluster, takes or gives back capacity), each a
function of the lease, the run and Airflow's run states that returns a typed :class:`LeaseChange`.

The expiry rule, for a run that crashed without leaving: a holder is dropped when Airflow says its DAG
run has ended (success or failed) or no longer exists, the same rule the reaper applies (``reaper.py``).
A queued or running run keeps its lease however long it runs. The same rule ends a lease's *closing* mark
when the run that set it ended without deleting the cluster (its delete kept failing, or it kept the cluster).

Two Airflow environments may share a bucket (``tpu_rl.environment``), and each knows only its own runs. A holder
names its run's environment (when named), and a run asks its Airflow only about the holders of its own
environment, and about the unmarked ones (written before the mark, or by an unnamed environment): a holder of
another environment is never expired here, also by an unnamed environment. Such a holder keeps its slices of a
capacity group and keeps a shared cluster up; the notes then name its environment, whose runs end their own
entries (or a person removes the entries of an environment that was deleted: docs/how-to/programs.md, "Two Airflow
environments").
A run is the same holder when its key matches and the entry is of its environment or unmarked.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Generic, TypeVar

from tpu_rl.environment import called, elsewhere
from tpu_rl.reaper import ENDED_STATES, MISSING
from tpu_rl.run import RunIdentity

R = TypeVar("R")

#: The object prefix of every lease document in the run's bucket.
LEASES_PREFIX = "tpu-rl/leases/"


def lease_object(kind: str, name: str) -> str:
    return f"{LEASES_PREFIX}{kind}/{name}.json"


def cluster_lease_object(project: str, region: str, cluster: str) -> str:
    """A shared cluster's lease, in the bucket of the runs that share it."""
    return lease_object("cluster", f"{project}-{region}-{cluster}")


def holder_has_ended(run_state: str) -> bool:
    """The expiry rule: the holder's DAG run has ended, or Airflow no longer knows it."""
    return run_state in ENDED_STATES or run_state == MISSING


@dataclass(frozen=True)
class Holder:
    """One run holding a lease: its identity (the reaper's annotations), the slices it holds, since when, and its
    Airflow environment ("": unnamed, or an entry written before environments were recorded)."""

    dag_id: str
    run_id: str
    key: str
    since: str
    slices: int = 0
    environment: str = ""

    @classmethod
    def of(cls, run: RunIdentity, since: str, slices: int = 0) -> Holder:
        return cls(run.dag_id, run.run_id, run.key, since, slices, run.environment)

    @property
    def run(self) -> RunIdentity:
        return RunIdentity(self.dag_id, self.run_id, environment=self.environment)

    def is_(self, me: Holder) -> bool:
        """This entry is the run ``me``: the same key, and ``me``'s environment or none recorded."""
        return self.key == me.key and not elsewhere(self.environment, me.environment)

    def describe(self) -> str:
        held = f"{self.slices} slice(s), " if self.slices else ""
        environment = f" of Airflow environment {self.environment}" if self.environment else ""
        return f"{self.dag_id} / {self.run_id}{environment} ({held}since {self.since})"

    def document(self) -> dict:
        """The entry as the lease stores it; an unnamed holder's as before environments were recorded, which
        earlier versions of the package read."""
        return {k: v for k, v in asdict(self).items() if k != "environment" or v}


@dataclass(frozen=True)
class Lease:
    """The holders of one shared thing, oldest first. ``closing``: the last holder left and is deleting the
    thing (a cluster); a run that comes now waits until it is gone, then creates it again. ``closer``: that
    last holder (None in a lease written before it was recorded)."""

    holders: tuple[Holder, ...] = ()
    closing: bool = False
    closer: Holder | None = None

    @classmethod
    def parse(cls, data: bytes | None) -> Lease:
        if not data:
            return cls()
        document = json.loads(data)
        closer = document.get("closer")
        return cls(
            tuple(Holder(**h) for h in document.get("holders", [])),
            bool(document.get("closing")),
            Holder(**closer) if closer else None,
        )

    def dump(self) -> str:
        return json.dumps(
            {
                "holders": [h.document() for h in self.holders],
                "closing": self.closing,
                "closer": self.closer.document() if self.closer else None,
            },
            indent=2,
        )

    def find(self, me: Holder) -> Holder | None:
        return next((h for h in self.holders if h.is_(me)), None)

    @property
    def slices(self) -> int:
        return sum(h.slices for h in self.holders)

    def admit(self, holder: Holder, limit: int | None = None) -> Lease | None:
        """The lease with ``holder`` in it, or None when its slices do not fit under ``limit`` now. A run that
        already holds it keeps its entry (a retried task re-enters)."""
        if self.find(holder):
            return self
        if limit is not None and self.slices + holder.slices > limit:
            return None
        return replace(self, holders=(*self.holders, holder), closing=False, closer=None)

    def without(self, me: Holder) -> Lease:
        return replace(self, holders=tuple(h for h in self.holders if not h.is_(me)))

    def closed_by(self, holder: Holder) -> Lease:
        """The lease once its last holder has left to delete the thing."""
        return replace(self, holders=(), closing=True, closer=holder)

    def closing_expired(self, run_state: Callable[[RunIdentity], str], here: str = "") -> bool:
        """The lease is closing, and the run deleting the thing has ended (:func:`holder_has_ended`) without
        finishing: a run may take the thing over. A closing lease without its closer, or whose closer is of another
        Airflow environment than ``here``, never expires here."""
        closer = self.closer
        return (
            self.closing
            and closer is not None
            and not elsewhere(closer.environment, here)
            and holder_has_ended(run_state(closer.run))
        )

    def expire(self, run_state: Callable[[RunIdentity], str], me: Holder) -> tuple[Lease, list[Holder]]:
        """Drops the holders whose run has ended (:func:`holder_has_ended`), asking ``run_state`` only about those of
        the caller ``me``'s environment (and unmarked ones); ``me`` is never asked about. Returns the lease left
        and the holders dropped."""
        ended = [
            h
            for h in self.holders
            if not h.is_(me) and not elsewhere(h.environment, me.environment) and holder_has_ended(run_state(h.run))
        ]
        return replace(self, holders=tuple(h for h in self.holders if h not in ended)), ended

    def of_other_environments(self, here: str) -> tuple[Holder, ...]:
        """The holders of other Airflow environments than ``here``: only their own environment ends their entries."""
        return tuple(h for h in self.holders if elsewhere(h.environment, here))


#: Airflow's state of a run (a DAG run state, or ``MISSING``), asked by the expiry rule.
RunState = Callable[[RunIdentity], str]


@dataclass
class LeaseChange(Generic[R]):
    """What one read-modify-write of a lease decided: the lease to write (None: write nothing), what it means for
    the caller (typed by the decision), and notes for the log (the holders that expired)."""

    lease: Lease | None
    result: R
    notes: list[str] = field(default_factory=list)


def expired_notes(expired: list[Holder]) -> list[str]:
    return [f"lease of {h.describe()} expired: its run has ended or is gone" for h in expired]


def elsewhere_notes(holders: tuple[Holder, ...], here: str, holds: str) -> list[str]:
    """Why ``holders`` of other Airflow environments stay in the lease, and what a person does if one of those
    environments no longer exists."""
    return [
        f"{h.describe()} {holds}: this Airflow environment ({called(here)}) never expires another one's entry; "
        f"if {h.environment} was deleted, remove its entry from the lease "
        "(docs/how-to/programs.md, 'Two Airflow environments')"
        for h in holders
    ]


# -- a shared cluster's lease ---------------------------------------------------------------------------


def join_cluster(lease: Lease, me: Holder, state: RunState, cluster_exists: bool) -> LeaseChange[Lease | None]:
    """A run joins a shared cluster's lease (result: the lease it is in), or waits (result None) while the last
    run to leave is still deleting the cluster. A closing lease whose deleting run ended without deleting is
    taken over."""
    lease, expired = lease.expire(state, me)
    notes = expired_notes(expired)
    if lease.closing and cluster_exists and not lease.find(me):
        if not lease.closing_expired(state, me.environment):
            closer = lease.closer
            if closer is not None and elsewhere(closer.environment, me.environment):
                notes += elsewhere_notes((closer,), me.environment, "is deleting the cluster")
            return LeaseChange(lease if expired else None, None, notes)
        notes.append(
            f"{lease.closer.describe()} left the cluster to delete it and its run has ended "
            "without deleting it: this run takes the cluster over"
        )
    joined = lease.admit(me)
    return LeaseChange(joined, joined, notes)


@dataclass(frozen=True)
class Leaving:
    """What a run leaving a shared cluster's lease found: whether it held it, and the live runs still in it."""

    held: bool
    still_used_by: tuple[Holder, ...]

    @property
    def last(self) -> bool:
        """This run was the lease's last holder: it deletes the cluster (or keeps it with keep_cluster)."""
        return self.held and not self.still_used_by


def leave_cluster(lease: Lease, me: Holder, state: RunState, closing: bool) -> LeaseChange[Leaving]:
    """A run leaves a shared cluster's lease. The last to leave marks the lease closing, with itself as the
    closer, when it deletes the cluster (``closing``), so a run joining meanwhile waits for the delete. A retry
    of the closer's own delete counts as the last again."""
    retrying_delete = lease.closing and (lease.closer is None or lease.closer.is_(me))
    if not lease.find(me) and not retrying_delete:
        return LeaseChange(None, Leaving(held=False, still_used_by=lease.holders))
    lease, expired = lease.expire(state, me)
    lease = lease.without(me)
    notes = expired_notes(expired)
    if lease.holders:
        notes += elsewhere_notes(lease.of_other_environments(me.environment), me.environment, "keeps the cluster")
        return LeaseChange(lease, Leaving(True, lease.holders), notes)
    return LeaseChange(lease.closed_by(me) if closing else lease, Leaving(True, ()), notes)


def drop_holder(lease: Lease, me: Holder) -> LeaseChange[Holder | None]:
    """The lease without the run ``me`` (result: its entry, None when it held none)."""
    return LeaseChange(lease.without(me), lease.find(me))


# -- a capacity group's lease ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityTaken:
    """A run's try to take its slices of a capacity group: whether it holds them now, and the group's lease."""

    taken: bool
    lease: Lease


def take_capacity(lease: Lease, me: Holder, limit: int, state: RunState) -> LeaseChange[CapacityTaken]:
    """Admits the run's slices (``me.slices``) while the group's holders leave room under ``limit``; a run that
    holds them already keeps them. Holders whose run has ended are dropped first; those of other Airflow
    environments are not asked about, and while the run waits the notes name them."""
    lease, expired = lease.expire(state, me)
    admitted = lease.admit(me, limit)
    if admitted is None:
        notes = expired_notes(expired) + elsewhere_notes(
            lease.of_other_environments(me.environment), me.environment, "holds slices of the group"
        )
        return LeaseChange(lease if expired else None, CapacityTaken(False, lease), notes)
    return LeaseChange(admitted, CapacityTaken(True, admitted), expired_notes(expired))
