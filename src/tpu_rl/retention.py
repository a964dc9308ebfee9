"""Which of a run's training checkpoints go once its export is published: the pure decision.

A saved step of Qwen3-30B-A3B is about 183 GB (61 GB of weights, 122 GB of optimizer state: maxtext.md, stage b),
and nothing else ever removes a run's steps: a daily program keeps about 5.5 TB more each month. ``keep_checkpoints``
says what stays; :func:`plan_retention` decides, from the steps listed under the run's ``checkpoints/actor/``, the
folders set aside before a resume, the step exported and whether the published export was verified, and returns
typed changes that ``prune_checkpoints`` (``operators/retention.py``) applies through the run's bucket.

The rules: nothing is removed unless the published export is verified; only the run's own step folders are
candidates (the operator lists nothing else); a step newer than the one exported is never removed (something
trained after the export's step was resolved); ``exported`` keeps the step exported, the state a resume of the run
would start from; ``none`` removes it too, once its weights are in the verified export (a cleared ``train_rl``
then trains the run again from the base checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tpu_rl.checkpoints import CHECKPOINT_METADATA, COMMIT_SUCCESS, SET_ASIDE_FOLDER

#: The choices of ``keep_checkpoints``.
KEEP_ALL = "all"
KEEP_EXPORTED = "exported"
KEEP_NONE = "none"
KEEP_CHOICES = (KEEP_ALL, KEEP_EXPORTED, KEEP_NONE)


@dataclass(frozen=True)
class Removal:
    """A folder to remove, relative to the run's ``checkpoints/`` (``actor/40/``, ``_set_aside/50-...``), and why."""

    folder: str
    why: str


@dataclass(frozen=True)
class Kept:
    """A folder that stays, and why."""

    folder: str
    why: str


@dataclass(frozen=True)
class RetentionPlan:
    """What the run's checkpoints become: the folders removed and the folders kept, each with its reason."""

    remove: tuple[Removal, ...] = ()
    keep: tuple[Kept, ...] = ()


def actor_folder(step: int) -> str:
    return f"actor/{step}/"


def checkpoint_folders(names: Iterable[str]) -> tuple[list[int], list[str]]:
    """The step numbers under ``actor/`` and the folders under ``_set_aside/``, from the names of the objects under
    a run's ``checkpoints/``. Anything else (an Orbax temporary folder, a file) is not a candidate."""
    steps, aside = set(), set()
    for name in names:
        parts = name.split("/")
        if len(parts) < 3:  # a folder's objects only: <folder>/<step or name>/<object...>
            continue
        if parts[0] == "actor" and parts[1].isdigit():
            steps.add(int(parts[1]))
        elif parts[0] == SET_ASIDE_FOLDER and parts[1]:
            aside.add(f"{parts[1]}/")
    return sorted(steps), sorted(aside)


def plan_retention(
    keep: str,
    *,
    exported_step: int | None,
    export_verified: bool,
    steps: Iterable[int],
    set_aside: Iterable[str] = (),
) -> RetentionPlan:
    """The run's checkpoint folders to remove and to keep.

    :param keep: the run's ``keep_checkpoints`` (:data:`KEEP_CHOICES`).
    :param exported_step: the step the export was made from (``verify_training``'s), None when unknown.
    :param export_verified: the published export was found whole (config, tokenizer, shards) just now.
    :param steps: the step numbers of the folders under ``checkpoints/actor/``.
    :param set_aside: the folders under ``checkpoints/_set_aside/`` (names ending in ``/``).
    """
    if keep not in KEEP_CHOICES:
        raise ValueError(f"keep_checkpoints {keep!r} is not one of {KEEP_CHOICES}")
    steps = sorted(set(steps))
    aside = [f"{SET_ASIDE_FOLDER}/{name}" for name in sorted(set(set_aside))]
    held = _held_back(keep, exported_step, export_verified)
    if held is not None or exported_step is None:
        return RetentionPlan(keep=tuple(Kept(folder, held or "") for folder in [*map(actor_folder, steps), *aside]))
    decisions = [_decide_step(keep, step, exported_step) for step in steps]
    decisions += [Removal(folder, "set aside before a resume; the run trained past it") for folder in aside]
    return RetentionPlan(
        remove=tuple(d for d in decisions if isinstance(d, Removal)),
        keep=tuple(d for d in decisions if isinstance(d, Kept)),
    )


def _held_back(keep: str, exported_step: int | None, export_verified: bool) -> str | None:
    """Why nothing at all is removed, or None."""
    if keep == KEEP_ALL:
        return "keep_checkpoints is 'all'"
    if exported_step is None:
        return "the step exported is not known"
    if not export_verified:
        return "the published export is not verified"
    return None


def _decide_step(keep: str, step: int, exported_step: int) -> Removal | Kept:
    folder = actor_folder(step)
    if step > exported_step:
        return Kept(folder, f"newer than the step exported ({exported_step}): not superseded by the export")
    if step < exported_step:
        return Removal(folder, f"an earlier save, superseded by the step exported ({exported_step})")
    if keep == KEEP_EXPORTED:
        return Kept(folder, "the step exported (keep_checkpoints 'exported')")
    return Removal(folder, "the step exported: its weights are in the verified export (keep_checkpoints 'none')")


def removal_order(folder: str, names: Iterable[str]) -> list[str]:
    """The objects of one folder in the order they are removed: its ``commit_success.txt``, then its
    ``_CHECKPOINT_METADATA``, then the rest, so that a removal cut short leaves a step Orbax skips as unfinished (and a
    resume sets aside), never a committed step with arrays missing."""
    first = [n for n in (COMMIT_SUCCESS, CHECKPOINT_METADATA) if n in set(names)]
    return [folder + n for n in [*first, *sorted(set(names) - set(first))]]
