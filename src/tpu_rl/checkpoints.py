"""When a stage's output in Cloud Storage is complete: the rules, as pure functions over listings.

The rules follow what Orbax, ``train_rl`` and ``to_huggingface`` write (docs: maxtext.md). They read
nothing themselves: the triggers list objects and fetch the few small documents the rules need, so
every rule can be tested on plain data. Each check returns a :class:`Verdict` that names what is
missing, because "incomplete" alone tells the on-call engineer nothing.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

COMMIT_SUCCESS = "commit_success.txt"
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
ITEM_METADATA = "_METADATA"
OCDBT_MANIFEST = "manifest.ocdbt"

HF_INDEX = "model.safetensors.index.json"
HF_SINGLE_SHARD = "model.safetensors"
HF_REQUIRED_FILES = ("config.json", "tokenizer_config.json", "tokenizer.json")
_SHARD_NAME = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")

#: Orbax value types stored without an array folder of their own (empty containers, strings).
_NO_ARRAY_VALUE_TYPES = {"None", "Dict", "List", "Tuple", "NamedTuple", "string"}
#: safetensors headers are a few MB at most; anything larger means the bytes are not a header.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
_MAX_PROBLEMS_SHOWN = 10
#: What :func:`_load_json` returns for bytes that are not JSON.
_NOT_JSON = object()


@dataclass(frozen=True)
class StoredObject:
    """One listed object, its name relative to the prefix being checked, and its generation (0: not listed)."""

    name: str
    size: int
    updated: datetime
    #: Cloud Storage's number for this version of the object's bytes: each write, an append by rewriting the whole
    #: object included, makes a new one (https://cloud.google.com/storage/docs/metadata#generation-number).
    generation: int = 0


@dataclass(frozen=True)
class Verdict:
    """The outcome of a check: complete when nothing is missing."""

    problems: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        shown = list(self.problems[:_MAX_PROBLEMS_SHOWN])
        if len(self.problems) > _MAX_PROBLEMS_SHOWN:
            shown.append(f"and {len(self.problems) - _MAX_PROBLEMS_SHOWN} more problems")
        return "; ".join(shown) if shown else "complete"


def _load_json(data: bytes | None) -> object:
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return _NOT_JSON


# --- Orbax step folders ------------------------------------------------------------------------


def orbax_documents(items: Sequence[str]) -> list[str]:
    """The small JSON documents (relative to the step folder) that :func:`check_orbax_step` reads."""
    return [CHECKPOINT_METADATA, *(f"{item}/{ITEM_METADATA}" for item in items)]


def orbax_leaf_folders(item_metadata: Mapping) -> list[str]:
    """Folder names of the array leaves an item's ``_METADATA`` lists: ``'.'.join(keypath)``."""
    folders = []
    for keypath, entry in item_metadata.get("tree_metadata", {}).items():
        value = entry.get("value_metadata") or {}
        if value.get("skip_deserialize") or value.get("value_type") in _NO_ARRAY_VALUE_TYPES:
            continue
        keys = entry.get("key_metadata")
        if keys:
            folders.append(".".join(str(k["key"]) for k in keys))
        else:  # Older writers only give the keypath string, e.g. "('params', 'kernel')".
            folders.append(".".join(re.findall(r"'([^']*)'", keypath)))
    return folders


def check_orbax_step(
    step_label: str,
    names: Iterable[str],
    documents: Mapping[str, bytes | None],
    items: Sequence[str],
) -> Verdict:
    """Whether an Orbax step folder holds a finished save.

    :param step_label: how to name the folder in messages, e.g. ``"0/"``.
    :param names: every object name under the step folder, relative to it.
    :param documents: the contents of :func:`orbax_documents` that exist (missing ones map to None).
    :param items: item folders the step must hold, e.g. ``["items"]``.
    """
    names = set(names)
    problems = []
    if COMMIT_SUCCESS not in names:
        problems.append(f"no {COMMIT_SUCCESS} in {step_label}")
    metadata = _load_json(documents.get(CHECKPOINT_METADATA))
    if metadata is None:
        problems.append(f"no {CHECKPOINT_METADATA} in {step_label}")
    elif not isinstance(metadata, dict):
        problems.append(f"{step_label}{CHECKPOINT_METADATA} is not a JSON object")
    elif metadata.get("commit_timestamp_nsecs") is None:
        problems.append(f"{step_label}{CHECKPOINT_METADATA} has no commit_timestamp_nsecs")
    for item in items:
        item_label = f"{step_label}{item}/"
        item_metadata = _load_json(documents.get(f"{item}/{ITEM_METADATA}"))
        if item_metadata is None:
            problems.append(f"no {ITEM_METADATA} in {item_label}")
        elif not isinstance(item_metadata, dict) or "tree_metadata" not in item_metadata:
            problems.append(f"{item_label}{ITEM_METADATA} has no tree_metadata")
        elif item_metadata.get("use_ocdbt"):
            if f"{item}/{OCDBT_MANIFEST}" not in names:
                problems.append(f"no {OCDBT_MANIFEST} in {item_label}")
        else:
            marker = "zarr.json" if item_metadata.get("use_zarr3") else ".zarray"
            problems.extend(
                f"leaf {item_label}{leaf}/ has no {marker}"
                for leaf in orbax_leaf_folders(item_metadata)
                if f"{item}/{leaf}/{marker}" not in names
            )
    return Verdict(tuple(problems))


# --- RL training: which step ends the run ------------------------------------------------------


def step_numbers(folder_names: Iterable[str]) -> list[int]:
    """Step numbers among the folder names under ``checkpoints/actor/``, highest first."""
    return sorted((int(n.strip("/")) for n in folder_names if n.strip("/").isdigit()), reverse=True)


#: What ``train_rl`` prints after its last save on a normal exit (MaxText 0.2.4).
TRAINER_SUCCESS_LINE = "RL Training Completed Successfully!"


def check_final_step(
    step: int | None,
    train_steps: int,
    checkpoint_period: int,
    uncommitted: Sequence[int] = (),
    trainer_completed: bool = False,
) -> Verdict:
    """Whether the highest committed step is the end-of-run save, not a periodic one.

    ``train_rl`` saves when ``step % checkpoint_period == 0`` and force-saves the last step on a normal
    exit, which may come before ``train_steps`` when prompts were dropped (maxtext.md, stage b).

    :param uncommitted: higher step folders without ``commit_success.txt`` (an interrupted save).
    :param trainer_completed: the trainer reported a normal exit (its success line), so its last save
        is the end-of-run one even when an early end falls on a multiple of ``checkpoint_period``.
    """
    if step == train_steps or (step is not None and step < train_steps and step % checkpoint_period):
        return Verdict()
    if trainer_completed and step is not None and step < train_steps and not uncommitted:
        return Verdict()
    problems = [f"no {COMMIT_SUCCESS} in actor/{n}/" for n in uncommitted]
    if step is None:
        problems.append("no committed step under checkpoints/actor/")
    elif step > train_steps:
        problems.append(
            f"highest committed step {step} is beyond the planned {train_steps} steps "
            "(was this run trained with other parameters?)"
        )
    else:
        problems.append(
            f"highest committed step {step} of {train_steps} is a periodic save "
            f"(checkpoint_period {checkpoint_period}), not the end of the run"
        )
    return Verdict(tuple(problems))


# --- Hugging Face export -----------------------------------------------------------------------


def expected_shards(names: Iterable[str], index: bytes | None) -> tuple[list[str], Verdict]:
    """The shard names an export must hold, from its index (or the single-shard layout)."""
    names = set(names)
    if index is None:
        if HF_SINGLE_SHARD in names:
            return [HF_SINGLE_SHARD], Verdict()
        shards = sorted(n for n in names if _SHARD_NAME.fullmatch(n))
        if shards:
            return [], Verdict((f"no {HF_INDEX} ({len(shards)} shards present; the index is written last)",))
        return [], Verdict((f"no {HF_INDEX} and no {HF_SINGLE_SHARD}",))
    document = _load_json(index)
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        return [], Verdict((f"{HF_INDEX} has no weight_map",))
    named = set(weight_map.values())
    matches = [_SHARD_NAME.fullmatch(n) for n in named]
    if not all(matches):
        odd = sorted(n for n, m in zip(named, matches, strict=True) if not m)
        return [], Verdict((f"{HF_INDEX} names shards outside the model-0000i-of-0000N pattern: {odd}",))
    totals = {int(m.group(2)) for m in matches}
    if len(totals) != 1:
        return [], Verdict((f"{HF_INDEX} mixes shard counts {sorted(totals)}",))
    total = totals.pop()
    shards = [f"model-{i:05d}-of-{total:05d}.safetensors" for i in range(1, total + 1)]
    problems = [f"{HF_INDEX} maps no tensor to {n}" for n in shards if n not in named]
    problems += [f"shard {i} of {total} missing ({n})" for i, n in enumerate(shards, 1) if n not in names]
    return shards, Verdict(tuple(problems))


def safetensors_header_length(first_bytes: bytes) -> int:
    """The header length a safetensors file declares in its first 8 bytes (little-endian u64)."""
    return struct.unpack("<Q", first_bytes[:8])[0]


def check_shard(name: str, size: int, header_length: int, header: bytes | None) -> str | None:
    """A problem with one shard, or None when its header accounts for exactly its object size."""
    if header_length > MAX_SAFETENSORS_HEADER or 8 + header_length > size:
        return f"{name}: declared header length {header_length} does not fit its {size} bytes"
    document = _load_json(header)
    if not isinstance(document, dict):
        return f"{name}: header is not a JSON object"
    try:
        ends = [t["data_offsets"][1] for k, t in document.items() if k != "__metadata__"]
    except (KeyError, IndexError, TypeError):
        return f"{name}: header has a tensor without data_offsets"
    expected = 8 + header_length + max(ends, default=0)
    if expected != size:
        return f"{name}: header accounts for {expected} bytes but the object has {size} (truncated or mixed?)"
    return None


def check_hf_export(
    listing: Mapping[str, StoredObject],
    shards: Sequence[str],
    found_problems: Iterable[str],
    not_before: datetime | None,
    also_required: Sequence[str] = (),
) -> Verdict:
    """Whether an export holds its config, tokenizer and shards, all written by this attempt.

    :param listing: the objects under the export prefix, keyed by relative name.
    :param shards: from :func:`expected_shards`.
    :param found_problems: the index's and the shards' problems (:func:`expected_shards`, :func:`check_shard`).
    :param not_before: when the export stage started; older objects are left from an earlier attempt.
    :param also_required: files the export must hold besides :data:`HF_REQUIRED_FILES` (the model's
        ``generation_config.json``, when its repository has one).
    """
    required = [*HF_REQUIRED_FILES, *also_required]
    problems = [f"no {name}" for name in required if name not in listing]
    problems += found_problems
    if not_before is not None:
        problems += [
            f"{n} was written at {listing[n].updated.isoformat()}, before this export started at "
            f"{not_before.isoformat()} (stale from an earlier attempt)"
            for n in dict.fromkeys([*required, HF_INDEX, *shards])
            if n in listing and listing[n].updated < not_before
        ]
    return Verdict(tuple(problems))


# --- Training record ---------------------------------------------------------------------------


#: Parameters a later version added to the record: a record written before lacks them, and its run resumes as it
#: did then (what it trained on under them is not known).
ADDED_TO_THE_RECORD = ("training_data",)


def training_record_changes(recorded: Mapping, current: Mapping) -> list[str]:
    """The parameters that differ between a run's record and a resume, as ``"name: old -> new"``.

    Records written before the parameters were typed hold numbers as the strings Jinja rendered
    (``"50"``): such a string equals the number it spells, so those runs still resume.
    """
    return [
        f"{key}: {recorded.get(key)!r} -> {current.get(key)!r}"
        for key in sorted(set(recorded) | set(current))
        if not _same_recorded_value(recorded.get(key), current.get(key))
        and not (key in ADDED_TO_THE_RECORD and key not in recorded)
    ]


def _same_recorded_value(recorded: object, current: object) -> bool:
    if recorded == current:
        return True
    return isinstance(recorded, str) and not isinstance(current, (str, type(None))) and recorded == str(current)


# --- Resuming after a preemption ---------------------------------------------------------------------------

#: Sibling of ``checkpoints/actor/`` that keeps the step folders set aside before a resume: outside the
#: checkpoint manager's directory, and not a step name Orbax lists (a digit, or a name ending in ``_<digit>``).
SET_ASIDE_FOLDER = "_set_aside"


@dataclass(frozen=True)
class ResumePlan:
    """Where a resumed trainer starts, and the step folders above it that must not stay in its way.

    :param resume_from: the newest committed step (0 when none: the trainer starts again from the base checkpoint).
    :param set_aside: (step, why) for each newer folder that is not committed.
    :param committed_warnings: (step, why) when the step resumed from is committed but fails the leaf check.
    """

    resume_from: int
    set_aside: tuple[tuple[int, str], ...] = ()
    committed_warnings: tuple[tuple[int, str], ...] = ()


def is_committed(verdict: Verdict) -> bool:
    """Whether an Orbax step folder's verdict found its ``commit_success.txt`` (whatever else it found)."""
    return not any(problem.startswith(f"no {COMMIT_SUCCESS} ") for problem in verdict.problems)


def as_restored(verdict: Verdict) -> tuple[Verdict, str | None]:
    """A step folder as the final-step check takes it: a committed one whose only problems are its leaves' is
    complete, those problems a warning (the leaf layout of the Pathways persistence path is not publicly documented;
    :func:`plan_resume` resumes from such a step alike); anything else keeps its problems (an item without its
    metadata, no commit)."""
    leaves_only = all(problem.startswith("leaf ") for problem in verdict.problems)
    if verdict.complete or not is_committed(verdict) or not leaves_only:
        return verdict, None
    return Verdict(), verdict.describe()


def plan_resume(newest_first: Iterable[tuple[int, Verdict]]) -> ResumePlan:
    """The resume point, from the verdicts of the step folders under ``checkpoints/actor/``, newest first.

    Orbax (orbax-checkpoint 0.12.8 ``path/step.py``: ``_StandardNameFormat._build_metadata`` skips a step that
    ``is_path_finalized`` rejects; on ``gs://`` that is a folder without ``commit_success.txt``, which
    ``CommitFileTemporaryPath.finalize`` writes last) restores the newest committed step, and its next save of an
    uncommitted step deletes the folder first: only those are set aside (kept for inspection; the final-step
    check would otherwise meet them). A committed step whose leaves fail :func:`check_orbax_step` is still what
    Orbax restores: the leaf layout the Pathways persistence path writes is not publicly documented, so such a
    failure is a warning, never a reason to throw away a committed step (and its hours of training). Older
    folders are not looked at.
    """
    set_aside = []
    for step, verdict in newest_first:
        if verdict.complete or is_committed(verdict):
            warnings = () if verdict.complete else ((step, verdict.describe()),)
            return ResumePlan(step, tuple(set_aside), warnings)
        set_aside.append((step, verdict.describe()))
    return ResumePlan(0, tuple(set_aside))


def set_aside_folder(step: int, when: datetime) -> str:
    """The folder name a set-aside step gets under ``SET_ASIDE_FOLDER``: its step and when (UTC) it was moved."""
    return f"{step}-{when:%Y%m%dT%H%M%SZ}/"
