"""The MaxText keys extra_train_args is checked against: the shipped file is what scripts/maxtext_keys.py writes from
the pinned release's wheel and ships in the package's wheel, every key the package, its examples and its docs use
is in it, and the MaxText emulator refuses an unknown key as MaxText does."""

import dataclasses
import json
import tomllib
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

from scripts import maxtext_keys
from sim.maxtext_outputs import PodFailure
from sim.maxtext_stages import MAXTEXT_KEYS, check_config_keys, parse_invocation
from tpu_rl import config_rules, maxtext
from tpu_rl.config import ConfigError, RunConfig
from tpu_rl.config_rules import MAXTEXT_RELEASE, is_maxtext_key
from tpu_rl.layout import GcsLayout

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "src" / "tpu_rl" / f"maxtext_keys_{MAXTEXT_RELEASE}.json"
#: The keys the README and docs/ tell users to set in extra_train_args.
DOCUMENTED = (
    "num_test_batches",
    "eval_batch_size",
    "train_split",
    "hf_train_files",
    "hf_subset",
    "data_shuffle_seed",
    "max_prefill_predict_length",
    "eval_dataset_name",
    "rl.num_iterations",
    "num_iterations",
    "train_fraction",
    "num_epoch",
)


def release_file(path: str) -> str:
    with zipfile.ZipFile(maxtext_keys.wheel_path(MAXTEXT_RELEASE)) as wheel:
        return wheel.read(f"maxtext/{path}").decode()


def test_the_shipped_keys_are_what_the_generator_reads_from_the_pinned_wheel():
    wheel = maxtext_keys.wheel_path(MAXTEXT_RELEASE)
    assert SHIPPED.read_text() == maxtext_keys.render(maxtext_keys.document(MAXTEXT_RELEASE, wheel))


def test_the_file_is_the_release_the_image_runs_and_the_emulator_reads(tutorial_config):
    shipped = json.loads(SHIPPED.read_text())
    assert tutorial_config.cloud_image_name.endswith(f":{shipped['maxtext']}")
    assert shipped["source"]["tag"] == f"maxtext-v{MAXTEXT_RELEASE}" and len(shipped["source"]["commit"]) == 40
    assert shipped["config_class"] == "maxtext.configs.types.RLConfig" and shipped["module"] == maxtext.TRAIN_RL
    assert MAXTEXT_KEYS == SHIPPED and config_rules.maxtext_keys() == shipped


def test_the_file_ships_in_the_wheel():
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert any(fnmatch(SHIPPED.name, pattern) for pattern in package_data["tpu_rl"])


def example_keys() -> set[str]:
    """The MaxText keys the shipped examples give: extra_train_args and interval data of the confs, a program's
    data and params."""
    keys = set()
    for path in sorted((REPO / "include" / "examples").glob("*.json")):
        conf = json.loads(path.read_text())
        keys |= set(conf.get("extra_train_args", {})) | set(conf.get("interval_data", {}))
    programs = yaml.safe_load((REPO / "include" / "examples" / "programs.yaml").read_text())["programs"]
    for body in programs.values():
        keys |= set(body.get("data", {})) | set(body.get("params", {}).get("extra_train_args", {}))
    return keys


def test_every_key_the_tutorial_the_examples_and_the_docs_use_is_known(tutorial_config, run):
    emitted = {key for key, _ in maxtext.train_rl(tutorial_config, GcsLayout(tutorial_config, run)).config}
    recipe = {pair.split("=")[0] for pair in config_rules.DATASET_RECIPE.split(", ")}
    examples = example_keys()
    assert examples and {"train_split", "hf_train_files", "eval_dataset_name"} <= examples
    used = emitted | examples | recipe | set(DOCUMENTED) | set(config_rules.INTERVAL_DATA_KEYS)
    used |= set(config_rules._STEP_KEYS) | config_rules._OWN_TRAIN_KEYS
    assert sorted(key for key in used if not is_maxtext_key(key)) == []


def test_every_key_of_the_release_passes_the_key_rule(tutorial_config):
    every = dict.fromkeys(json.loads(SHIPPED.read_text())["keys"])
    assert list(config_rules._validate_maxtext_keys(dataclasses.replace(tutorial_config, extra_train_args=every))) == []


@pytest.mark.parametrize(
    "key, flat, setter",
    [
        ("dataset.num_test_batches", "num_test_batches", "MaxText's rl.yml"),
        ("rl.reshard_chunk_size", "reshard_chunk_size", "the run"),
        ("vllm.hbm_utilization_vllm", "hbm_utilization_vllm", "the run"),
    ],
)
def test_a_nested_key_maxtext_replaces_by_a_flat_one_is_refused(tutorial_conf, key, flat, setter):
    """RLConfig.map_flat_fields_to_nested_models (MaxText 0.2.4 configs/types.py:4585) copies a flat key over the
    nested field: with num_test_batches flat in rl.yml, dataset.num_test_batches=0 would still evaluate."""
    with pytest.raises(ConfigError) as raised:
        RunConfig.from_params({**tutorial_conf, "extra_train_args": {key: 1}})
    [problem] = raised.value.problems
    assert f"'{key}' is replaced by the flat '{flat}' that {setter} sets" in problem.message
    copy = release_file("configs/types.py").splitlines()[4584]
    assert copy.strip() == "nested_dict[inner_key] = data[inner_key]"


# --- the emulator --------------------------------------------------------------------------------------------------


def train_rl_args(config: RunConfig, run) -> dict:
    """The key=value overrides of train_rl's command as the emulator reads them off the container."""
    script = maxtext.train_rl(config, GcsLayout(config, run)).script()
    stage, args, _ = parse_invocation(["/bin/bash", "-c", script])
    assert stage == "train_rl"
    return args


def test_the_emulated_trainer_takes_the_tutorials_command(tutorial_config, run):
    check_config_keys(train_rl_args(tutorial_config, run))


def test_the_emulated_trainer_refuses_an_unknown_key_with_maxtexts_error(tutorial_config, run):
    """MaxText 0.2.4 configs/pyconfig.py: the ValueError of _prepare_for_pydantic, logged by
    _handle_config_exception between two rules of '=', then exit code 2."""
    source = release_file("configs/pyconfig.py")
    assert "raise ValueError(f\"{key!r} not in {', '.join(map(repr, valid_fields))}.\")" in source
    assert 'err_msg = f"MAXTEXT CONFIG ERROR: {str(e)}"' in source and "sys.exit(2)" in source
    typo = dataclasses.replace(tutorial_config, extra_train_args={"learning_rat": 1e-6})

    with pytest.raises(PodFailure) as failed:
        check_config_keys(train_rl_args(typo, run))

    assert failed.value.exit_code == 2
    assert str(failed.value).startswith("MAXTEXT CONFIG ERROR: 'learning_rat' not in 'abort_on_inf_loss', ")
    assert str(failed.value).endswith(", 'z_loss_multiplier'.")
    assert ["=" * 80, str(failed.value), "=" * 80] == [line.split("] ", 1)[1] for line in failed.value.lines[1:]]


def test_the_emulated_trainer_checks_the_part_before_the_dot_as_maxtext_does():
    """OmegaConf makes rl.num_iteratons the key rl holding {num_iteratons: ...}: MaxText checks rl only (and drops
    the inner typo), which is why the package refuses such a key before the run."""
    check_config_keys({"rl.num_iteratons": "2"})
    with pytest.raises(PodFailure, match="^MAXTEXT CONFIG ERROR: 'rlx' not in "):
        check_config_keys({"rlx.num_iterations": "2"})
