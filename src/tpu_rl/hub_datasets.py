"""What a Hugging Face split instruction gives the trainer, known before a slice is created.

MaxText 0.2.4's train_rl loads its training data with ``datasets.load_dataset(name, name=hf_subset,
split=train_split)`` (``train_rl.get_dataset``) once the model is on the slice. ``datasets`` clamps a slice to
the split (``train[7400:7600]`` of GSM8K's 7,473 rows gives 73: the run trains 18 of its 50 steps) and raises on
a slice wholly past it (``Instruction "..." corresponds to no data!``). Knowing the split's rows, validation
refuses both before anything is created. Pure: no Hub call, no Airflow.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

#: Rows of every split of the Hub datasets the package knows, by (dataset, config), from their dataset cards'
#: ``dataset_info``: openai/gsm8k, MaxText's default (configs main and socratic: train 7,473, test 1,319). A
#: dataset is listed with all its splits or not at all: a split missing here would be refused, though real.
SPLIT_ROWS: dict[tuple[str, str], dict[str, int]] = {
    ("openai/gsm8k", "main"): {"train": 7473, "test": 1319},
    ("openai/gsm8k", "socratic"): {"train": 7473, "test": 1319},
}

#: The datasets train_rl splits itself when they are also the evaluation set: it holds 5% of the training
#: split out for the evaluation (MaxText 0.2.4 train_rl.prepare_datasets -> prepare_train_and_eval_dataset,
#: ``train_test_split(test_size=0.05)``, which rounds the test part up: datasets ``train_test_split``).
HELD_OUT_DATASETS = (
    "nvidia/OpenMathInstruct-2",
    "nvidia/OpenMathReasoning",
    "open-r1/OpenR1-Math-220k",
    "bethgelab/CuratedThoughts",
)
HELD_OUT_SHARE = 0.05

#: One part of a split instruction (datasets 5.2.0 arrow_reader ``_SUB_SPEC_RE``): a split name, an optional
#: ``[from:to]`` in rows or percent, an optional rounding; parts are joined by ``+``.
_PART = re.compile(
    r"^(?P<split>\w+(?:\.\w+)*)"
    r"(?:\[(?:(?P<from>-?[\d_]+)(?P<from_pct>%)?)?:(?:(?P<to>-?[\d_]+)(?P<to_pct>%)?)?\])?"
    r"(?:\((?P<rounding>[^)]*)\))?$"
)


def split_rows(dataset: str, config: str) -> dict[str, int] | None:
    """The rows of each split of ``dataset``'s ``config``, when the package knows them."""
    return SPLIT_ROWS.get((dataset, config))


def selected_rows(instruction: str, rows: Mapping[str, int]) -> int:
    """The rows ``instruction`` selects, as ``datasets`` reads it (5.2.0 arrow_reader ``_rel_to_abs_instr``):
    negative bounds count from the end, bounds past the split are clamped to it. Raises ValueError with
    ``datasets``' words for a split the dataset lacks or an instruction it cannot read."""
    total = 0
    for spec in re.split(r"\s*\+\s*", instruction.strip()):
        part = _PART.match(spec)
        if not part:
            raise ValueError(f"Unrecognized instruction format: {spec}")
        if part["split"] not in rows:
            raise ValueError(f'Unknown split "{part["split"]}". Should be one of {list(rows)}.')
        size = rows[part["split"]]
        percent = bool(part["from_pct"] or part["to_pct"])
        start = _bound(part["from"], size, percent, part["rounding"], default=0)
        stop = _bound(part["to"], size, percent, part["rounding"], default=size)
        total += max(stop - start, 0)
    return total


def _bound(text: str | None, size: int, percent: bool, rounding: str | None, *, default: int) -> int:
    if text is None:
        return default
    value = int(text.replace("_", ""))
    if percent:
        value = value * (size // 100) if rounding == "pct1_dropremainder" else int(round(value * size / 100))
    if value < 0:
        value = max(size + value, 0)
    return min(value, size)


def trained_rows(c: Any, selected: int) -> int:
    """The selected rows left to train on: all of them, or 95% when train_rl holds part out to evaluate (the
    run's dataset is its own evaluation set)."""
    if c.effective_dataset in HELD_OUT_DATASETS and c.evaluation_dataset == c.effective_dataset:
        return selected - math.ceil(selected * HELD_OUT_SHARE)
    return selected


def rows_for(c: Any, prompts: int) -> int:
    """The fewest selected rows that leave ``prompts`` to train on."""
    rows = prompts
    while trained_rows(c, rows) < prompts:
        rows += 1
    return rows


def training_data(c: Any) -> tuple[str, str, dict[str, int]] | None:
    """The Hub split instruction a run trains on, with its config and the split rows, when the package can
    know them: no data files (with files the split is a parquet split of the files), a literal instruction
    (not an interval's template) and a dataset of :data:`SPLIT_ROWS`."""
    args = c.extra_train_args
    instruction, subset = args.get("train_split", "train"), args.get("hf_subset", "main")
    if args.get("hf_train_files") or not isinstance(instruction, str) or "{" in instruction:
        return None
    rows = split_rows(c.effective_dataset, str(subset))
    return (instruction, str(subset), rows) if rows else None


def data_resolution(c: Any) -> str | None:
    """What validation could not check of the training data, or found short, for the log of validate_config and
    the plan: a Hub dataset whose split sizes the package does not know, or an interval with fewer prompts than
    examples_per_interval (still enough for the planned steps)."""
    args = c.extra_train_args
    if args.get("hf_train_files") or "{" in str(args.get("train_split", "")):
        return None  # a parquet split of the files; an interval's template, checked once rendered
    known = training_data(c)
    if known is None:
        return (
            f"the split sizes of {c.effective_dataset} ({args.get('hf_subset', 'main')}) are not known to the "
            f"package: a train_split past their end is not refused here, and MaxText would train fewer steps or "
            "fail after the model is loaded (check the dataset card's row counts)"
        )
    instruction, _, rows = known
    try:
        selected = selected_rows(instruction, rows)
    except ValueError:
        return None  # validation refuses it
    if 0 < selected < c.examples_per_interval:
        return f"train_split '{instruction}' gives {selected} of the interval's {c.examples_per_interval} prompts"
    return None
