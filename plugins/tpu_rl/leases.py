"""Leases: what runs that share something (a cluster, a group of TPU capacity) record about each other.

One JSON document per shared thing lists its holders: the runs using it now, each with the TPU slices it
holds and since when. Every run reads and rewrites the whole document with a generation precondition
(``operators/leases.py``), so concurrent runs never lose each other's entries; this module is the pure
part: admitting a holder under a limit, removing one, and expiring the holders whose run has ended.

The expiry rule, for a run that crashed without leaving: a holder is dropped when Airflow says its DAG
run has ended (success or failed) or no longer exists, the same rule the reaper applies (``reaper.py``).
A queued or running run keeps its lease however long it runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from tpu_rl.reaper import ENDED_STATES, MISSING
from tpu_rl.run import RunIdentity

#: The object prefix of every lease document in the run's bucket.
LEASES_PREFIX = "tpu-rl/leases/"


def lease_object(kind: str, name: str) -> str:
    return f"{LEASES_PREFIX}{kind}/{name}.json"


def holder_has_ended(run_state: str) -> bool:
    """The expiry rule: the holder's DAG run has ended, or Airflow no longer knows it."""
    return run_state in ENDED_STATES or run_state == MISSING


@dataclass(frozen=True)
class Holder:
    """One run holding a lease: its identity (the reaper's annotations), the slices it holds, since when."""

    dag_id: str
    run_id: str
    key: str
    since: str
    slices: int = 0

    @classmethod
    def of(cls, run: RunIdentity, since: str, slices: int = 0) -> Holder:
        return cls(run.dag_id, run.run_id, run.key, since, slices)

    @property
    def run(self) -> RunIdentity:
        return RunIdentity(self.dag_id, self.run_id)

    def describe(self) -> str:
        held = f"{self.slices} slice(s), " if self.slices else ""
        return f"{self.dag_id} / {self.run_id} ({held}since {self.since})"


@dataclass(frozen=True)
class Lease:
    """The holders of one shared thing, oldest first. ``closing``: the last holder left and is deleting the
    thing (a cluster); a run that comes now waits until it is gone, then creates it again."""

    holders: tuple[Holder, ...] = ()
    closing: bool = False

    @classmethod
    def parse(cls, data: bytes | None) -> Lease:
        if not data:
            return cls()
        document = json.loads(data)
        return cls(tuple(Holder(**h) for h in document.get("holders", [])), bool(document.get("closing")))

    def dump(self) -> str:
        return json.dumps({"holders": [asdict(h) for h in self.holders], "closing": self.closing}, indent=2)

    def find(self, key: str) -> Holder | None:
        return next((h for h in self.holders if h.key == key), None)

    @property
    def slices(self) -> int:
        return sum(h.slices for h in self.holders)

    def admit(self, holder: Holder, limit: int | None = None) -> Lease | None:
        """The lease with ``holder`` in it, or None when its slices do not fit under ``limit`` now. A run that
        already holds it keeps its entry (a retried task re-enters)."""
        if self.find(holder.key):
            return self
        if limit is not None and self.slices + holder.slices > limit:
            return None
        return replace(self, holders=(*self.holders, holder), closing=False)

    def without(self, key: str) -> Lease:
        return replace(self, holders=tuple(h for h in self.holders if h.key != key))

    def expire(self, run_state: Callable[[RunIdentity], str], keep: str = "") -> tuple[Lease, list[Holder]]:
        """Drops the holders whose run has ended (:func:`holder_has_ended`); ``keep`` is the caller's own key,
        never asked about. Returns the lease left and the holders dropped."""
        ended = [h for h in self.holders if h.key != keep and holder_has_ended(run_state(h.run))]
        dropped = {h.key for h in ended}
        return replace(self, holders=tuple(h for h in self.holders if h.key not in dropped)), ended


@dataclass
class LeaseChange:
    """What one read-modify-write of a lease decided: the lease to write (None: write nothing) and a result
    for the caller."""

    lease: Lease | None
    result: object = None
    notes: list[str] = field(default_factory=list)
