"""The training data a run asks for, known before the slice exists: a Hub split instruction past the end of its
split is refused (Hugging Face clamps a slice, and raises on an empty one after the model is on the slice), a
program ends before its data does, and the MaxText emulator reads split instructions as ``datasets`` does."""

import json
import random
from datetime import UTC, datetime, timedelta

import datasets
import pytest
import yaml

from sim.maxtext_data import load_data
from sim.maxtext_outputs import PodFailure
from tpu_rl import hub_datasets, plan
from tpu_rl.config import ConfigError, RunConfig
from tpu_rl.config_rules import DATASET_RECIPE
from tpu_rl.programs import ProgramError, load_programs, parse_program
from tpu_rl.run import DataInterval
from tpu_rl_testing import REPO, TUTORIAL_CONF

pytestmark = pytest.mark.core

EXAMPLE = REPO / "include/examples/programs.yaml"
START = datetime(2026, 11, 1, tzinfo=UTC)
PER_DAY = {"interval_data": {"train_split": "train[{first}:{stop}]"}, "examples_per_interval": 200}


def day(index: int) -> DataInterval:
    start = START + timedelta(days=index)
    return DataInterval(start, start + timedelta(days=1), index)


def recipe_args() -> dict:
    return dict(pair.split("=", 1) for pair in DATASET_RECIPE.split(", "))


def test_the_package_reads_a_split_instruction_as_hugging_face_datasets_does():
    """Generated instructions (row and percent bounds, negative ones, bounds past the end, roundings, joined
    parts) against the real datasets.ReadInstruction."""
    rows = {"train": 7473, "test": 1319}
    draw = random.Random(7)

    def bound():
        value = draw.choice([None, draw.randint(-9000, 9000), draw.randint(0, 7473)])
        if value is not None and draw.random() < 0.3:
            return f"{max(-100, min(100, value // 90))}%"
        return "" if value is None else str(value)

    for _ in range(400):
        parts = []
        for _ in range(draw.choice([1, 1, 2])):
            low, high = bound(), bound()
            if "%" in low + high and draw.random() < 0.5:
                low, high = low.replace("%", "") + ("%" if low else ""), high
            rounding = "(pct1_dropremainder)" if "%" in low + high and draw.random() < 0.3 else ""
            parts.append(f"{draw.choice(list(rows))}[{low}:{high}]{rounding}")
        spec = "+".join(parts)
        try:
            expected = sum(max(p.to - p.from_, 0) for p in datasets.ReadInstruction.from_spec(spec).to_absolute(rows))
        except (ValueError, AssertionError):
            continue  # datasets refuses mixed units in one part; the package need not read them
        assert hub_datasets.selected_rows(spec, rows) == expected, spec


def test_an_interval_past_the_end_of_its_split_is_refused_before_anything_is_created():
    config = RunConfig.from_params({**TUTORIAL_CONF, **PER_DAY})
    assert config.for_interval(day(36)).extra_train_args["train_split"] == "train[7200:7400]"
    with pytest.raises(ConfigError) as short:
        config.for_interval(day(37))  # train[7400:7600]: 73 of GSM8K's 7,473 rows, 18 batches, not 50
    [problem] = short.value.problems
    assert problem.field == "interval_data" and "2026-12-08" in problem.message and "73 prompts" in problem.message
    assert "end_date" in problem.fix
    with pytest.raises(ConfigError, match="corresponds to no data"):
        config.for_interval(day(38))


def test_a_literal_split_past_the_end_is_refused_by_validation_and_the_plan(tmp_path, capsys):
    conf = {**TUTORIAL_CONF, "extra_train_args": {"train_split": "train[7400:]"}}
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_params(conf)
    assert refused.value.fields == ["extra_train_args"] and "select at least 200 rows" in str(refused.value)
    path = tmp_path / "conf.json"
    path.write_text(json.dumps(conf))
    assert plan.main(["--conf", str(path)]) == 2
    assert "train_split 'train[7400:]' gives 73 prompts" in capsys.readouterr().err
    with pytest.raises(ConfigError, match='Unknown split "validation"'):
        RunConfig.from_params({**TUTORIAL_CONF, "extra_train_args": {"train_split": "validation"}})
    RunConfig.from_params({**TUTORIAL_CONF, "extra_train_args": {"train_split": "train[:5%]"}})  # 374 rows


def test_what_validation_cannot_check_or_finds_short_is_said():
    own_data = {"hf_subset": "default", "eval_dataset_name": "openai/gsm8k"}
    unknown = RunConfig.from_params({**TUTORIAL_CONF, "dataset_name": "my-org/prompts", "extra_train_args": own_data})
    assert "not known to the package" in hub_datasets.data_resolution(unknown)
    config = RunConfig.from_params({**TUTORIAL_CONF, **PER_DAY, "examples_per_interval": 300})
    assert "gives 273 of the interval's 300 prompts" in hub_datasets.data_resolution(config.for_interval(day(24)))
    assert hub_datasets.data_resolution(config.for_interval(day(23))) is None


def test_examples_per_interval_counts_the_share_train_rl_holds_out_to_evaluate():
    """MaxText's own recipe evaluates OpenMathInstruct-2 on 5% of the training rows."""
    conf = {
        **TUTORIAL_CONF,
        "dataset_name": "nvidia/OpenMathInstruct-2",
        "extra_train_args": {"eval_dataset_name": recipe_args()["eval_dataset_name"]},
        "interval_data": {"hf_train_files": "gs://b/prompts/dt={ds}/*.parquet"},
        "examples_per_interval": 200,
    }
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_params(conf)
    assert refused.value.fields == ["examples_per_interval"] and "set it to at least 211" in str(refused.value)
    RunConfig.from_params({**conf, "examples_per_interval": 211})


def test_a_program_whose_data_runs_out_must_end_before_it_does():
    body = yaml.safe_load(EXAMPLE.read_text())["programs"]["maxtext_rl_tpu_daily"]
    assert {p.dag_id: p for p in load_programs(EXAMPLE)}["maxtext_rl_tpu_daily"].end_date == datetime(
        2026, 12, 7, tzinfo=UTC
    )
    del body["end_date"]
    with pytest.raises(ProgramError, match="end_date: the data runs out after 37 interval.*end_date: 2026-12-07"):
        parse_program("programs.yaml", "daily", body)
    with pytest.raises(ProgramError, match="set end_date: 2026-12-07"):
        parse_program("programs.yaml", "daily", {**body, "end_date": datetime(2026, 12, 8).date()})
    weekly = yaml.safe_load(EXAMPLE.read_text())["programs"]["maxtext_rl_tpu_weekly"]
    assert parse_program("programs.yaml", "weekly", weekly).end_date is None  # its files never run out


def test_the_emulated_trainer_reads_the_split_as_datasets_does_and_stops_with_its_data():
    args = {"dataset_name": "openai/gsm8k", "num_batches": "50", "batch_size": "4"}
    assert load_data({**args, "train_split": "train[7200:7400]"}).train_batches == 50
    assert load_data({**args, "train_split": "train[7400:7600]"}).train_batches == 18  # clamped: 73 rows
    with pytest.raises(PodFailure, match=r'Instruction "train\[7600:7800\]" corresponds to no data!'):
        load_data({**args, "train_split": "train[7600:7800]"})
    with pytest.raises(PodFailure, match='Unknown split "validation"'):
        load_data({**args, "train_split": "validation"})


def test_the_emulated_trainer_runs_maxtexts_own_openmathinstruct_recipe():
    """train_rl splits a dataset evaluated on itself (prepare_train_and_eval_dataset) instead of loading
    eval_dataset_name with hf_subset 'main', which OpenMathInstruct-2 lacks."""
    data = load_data({**recipe_args(), "dataset_name": "nvidia/OpenMathInstruct-2", "batch_size": "4"})
    assert (data.train_batches, data.test_prompts) == (4, 20)
    evaluated_elsewhere = {**recipe_args(), "eval_dataset_name": "openai/gsm8k", "hf_subset": "default"}
    with pytest.raises(PodFailure, match="BuilderConfig 'default' not found"):  # loaded with the same hf_subset
        load_data({**evaluated_elsewhere, "dataset_name": "nvidia/OpenMathInstruct-2"})
