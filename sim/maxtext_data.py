"""The emulated trainer's data: what MaxText 0.2.4's train_rl gets from Hugging Face ``datasets`` for its keys.

train_rl.prepare_datasets (MaxText 0.2.4) takes one of two branches:
  - a dataset of :data:`HELD_OUT_DATASETS` evaluated on itself (eval_dataset_name == dataset_name, as MaxText's
    run_qwen3_30b_rl.sh recipe sets for nvidia/OpenMathInstruct-2): the training split is loaded once and split
    by ``train_test_split(test_size=0.05)``, the 5% scoring the evaluation; eval_dataset_name is never loaded;
  - else the training split, and (num_test_batches > 0) eval_split of eval_dataset_name, each loaded by
    get_dataset: ``datasets.load_dataset(name, name=hf_subset, split=split)``, or the data files as parquet.
A split instruction is read by the real ``datasets`` (ReadInstruction): clamped to the split, and one that selects
nothing raises its "corresponds to no data!". Then the trainer takes num_batches x batch_size x train_fraction
prompts in batches of batch_size (drop_remainder), and the evaluation num_test_batches x eval_batch_size.
"""

import math
from dataclasses import dataclass

from .maxtext_outputs import PodFailure

#: Rows of the Hub splits the emulator serves, by dataset and config (their dataset cards' dataset_info and
#: "Subset" lists): openai/gsm8k train 7,473 and test 1,319 in both configs; nvidia/OpenMathInstruct-2's card
#: names its downsampled splits by their rows (its full 'train' split is not served here).
HUB_SPLITS = {
    "openai/gsm8k": {"main": {"train": 7473, "test": 1319}, "socratic": {"train": 7473, "test": 1319}},
    "nvidia/OpenMathInstruct-2": {"default": {"train_1M": 1_000_000, "train_2M": 2_000_000, "train_5M": 5_000_000}},
}
#: train_rl.prepare_datasets' list of datasets it splits itself when evaluated on themselves.
HELD_OUT_DATASETS = (
    "nvidia/OpenMathInstruct-2",
    "nvidia/OpenMathReasoning",
    "open-r1/OpenR1-Math-220k",
    "bethgelab/CuratedThoughts",
)
#: A split read from data files: the emulator does not read them, and takes them as large enough.
FILES_ROWS = 10**6


@dataclass(frozen=True)
class Data:
    """What the trainer trains and evaluates on: batches of training prompts (over every epoch), and test
    prompts."""

    train_batches: int
    test_prompts: int


def load_hub_dataset(name, subset, data_files, split="train"):
    """The rows datasets.load_dataset gives: with data files the parquet split (not read: :data:`FILES_ROWS`);
    else the Hub dataset's config (a config it lacks is datasets' ValueError) and the split instruction, read
    by datasets' own ReadInstruction. A dataset this emulator does not serve is refused."""
    if data_files:
        return FILES_ROWS
    if name not in HUB_SPLITS:
        raise PodFailure(f"the emulator serves the datasets {sorted(HUB_SPLITS)} only, not {name}")
    if subset not in HUB_SPLITS[name]:
        raise PodFailure(f"ValueError: BuilderConfig '{subset}' not found. Available: {list(HUB_SPLITS[name])}")
    return selected_rows(split, HUB_SPLITS[name][subset])


def selected_rows(split, rows):
    import datasets  # the real reader of split instructions; imported when a trainer loads data

    try:
        absolute = datasets.ReadInstruction.from_spec(split).to_absolute(rows)
    except (ValueError, AssertionError) as error:
        raise PodFailure(f"ValueError: {error}") from None
    selected = sum(max(part.to - part.from_, 0) for part in absolute)  # a reversed slice reads nothing
    if not selected:
        raise PodFailure(f'ValueError: Instruction "{split}" corresponds to no data!')
    return selected


def load_data(args):
    """The prepare_datasets branch of the run's keys (module docstring), counted in prompts and batches."""
    subset = args.get("hf_subset", "main")
    dataset = args.get("dataset_name", "openai/gsm8k")
    eval_name = args.get("eval_dataset_name", "openai/gsm8k")  # rl.yml's
    evaluates = int(args.get("num_test_batches", 5)) > 0
    train_rows = load_hub_dataset(dataset, subset, args.get("hf_train_files"), args.get("train_split", "train"))
    if dataset in HELD_OUT_DATASETS and eval_name == dataset:
        test_rows = math.ceil(train_rows * 0.05)
        train_rows -= test_rows
    elif evaluates:
        test_rows = load_hub_dataset(
            eval_name or dataset, subset, args.get("hf_eval_files"), args.get("eval_split", "test")
        )
    else:
        test_rows = 0
    batch_size = int(args.get("batch_size", 1))
    taken = min(train_rows, int(int(args.get("num_batches", 4)) * batch_size * float(args.get("train_fraction", 1))))
    batches = taken // batch_size * int(args.get("num_epoch", 1))
    return Data(batches, evaluated_prompts(args, test_rows) if evaluates else 0)


def evaluated_prompts(args, test_rows):
    """Prompts the evaluation scores: the first num_test_batches x eval_batch_size test prompts, in whole
    batches (MaxText 0.2.4 train_rl.py:380-397: eval_batch_size when above 0, else batch_size;
    drop_remainder). The length filter takes none of the emulator's short prompts."""
    size = int(args.get("eval_batch_size", -1))
    per_batch = size if size > 0 else int(args.get("batch_size", 1))
    return min(int(args.get("num_test_batches", 5)) * per_batch, test_rows) // per_batch * per_batch
