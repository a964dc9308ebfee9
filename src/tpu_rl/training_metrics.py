"""What a training run shows of itself: its curves, its evaluation before and after, its progress and its
TPU cost, read from what MaxText 0.2.4 writes (docs/reference/training-metrics.md has the tags, the log lines and
their sources).

Pure: the caller downloads the event files (under ``GcsLayout.tensorboard_prefix``) and reads the
trainer's log; this module only reads the local files or bytes it is given, with the package's own reader
of the event files (``tpu_rl.event_files``: no TensorBoard).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpu_rl import event_files
from tpu_rl.checkpoints import TRAINER_SUCCESS_LINE

if TYPE_CHECKING:
    from tpu_rl.config import RunConfig

#: The reward GRPO maximises: per completion, the sum over MaxText's reward functions; the batch's mean.
REWARD_TAG = "rewards/train/sum"
#: The policy's loss, logged once per update at steps 1..train_steps: its last step is the run's progress.
LOSS_TAG = "actor/train/loss"
#: KL divergence of the policy from the reference model.
KL_TAG = "actor/train/kl"
#: Event files are named ``events.out.tfevents.<start time>.<host>``: sorted names are in writing order.
EVENT_FILE_MARK = "events.out.tfevents."

#: Not a tag: the wall time (POSIX seconds) at which the trainer logged each step's loss (:data:`LOSS_TAG`), as
#: (step, wall time). It rides with the curves so that it goes wherever they go (the merge of attempts, the
#: incremental reader, the Training tab); the ETA's pace comes from it. No curve shows it.
STEP_TIMES = "tpu_rl/step_wall_time"

#: Scalars per tag: (step, value), by step; and :data:`STEP_TIMES`.
Scalars = dict[str, list[tuple[int, float]]]


def is_event_file(name: str) -> bool:
    """Whether an object or file name is a TensorBoard event file (the folder may hold others)."""
    return name.rsplit("/", 1)[-1].startswith(EVENT_FILE_MARK)


def read_scalars(files: Iterable[str | Path | bytes]) -> Scalars:
    """The scalar curves in event files (paths, or their bytes), per tag, sorted by step.

    Files count in the order given: pass them sorted by name. A resumed run writes a new file per attempt
    and logs again the steps its crashed predecessor logged after its last checkpoint; the later value
    wins, as in TensorBoard. A file cut short while its writer flushes yields the records before the cut.
    The loss's records also give :data:`STEP_TIMES`.
    """
    curves: dict[str, dict[int, float]] = {}
    for source in files:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        _add_scalars(curves, event_files.scalars(data))
    return _sorted_curves(curves)


def _add_scalars(curves: dict[str, dict[int, float]], scalars: Iterable[event_files.Scalar]) -> None:
    """Adds scalars in the order written: a step logged again takes the later value."""
    for scalar in scalars:
        curves.setdefault(scalar.tag, {})[scalar.step] = scalar.value
        if scalar.tag == LOSS_TAG:
            curves.setdefault(STEP_TIMES, {})[scalar.step] = scalar.wall_time


def _sorted_curves(curves: Mapping[str, Mapping[int, float]]) -> Scalars:
    return {tag: sorted(points.items()) for tag, points in sorted(curves.items())}


class GrowingEventFile:
    """One event file's curves, read as its writer appends to it: fed the bytes added since the last piece, it
    parses only those (:class:`tpu_rl.event_files.EventStream`) and adds their scalars to the curves kept, so a
    long run's file costs per read only what was added. :meth:`scalars` are :func:`read_scalars` of the bytes fed
    so far, whatever pieces they came in.

    Only the sorted curves are kept (no file bytes, no second copy by step). A curve is replaced, never changed in
    place: curves handed out stay as they were while a later piece is fed."""

    def __init__(self) -> None:
        self.stream = event_files.EventStream()
        self._curves: Scalars = {}

    @property
    def size(self) -> int:
        """How many of the file's bytes were read."""
        return self.stream.size

    def feed(self, piece: bytes) -> None:
        """The bytes that follow those fed before."""
        added: dict[str, dict[int, float]] = {}
        _add_scalars(added, self.stream.feed(piece))
        for tag, points in added.items():
            kept, new = self._curves.get(tag, []), sorted(points.items())
            if kept and new[0][0] <= kept[-1][0]:  # a step logged again, or before the last: the later value wins
                self._curves[tag] = sorted({**dict(kept), **points}.items())
            else:
                self._curves[tag] = kept + new

    def points(self) -> int:
        """How many (step, value) points are kept: what the file costs in memory."""
        return sum(len(points) for points in self._curves.values())

    def scalars(self) -> Scalars:
        """The curves so far, per tag, sorted by step."""
        return {tag: self._curves[tag] for tag in sorted(self._curves)}


def event_file_started(name: str) -> float | None:
    """When the writer of an event file started (POSIX seconds), from its name (tensorboardX puts the first
    ten characters of ``time.time()`` there); None for a name without one."""
    stamp = name.rsplit("/", 1)[-1][len(EVENT_FILE_MARK) :].split(".", 1)[0]
    return float(stamp) if stamp.isdigit() else None


def merge_scalars(files: Mapping[str, Scalars]) -> Scalars:
    """The curves of a run's event files (scalars by file name), as :func:`read_scalars` reads them: the
    files in name order, a step logged again by a later attempt taking the later value."""
    merged: dict[str, dict[int, float]] = {}
    for name in sorted(files):
        for tag, points in files[name].items():
            merged.setdefault(tag, {}).update(points)
    return {tag: sorted(points.items()) for tag, points in sorted(merged.items())}


def attempt_progress(
    files: Mapping[str, Scalars], train_steps: int, now: float, attempt_started: float | None = None
) -> str | None:
    """:func:`progress_line` from the scalars of each event file (by file name); None before any file.

    The newest file is the trainer's current attempt: its writer's start gives the elapsed time, the step
    before its first logged loss the step it resumed from, and its own step times the ETA's pace. A file
    whose writer started before ``attempt_started`` (POSIX seconds: when the current attempt was submitted)
    is an earlier attempt's: until the current one writes its first file (minutes of loading the model), the
    line gives the step reached and no ETA, which would be the earlier attempt's.
    """
    if not files:
        return None
    names = sorted(files)
    scalars = merge_scalars(files)
    if attempt_started is not None and (event_file_started(names[-1]) or 0) < attempt_started:
        losses = scalars.get(LOSS_TAG) or []
        step = losses[-1][0] if losses else 0
        return (
            f"step {step}/{train_steps} ({100 * step // train_steps}%) before this attempt, which has not "
            "logged a step yet (it loads the model)"
        )
    own = files[names[-1]]
    current, losses = own.get(LOSS_TAG), scalars.get(LOSS_TAG) or []
    resumed_from = current[0][0] - 1 if current else (losses[-1][0] if losses else 0)
    if current:  # the current attempt is where its own curve ends (an earlier one may have logged further)
        losses = [(step, value) for step, value in losses if step <= current[-1][0]]
    # The pace is this attempt's own: between an earlier attempt's steps and its own lies the restart.
    scalars = {**scalars, LOSS_TAG: losses, STEP_TIMES: own.get(STEP_TIMES) or []}
    started = event_file_started(names[-1])
    return progress_line(scalars, train_steps, now - started if started else 0.0, resumed_from)


def attempt_step(files: Mapping[str, Scalars], attempt_started: float | None = None) -> int | None:
    """The newest step the current attempt logged (its loss), or None before it logged one: the newest event file
    is the current attempt's unless its writer started before ``attempt_started`` (an earlier attempt's)."""
    if not files:
        return None
    newest = sorted(files)[-1]
    if attempt_started is not None and (event_file_started(newest) or 0) < attempt_started:
        return None
    losses = files[newest].get(LOSS_TAG) or []
    return int(losses[-1][0]) if losses else None


# --- evaluation before and after training ------------------------------------------------------------------

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf)"
#: train_rl.py:785-788 and 823-826 (MaxText 0.2.4), anywhere in a line (absl puts its prefix before it).
_EVALUATION_LINE = re.compile(
    rf"(?P<when>Pre|Post) RL Training: corr=(?P<correct>{_NUMBER}), total=(?P<total>\d+), "
    rf"accuracy=(?P<accuracy>{_NUMBER})%, partial_accuracy=(?P<partial_accuracy>{_NUMBER})%, "
    rf"format_accuracy=(?P<format_accuracy>{_NUMBER})%, mean_reward=(?P<mean_reward>{_NUMBER})"
)


@dataclass(frozen=True)
class Score:
    """One evaluation of the policy on the test prompts (percentages 0-100)."""

    correct: float
    total: int
    accuracy: float
    partial_accuracy: float
    format_accuracy: float
    mean_reward: float

    @property
    def empty(self) -> bool:
        """No prompt was scored (``total=0``: MaxText's length filter and ``drop_remainder`` left no whole batch):
        its percentages say nothing, and the gate treats it as no evaluation."""
        return self.total <= 0

    def describe(self) -> str:
        """Each percentage with the number of prompts behind it: on 20 prompts one prompt is 5 points."""
        if self.empty:
            return "no prompt scored (total=0)"
        return (
            f"accuracy {self.accuracy:.1f}% ({self.correct:g}/{self.total}), partial {self.partial_accuracy:.1f}% "
            f"({self._count(self.partial_accuracy)}/{self.total}), format {self.format_accuracy:.1f}% "
            f"({self._count(self.format_accuracy)}/{self.total}), mean reward {self.mean_reward:.4f}"
        )

    def _count(self, percentage: float) -> str:
        return f"{percentage * self.total / 100:.3g}"


@dataclass(frozen=True)
class Evaluation:
    """The trainer's evaluation before and after training; either is None when its line was not logged
    (a crash before the end leaves no ``after``)."""

    before: Score | None
    after: Score | None

    def to_dict(self) -> dict[str, Any]:
        """Plain values for XCom and the Asset event's extra."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Evaluation | None:
        if not data:
            return None
        return cls(*(Score(**data[k]) if data.get(k) else None for k in ("before", "after")))


#: Tunix's line when a trainer resumes from a checkpoint (tunix/sft/checkpoint_manager.py at the commit
#: MaxText 0.2.4 pins, c4ec573, line 293: ``'Restored params from step: %d in %.3f seconds'``).
_RESTORED_LINE = re.compile(r"Restored params from step: (?P<step>\d+)")


def kept_line_kind(line: str) -> str | None:
    """What the run reads of a trainer's log line after the training, whatever scrolled between: ``Pre`` or
    ``Post`` for its evaluation lines, ``Completed`` for its success line (MaxText 0.2.4 train_rl.py prints it
    before the evaluation after training, which may print a lot), ``Restored`` when the attempt resumed from a
    step (its ``Pre`` line then evaluates trained weights); else None (cheap for the lines that are not: a log
    follower asks this of every line)."""
    if TRAINER_SUCCESS_LINE in line:
        return "Completed"
    if "Restored params from step: " in line:
        match = _RESTORED_LINE.search(line)
        return "Restored" if match and int(match["step"]) > 0 else None
    if " RL Training: " not in line:
        return None
    match = _EVALUATION_LINE.search(line)
    return match["when"] if match else None


def trainer_completed(kept_lines: Iterable[str]) -> bool:
    """Whether the kept lines hold the trainer's success line (a normal exit)."""
    return any(kept_line_kind(line) == "Completed" for line in kept_lines)


def restored_a_step(kept_lines: Iterable[str]) -> bool:
    """Whether the attempt whose kept lines these are resumed from a checkpoint step (not the run's start)."""
    return any(kept_line_kind(line) == "Restored" for line in kept_lines)


def parse_evaluation(log_lines: Iterable[str]) -> Evaluation | None:
    """The last ``Pre RL Training`` and ``Post RL Training`` lines of a log; None when it has neither."""
    found: dict[str, Score] = {}
    for line in log_lines:
        match = _EVALUATION_LINE.search(line)
        if match:
            numbers = {k: float(v) for k, v in match.groupdict().items() if k not in ("when", "total")}
            found[match["when"]] = Score(total=int(match["total"]), **numbers)
    if not found:
        return None
    return Evaluation(before=found.get("Pre"), after=found.get("Post"))


def describe_evaluation(evaluation: Evaluation | None, config: RunConfig) -> str:
    """One line for the task log; a run configured without evaluation says so instead of showing numbers."""
    if config.evaluation_batches == 0:
        return "no evaluation: extra_train_args sets num_test_batches to 0"
    if evaluation is None:
        return f"no evaluation logged yet (num_test_batches={config.evaluation_batches})"
    before = evaluation.before.describe() if evaluation.before else "not logged"
    after = evaluation.after.describe() if evaluation.after else "not logged"
    return f"evaluation before training: {before}; after: {after}"


def quality_gate(evaluation: Evaluation | None, config: RunConfig) -> list[str]:
    """Why the trained model fails the run's quality gate (``min_post_accuracy``, ``require_no_regression``);
    empty when it passes or no gate is set. Each reason carries the figures before and after training."""
    if not config.has_quality_gate:
        return []
    before = evaluation.before if evaluation else None
    after = evaluation.after if evaluation else None
    figures = (
        f"(before training: {before.describe() if before else 'not logged'}; "
        f"after: {after.describe() if after else 'not logged'})"
    )
    if after is None:
        return [f"the trainer logged no 'Post RL Training' line, so the quality gate cannot be checked {figures}"]
    if after.empty:
        return [f"the evaluation after training scored no prompt, so the quality gate cannot be checked {figures}"]
    reasons = []
    if config.min_post_accuracy and after.accuracy < config.min_post_accuracy:
        reasons.append(
            f"accuracy after training {after.accuracy:.1f}% is below min_post_accuracy "
            f"{config.min_post_accuracy:g}% {figures}"
        )
    if config.require_no_regression:
        if before is None or before.empty:
            reasons.append(
                "require_no_regression: the trainer logged no 'Pre RL Training' line with a scored prompt to "
                f"compare with {figures}"
            )
        elif (change := accuracy_change(before, after))[1] < 0:
            reasons.append(
                f"accuracy fell from {before.accuracy:.1f}% ({before.correct:g}/{before.total}) to "
                f"{after.accuracy:.1f}% ({after.correct:g}/{after.total}), beyond chance: the 95% interval "
                f"of the change, {change[0]:+.1f} to {change[1]:+.1f} points (Newcombe's score interval "
                f"from the counts), lies below 0 (require_no_regression) {figures}"
            )
    return reasons


def regression_note(evaluation: Evaluation | None) -> str | None:
    """Why a lower accuracy after training did not fail ``require_no_regression``, for the gate's log."""
    before, after = (evaluation.before, evaluation.after) if evaluation else (None, None)
    if not (before and after) or before.empty or after.empty or after.accuracy >= before.accuracy:
        return None
    low, high = accuracy_change(before, after)
    return (
        f"accuracy fell from {before.accuracy:.1f}% ({before.correct:g}/{before.total}) to {after.accuracy:.1f}% "
        f"({after.correct:g}/{after.total}), within chance: the 95% interval of the change is {low:+.1f} to "
        f"{high:+.1f} points (with {before.total} prompts, one prompt moves accuracy by {100 / before.total:.1f}); "
        "more test prompts (num_test_batches) narrow it"
    )


def wilson_interval(correct: float, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (as fractions); (0, 1) without prompts."""
    if total <= 0:
        return 0.0, 1.0
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    spread = z / (1 + z * z / total) * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return max(0.0, centre - spread), min(1.0, centre + spread)


def gate_resolution(config: RunConfig) -> str | None:
    """What the run's quality gate can tell apart on the prompts its evaluation scores, for the log of the run's
    validation (None without a gate): a gate on a few prompts passes a regression or fails a good model by
    chance. With the tutorial's 20 prompts one prompt is 5 points, a model with a true 60% shows under 50% one
    time in eight, and only a fall of 35 points from 60% is beyond chance."""
    prompts = config.evaluation_prompts
    if not config.has_quality_gate or not prompts:
        return None
    parts = [f"the quality gate decides on at most {prompts} test prompts, one prompt {100 / prompts:.1f} points"]
    if config.require_no_regression:
        fall = _smallest_fall_beyond_chance(prompts)
        parts.append(
            "require_no_regression fails only on a fall beyond chance"
            + (f" (from 60%: {fall:.0f} points or more)" if fall is not None else " (none is, on so few)")
        )
    parts.append("more test prompts (num_test_batches, eval_batch_size in extra_train_args) make it finer")
    return "; ".join(parts)


def _smallest_fall_beyond_chance(prompts: int) -> float | None:
    """The smallest fall from 60% accuracy, in points, whose 95% interval lies below 0 (None: none does)."""
    start = round(0.6 * prompts)
    before = _counted(start, prompts)
    for after in range(start, -1, -1):
        if accuracy_change(before, _counted(after, prompts))[1] < 0:
            return 100 * (start - after) / prompts
    return None


def _counted(correct: int, total: int) -> Score:
    return Score(correct, total, 100 * correct / total, 0, 0, 0)


def accuracy_change(before: Score, after: Score) -> tuple[float, float]:
    """The 95% interval of accuracy after minus accuracy before, in percentage points: Newcombe's hybrid score
    interval for a difference of two proportions (Newcombe 1998, method 10), from the counts alone. The two
    evaluations score the same prompts, which a paired test would use; the log gives only the totals, and the
    unpaired interval is the wider, so a regression it finds is one."""
    p1, p2 = before.correct / before.total, after.correct / after.total
    l1, u1 = wilson_interval(before.correct, before.total)
    l2, u2 = wilson_interval(after.correct, after.total)
    difference = p2 - p1
    low = difference - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
    high = difference + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    return 100 * low, 100 * high


# --- progress ----------------------------------------------------------------------------------------------


def progress_line(
    scalars: Mapping[str, Sequence[tuple[int, float]]], train_steps: int, elapsed_seconds: float, resumed_from: int = 0
) -> str:
    """E.g. ``step 30/50 (60%), 1h12m elapsed, ETA 40m, reward 0.41 (+0.12 since start)``.

    The ETA is the steps left at the pace of this attempt's own steps (:func:`seconds_per_step`), not the time
    since it started: a 30B model's trainer loads the model, evaluates it and compiles for many minutes before
    its first step.

    :param elapsed_seconds: since this attempt of the trainer started (shown as is).
    :param resumed_from: the step this attempt began at (the checkpoint it restored).
    """
    losses = scalars.get(LOSS_TAG) or []
    step = losses[-1][0] if losses else resumed_from
    parts = [f"step {step}/{train_steps} ({100 * step // train_steps}%)", f"{_duration(elapsed_seconds)} elapsed"]
    if step < train_steps:
        pace = seconds_per_step(scalars.get(STEP_TIMES) or [], resumed_from, step)
        parts.append(
            "ETA after the second logged step" if pace is None else f"ETA {_duration(pace * (train_steps - step))}"
        )
    rewards = scalars.get(REWARD_TAG) or []
    if rewards:
        first, last = rewards[0][1], rewards[-1][1]
        parts.append(f"reward {last:.2f} ({last - first:+.2f} since start)")
    return ", ".join(parts)


def seconds_per_step(step_times: Sequence[tuple[int, float]], resumed_from: int, step: int) -> float | None:
    """The seconds per step between the first and the last step the attempt logged (of ``step_times``, those
    after ``resumed_from`` up to ``step``); None before its second: one step alone gives no pace, and the time
    before it is loading and compiling, not training."""
    own = [(logged, at) for logged, at in step_times if resumed_from < logged <= step]
    if len(own) < 2:
        return None
    (first, started), (last, ended) = own[0], own[-1]
    return (ended - started) / (last - first)


def _duration(seconds: float) -> str:
    """1h12m, 48m, 40s: minutes are enough for a run of hours."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"


# --- TPU cost ----------------------------------------------------------------------------------------------


def chip_hours(slices: Iterable[tuple[datetime, datetime]], chips_per_slice: int) -> float:
    """The TPU chip-hours billed for slices given as (nodes present from, nodes gone at): a slice costs from
    the moment its nodes exist, training or not. For a slice still there, pass the current time."""
    seconds = sum(max(0.0, (gone - present).total_seconds()) for present, gone in slices)
    return seconds / 3600 * chips_per_slice


def cost_line(hours: float, price_per_chip_hour: float) -> str:
    """E.g. ``133.3 chip-hours, about $359.91 at $2.70 per chip-hour``; a price of 0 shows the hours only."""
    if not price_per_chip_hour:
        return f"{hours:.1f} chip-hours (no price: tpu_price_per_chip_hour is 0)"
    return (
        f"{hours:.1f} chip-hours, about ${hours * price_per_chip_hour:,.2f} at ${price_per_chip_hour:.2f} per chip-hour"
    )


def _hours(slices: Sequence[Mapping[str, Any]], chips_per_slice: int) -> float:
    spans = [(datetime.fromisoformat(s["nodes_from"]), datetime.fromisoformat(s["nodes_gone"])) for s in slices]
    return chip_hours(spans, chips_per_slice)


def tpu_cost(slices: Sequence[Mapping[str, Any]], config: RunConfig) -> dict[str, Any]:
    """The TPU time of the slices a run created (``pool``, ``nodes_from``, ``nodes_gone`` as ISO times), as
    plain values for XCom and the Asset event's extra. With ``capacity_candidates``, slices that name their
    ``candidate`` are also counted per candidate at its own price (``by_candidate``), and the cost is their sum."""
    hours = _hours(slices, config.slice.chips)
    price = config.tpu_price_per_chip_hour
    cost = {
        "chip_hours": round(hours, 3),
        "cost_usd": round(hours * price, 2),
        "price_per_chip_hour": price,
        "slices": [dict(s) for s in slices],
    }
    if config.capacity_candidates and slices and all("candidate" in s for s in slices):
        by_candidate = cost_by_candidate(slices, config.candidates, config.slice.chips, price)
        cost.update(cost_usd=round(sum(c["cost_usd"] for c in by_candidate), 2), by_candidate=by_candidate)
    return cost


def cost_by_candidate(
    slices: Sequence[Mapping[str, Any]], candidates: Sequence[Any], chips_per_slice: int, default_price: float
) -> list[dict[str, Any]]:
    """The TPU time and cost on each capacity candidate (``tpu_rl.candidates.Candidate``) the slices came from (each
    slice names its ``candidate`` by index), in the candidates' order: a candidate's own price, else
    ``default_price`` (``tpu_price_per_chip_hour``). A candidate without a slice (left before its pools had
    nodes) is not listed: GKE bills a slice from the moment its nodes exist."""
    costs = []
    for index, candidate in enumerate(candidates):
        own = [s for s in slices if s["candidate"] == index]
        if not own:
            continue
        hours, price = _hours(own, chips_per_slice), candidate.price(default_price)
        costs.append(
            {
                "candidate": index,
                "describe": candidate.describe(),
                "chip_hours": round(hours, 3),
                "price_per_chip_hour": price,
                "cost_usd": round(hours * price, 2),
                "slices": len(own),
            }
        )
    return costs


def describe_costs(costs: Sequence[Mapping[str, Any]]) -> str:
    """Each candidate's chip-hours and cost at its price, and the total when there are several, e.g.
    ``candidate 1 (spot in us-east5-b): 12.0 chip-hours, about $13.20 at $1.10 per chip-hour``."""
    lines = [
        f"candidate {c['candidate']} ({c['describe']}): {cost_line(c['chip_hours'], c['price_per_chip_hour'])}"
        for c in costs
    ]
    if len(costs) > 1:
        hours, usd = sum(c["chip_hours"] for c in costs), sum(c["cost_usd"] for c in costs)
        lines.append(f"in all {hours:.1f} chip-hours, about ${usd:,.2f}")
    return "; ".join(lines)


def describe_cost(cost: Mapping[str, Any] | None, config: RunConfig) -> str:
    """The TPU cost line of a run; a slice the run did not create is not its to count."""
    if not config.tpu_pools_per_run:
        return (
            f"not counted: tpu_pool_mode is '{config.tpu_pool_mode}', the slice is not this run's (it is "
            "billed while it exists, whoever uses it)"
        )
    if cost is None:
        return "unknown: delete_tpu_pools recorded no slice times"
    if cost.get("by_candidate"):
        return f"{describe_costs(cost['by_candidate'])}, {len(cost['slices'])} slice(s)"
    return f"{cost_line(cost['chip_hours'], cost['price_per_chip_hour'])}, {len(cost['slices'])} slice(s)"


def run_summary(
    *,
    final_step: int | None,
    evaluation: Evaluation | None,
    cost: Mapping[str, Any] | None,
    model_uri: str | None,
    config: RunConfig,
    preemptions: str = "none",
    capacity: Sequence[str] = (),
) -> str:
    """The block the run's last task prints: where training ended, what it did to the model, what the TPUs
    cost and where the model is; with several capacity candidates, which were tried and why each was left."""
    if config.evaluation_batches and evaluation is not None:
        figures = [
            f"before {evaluation.before.describe() if evaluation.before else 'not logged'}",
            f"after  {evaluation.after.describe() if evaluation.after else 'not logged'}",
        ]
    else:
        figures = [describe_evaluation(evaluation, config)]
    lines = [
        f"final step   {final_step if final_step is not None else 'unknown'}/{config.train_steps}",
        f"evaluation   {figures[0]}",
        *(f"             {line}" for line in figures[1:]),
        f"TPU          {describe_cost(cost, config)}",
        f"preemptions  {preemptions}",
        *(f"{'capacity' if i == 0 else '':<12} {line}" for i, line in enumerate(capacity)),
        f"model        {model_uri or 'not published'}",
    ]
    return "\n".join(["Run summary", *(f"  {line}" for line in lines)])
