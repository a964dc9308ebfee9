"""The preemption budget of a run, and what its preemptions cost.

``train_rl`` resumes a preempted training (``jobset_status.preemption`` says which failures count) from its
newest complete checkpoint, up to ``max_preemptions`` times per run: a budget apart from Airflow's retries,
which stay for the workload's own failures. Each preemption is kept in the run's training record, so a retried
or cleared ``train_rl`` counts the earlier ones. Pure: the operator reads the bucket and the clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime


@dataclass(frozen=True)
class PreemptionRecord:
    """One preemption of the run.

    :param preempted_at_step: the last step the trainer reached (its TensorBoard log, or its newest step folder).
    :param resumed_from: the step the trainer restores (0: the base checkpoint); None when the budget was spent
        and the training was not resumed.
    :param seconds_lost: from the newest complete checkpoint's commit (else the attempt's start) to the resume.
    :param set_aside: where the half-written or broken step folders went (``gs://`` URIs).
    """

    number: int
    reason: str
    preempted_at: str
    preempted_at_step: int
    resumed_from: int | None
    seconds_lost: float
    set_aside: tuple[str, ...] = ()

    @property
    def steps_recomputed(self) -> int:
        if self.resumed_from is None:
            return 0
        return max(self.preempted_at_step - self.resumed_from, 0)

    def to_json(self) -> dict:
        return {**asdict(self), "set_aside": list(self.set_aside), "steps_recomputed": self.steps_recomputed}

    @classmethod
    def from_json(cls, data: Mapping) -> PreemptionRecord:
        fields = {k: v for k, v in data.items() if k != "steps_recomputed"}
        return cls(**{**fields, "set_aside": tuple(data.get("set_aside") or ())})


def within_budget(recorded: int, max_preemptions: int) -> bool:
    """Whether one more preemption, after ``recorded`` ones in this run, is still resumed."""
    return recorded + 1 <= max_preemptions


def seconds_lost(since: datetime | None, resumed_at: datetime) -> float:
    """Training time a preemption threw away: what ran after ``since`` (the last complete checkpoint) is redone."""
    return round(max((resumed_at - since).total_seconds(), 0.0), 1) if since else 0.0


def resume_message(record: PreemptionRecord, max_preemptions: int) -> str:
    return (
        f"preempted ({record.reason}) at step {record.preempted_at_step}: resuming from step {record.resumed_from} "
        f"(preemption {record.number} of {max_preemptions})"
    )


def budget_spent_message(record: PreemptionRecord, max_preemptions: int, newest_complete: int) -> str:
    return (
        f"preempted ({record.reason}) at step {record.preempted_at_step}: preemption {record.number} is beyond "
        f"max_preemptions {max_preemptions}, so the training is not resumed. Its checkpoints are kept (newest "
        f"complete step: {newest_complete}); clearing train_rl resumes from there, with no preemption left in "
        "this run's budget. If preemptions are frequent, use capacity_type on_demand or reservation, or trigger "
        "a run with a larger max_preemptions."
    )


def accounting(records: Sequence[PreemptionRecord], max_preemptions: int) -> dict:
    """The run's preemptions as its summary reads them: how many, the time lost and the steps recomputed."""
    return {
        "count": len(records),
        "max_preemptions": max_preemptions,
        "seconds_lost": round(sum(r.seconds_lost for r in records), 1),
        "steps_recomputed": sum(r.steps_recomputed for r in records),
        "events": [r.to_json() for r in records],
    }


def describe_accounting(accounting: dict | None) -> str:
    """The summary's line: preemptions survived, time lost to them and steps recomputed."""
    if not accounting or not accounting.get("count"):
        return "none"
    minutes = accounting["seconds_lost"] / 60
    return (
        f"{accounting['count']} of at most {accounting['max_preemptions']}, {minutes:.0f} min lost, "
        f"{accounting['steps_recomputed']} step(s) recomputed"
    )
