"""Failing over between capacity candidates (``tpu_rl.candidates``): which candidate the run's slices come from
next (what the TPU time on each cost: ``training_metrics.cost_by_candidate``).

``create_tpu_pools`` and ``train_rl`` record why the run left a candidate (an :class:`Attempt`: a stockout with no
wait left, missing quota, its wait run out, a preemption) and ask :func:`next_candidate` where to go: the same
candidate again (a preemption within ``max_preemptions_per_candidate``), the next one (the run's pools deleted
first), or nowhere (every candidate tried: give up, saying why each was left). Candidates are tried once each, in
order: one left for a stockout is not tried again in the same run (a new run starts from the first). All the
run's slices move together: they stay in one zone, since the DCN between a run's slices does not cross zones.
Pure, as ``tpu_rl.leases`` and ``tpu_rl.preemption``: the operators read GKE and the record, and apply the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from tpu_rl.candidates import Candidate
from tpu_rl.timestamps import parse_time


class Outcome(StrEnum):
    """Why the run left (or, for a preemption, may leave) a candidate."""

    #: GKE had no capacity for a pool, and the candidate has no wait (``wait_minutes`` 0).
    STOCKOUT = "stockout"
    #: The project lacks the Compute Engine quota for the pools in the region: no wait brings it.
    QUOTA = "quota"
    #: GKE had no capacity for the candidate's ``wait_minutes``.
    WAIT_EXPIRED = "wait-expired"
    #: The slice's VMs were reclaimed (Spot, host maintenance) while the training ran.
    PREEMPTED = "preempted"
    #: The preflight found the candidate cannot give the run its slices (its reservation, its quota): never tried.
    PREFLIGHT = "left out by the preflight"


@dataclass(frozen=True)
class Attempt:
    """One end of the run's time on a candidate (``candidate``: its index), with GKE's or the pod's words."""

    candidate: int
    outcome: Outcome
    detail: str = ""
    at: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": str(self.outcome)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        return cls(int(data["candidate"]), Outcome(data["outcome"]), data.get("detail", ""), data.get("at", ""))


@dataclass(frozen=True)
class TryCandidate:
    """Create the run's pools on candidate ``index`` (``why``: for the log). ``leaving``: the candidate whose pools
    must be deleted first (None: the first candidate, or the same one again after a preemption)."""

    index: int
    candidate: Candidate
    why: str
    leaving: int | None = None


@dataclass(frozen=True)
class GiveUp:
    """Every candidate was tried: ``tried`` says why each was left, in order."""

    tried: tuple[str, ...]

    def message(self) -> str:
        return (
            "no capacity candidate gave the run its slices: "
            + "; ".join(self.tried)
            + "; fix: trigger the run again later, give a candidate a longer wait_minutes, or add candidates "
            "(another zone of the region, another capacity type)"
        )


def next_candidate(
    candidates: Sequence[Candidate], attempts: Sequence[Attempt], max_preemptions_per_candidate: int
) -> TryCandidate | GiveUp:
    """Where the run's slices come from next, after ``attempts`` (oldest first).

    A preempted run stays on its candidate until it was preempted ``max_preemptions_per_candidate`` times there
    (0: it always stays); any other outcome leaves the candidate at once. A candidate the preflight left out is
    never tried."""
    refused = {a.candidate for a in attempts if a.outcome is Outcome.PREFLIGHT}
    tried = [a for a in attempts if a.outcome is not Outcome.PREFLIGHT]
    if not tried:
        first = next((i for i in range(len(candidates)) if i not in refused), None)
        if first is None:
            return GiveUp(tuple(describe_attempts(candidates, attempts)))
        return TryCandidate(first, candidates[first], f"candidate {first} ({candidates[first].describe()}) first")
    last = tried[-1]
    here = candidates[last.candidate]
    if last.outcome is Outcome.PREEMPTED:
        preempted = sum(1 for a in attempts if a.candidate == last.candidate and a.outcome is Outcome.PREEMPTED)
        if not max_preemptions_per_candidate or preempted < max_preemptions_per_candidate:
            budget = f" of {max_preemptions_per_candidate}" if max_preemptions_per_candidate else ""
            return TryCandidate(
                last.candidate, here, f"preemption {preempted}{budget} on candidate {last.candidate}: resuming there"
            )
    following = next((i for i in range(last.candidate + 1, len(candidates)) if i not in refused), None)
    if following is None:
        return GiveUp(tuple(describe_attempts(candidates, attempts)))
    return TryCandidate(
        following,
        candidates[following],
        f"candidate {last.candidate} ({here.describe()}) left: {_reason(last)}; trying candidate {following} "
        f"({candidates[following].describe()})",
        leaving=last.candidate,
    )


def _reason(attempt: Attempt) -> str:
    detail = f" ({attempt.detail})" if attempt.detail else ""
    return f"{attempt.outcome}{detail}"


def describe_attempts(
    candidates: Sequence[Candidate], attempts: Sequence[Attempt], serving: int | None = None
) -> list[str]:
    """One line per candidate the run reached: why it was left (its last attempt), or that the slices came from
    it (``serving``): what the task log and the Training tab show."""
    lines = []
    for index, candidate in enumerate(candidates):
        own = [a for a in attempts if a.candidate == index]
        if index == serving:
            preempted = sum(1 for a in own if a.outcome is Outcome.PREEMPTED)
            after = f" after {preempted} preemption(s)" if preempted else ""
            lines.append(f"candidate {index} ({candidate.describe()}): the slices came from it{after}")
        elif own:
            lines.append(f"candidate {index} ({candidate.describe()}): left, {_reason(own[-1])}")
    return lines


def candidate_at(attempts: Sequence[Attempt], moment: datetime, serving: int) -> int:
    """The candidate the run's slices came from at ``moment`` (a slice's nodes there since then): the run stays on
    a candidate until an attempt there ends its time on it, so it is the candidate of the first attempt after
    ``moment``; past every attempt, ``serving`` (where the run is now). For the cost of a slice that ran on two
    candidates (moved after preemptions), a span on each."""
    return next((a.candidate for a in attempts if a.at and parse_time(a.at) > moment), serving)
