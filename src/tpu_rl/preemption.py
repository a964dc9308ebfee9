"""The preemption budget of a run, and what its preemptions cost.

``train_rl`` resumes a preempted training (``jobset_status.preemption`` says which failures count) from its
newest complete checkpoint, up to ``max_preemptions`` times per run: a budget apart from Airflow's retries,
which stay for the workload's own failures. Each preemption is kept in the run's training record, so a retried
or cleared ``train_rl`` counts the earlier ones. Pure: the operator reads the bucket and the clock, asks
:func:`decide` what a preemption means, and applies the answer (moves, record, resubmission).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime

from tpu_rl import checkpoints


@dataclass(frozen=True)
class PreemptionRecord:
    """One preemption of the run.

    :param preempted_at_step: the last step the trainer reached (its TensorBoard log, or its newest step folder).
    :param resumed_from: the step the trainer restores (0: the base checkpoint); None when the budget was spent
        and the training was not resumed.
    :param seconds_lost: from the newest complete checkpoint's commit (else the attempt's start) to the resume.
    :param set_aside: where the half-written or broken step folders went (``gs://`` URIs).
    :param candidate: the capacity candidate (its index) the preempted slices came from; None with one candidate
        (and in records written before candidates existed), left out of the JSON then.
    """

    number: int
    reason: str
    preempted_at: str
    preempted_at_step: int
    resumed_from: int | None
    seconds_lost: float
    set_aside: tuple[str, ...] = ()
    candidate: int | None = None

    @property
    def steps_recomputed(self) -> int:
        if self.resumed_from is None:
            return 0
        return max(self.preempted_at_step - self.resumed_from, 0)

    def to_json(self) -> dict:
        fields = {k: v for k, v in asdict(self).items() if k != "candidate" or v is not None}
        return {**fields, "set_aside": list(self.set_aside), "steps_recomputed": self.steps_recomputed}

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


@dataclass(frozen=True)
class TrainingComplete:
    """The preempted training had made its final save (``step``): it is complete, not resubmitted."""

    step: int


@dataclass(frozen=True)
class ResumeTraining:
    """Set the step folders ``moves`` aside (step, why, the set-aside folder's name), keep ``record``, and
    resubmit: the trainer restores ``record.resumed_from``. ``doubted``: committed steps whose leaves fail the
    check, restored all the same (``checkpoints.ResumePlan.committed_warnings``)."""

    record: PreemptionRecord
    moves: tuple[tuple[int, str, str], ...]
    doubted: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class BudgetSpent:
    """As :class:`ResumeTraining`, but the run's budget is spent: keep ``record`` and fail the task, the
    newest complete step (``newest_complete``) kept for a clear to resume from."""

    record: PreemptionRecord
    moves: tuple[tuple[int, str, str], ...]
    newest_complete: int
    doubted: tuple[tuple[int, str], ...] = ()


def decide(
    *,
    steps: Iterable[tuple[int, checkpoints.Verdict]],
    committed_at: datetime | None,
    last_step: int,
    attempt_started: datetime | None,
    trainer_completed: bool,
    recorded: int,
    cause: Mapping[str, str],
    now: datetime,
    train_steps: int,
    checkpoint_period: int,
    max_preemptions: int,
    set_aside_root: str,
    candidate: int | None = None,
) -> TrainingComplete | ResumeTraining | BudgetSpent:
    """What a preemption of the training means, from what it left in the bucket and the run's records.

    :param steps: the step folders' verdicts, newest first, down to the newest complete one; ``committed_at`` when
        that one was committed; ``last_step`` the step the trainer had reached.
    :param attempt_started: when the preempted attempt's JobSet was created (time before it is not lost).
    :param trainer_completed: the trainer printed its success line (an early end on a save boundary).
    :param recorded: the preemptions the run's record holds already; ``cause`` the preemption's ``reason`` and
        ``pod``.
    :param set_aside_root: the ``gs://`` prefix the set-aside folders go under.
    :param candidate: the capacity candidate the preempted slices came from (None: the run has one), recorded.
    """
    plan = checkpoints.plan_resume(steps)
    final = checkpoints.check_final_step(
        plan.resume_from, train_steps, checkpoint_period, trainer_completed=trainer_completed
    )
    if final.complete:
        return TrainingComplete(plan.resume_from)
    moves = tuple((step, why, checkpoints.set_aside_folder(step, now)) for step, why in plan.set_aside)
    since = max(filter(None, [committed_at, attempt_started]), default=None)
    resumed = within_budget(recorded, max_preemptions)
    record = PreemptionRecord(
        number=recorded + 1,
        reason=f"{cause['reason']}; pod {cause['pod']}",
        preempted_at=now.isoformat(timespec="seconds"),
        preempted_at_step=max(last_step, plan.resume_from),
        resumed_from=plan.resume_from if resumed else None,
        seconds_lost=seconds_lost(since, now),
        set_aside=tuple(set_aside_root + folder for _, _, folder in moves),
        candidate=candidate,
    )
    if resumed:
        return ResumeTraining(record, moves, plan.committed_warnings)
    return BudgetSpent(record, moves, plan.resume_from, plan.committed_warnings)
