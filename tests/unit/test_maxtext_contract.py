"""Contract with the MaxText release in the tutorial's image (0.2.4): every module, config key and flag the
plan emits exists there, and every model the form offers is known to its configs and converters.
MaxText refuses unknown keys at start-up: on a TPU slice that is an expensive way to find a typo."""

import os
import re
import shlex
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from tpu_rl import maxtext
from tpu_rl.config import SUPPORTED_MODELS, RunConfig
from tpu_rl.plan import plan_documents

MAXTEXT_VERSION = "0.2.4"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpu-rl" / f"maxtext-{MAXTEXT_VERSION}"


@lru_cache
def wheel() -> zipfile.ZipFile:
    wheels = list(CACHE.glob("maxtext-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
             f"maxtext=={MAXTEXT_VERSION}", "-d", str(CACHE)],
            check=True,
        )
        wheels = list(CACHE.glob("maxtext-*.whl"))
    return zipfile.ZipFile(wheels[0])


def read(path: str) -> str:
    return wheel().read(f"maxtext/{path}").decode()


def flattened_keys(mapping: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in mapping.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= flattened_keys(value, f"{prefix}{key}.")
    return keys


@lru_cache
def known_config_keys(module: str) -> set[str]:
    keys = flattened_keys(yaml.safe_load(read("configs/base.yml")))
    if module == maxtext.TRAIN_RL:
        rl_keys = flattened_keys(yaml.safe_load(read("configs/post_train/rl.yml")))
        # RLConfig.map_flat_fields_to_nested_models routes a flat key such as the tutorial's
        # reshard_chunk_size into its nested model (rl.reshard_chunk_size).
        assert "map_flat_fields_to_nested_models" in read("configs/types.py")
        keys |= rl_keys | {key.rsplit(".", 1)[-1] for key in rl_keys}
    return keys


@lru_cache
def known_flags(module: str) -> set[str]:
    source = read(module.removeprefix("maxtext.").replace(".", "/") + ".py")
    argparse_flags = re.findall(r"add_argument\(\s*\"--(\w+)\"", source)
    absl_flags = re.findall(r"flags\.DEFINE_\w+\(\s*\"(\w+)\"", source)
    return set(argparse_flags) | set(absl_flags)


def module_invocations(config: RunConfig, run) -> list[tuple[str, list[str]]]:
    """(module, arguments) of every python -m MaxText call in the plan's JobSets."""
    found = []
    for _, doc in plan_documents(config, run):
        if doc.get("kind") != "JobSet":
            continue
        for job in doc["spec"]["replicatedJobs"]:
            for container in job["template"]["spec"]["template"]["spec"]["containers"]:
                if "command" not in container:
                    continue
                words = shlex.split(container["command"][2].split("||")[-1].split(";")[-1])
                if "-m" in words:
                    at = words.index("-m")
                    found.append((words[at + 1], words[at + 2:]))
    return found


@pytest.fixture(params=[{}, {"dataset_name": "nvidia/OpenMathInstruct-2", "extra_train_args": {"rl.num_iterations": 2}}])
def config(request, tutorial_conf) -> RunConfig:
    return RunConfig.from_params({**tutorial_conf, **request.param})


def test_every_emitted_key_and_flag_is_known_to_maxtext(config, run):
    invocations = module_invocations(config, run)
    assert sorted(m for m, _ in invocations) == sorted([maxtext.TO_MAXTEXT, maxtext.TRAIN_RL, maxtext.TO_HUGGINGFACE])
    for module, args in invocations:
        assert f"maxtext/{module.removeprefix('maxtext.').replace('.', '/')}.py" in wheel().namelist()
        for arg in args:
            name = arg.split("=", 1)[0]
            if name.startswith("--"):
                assert name[2:] in known_flags(module), f"{module}: unknown flag {name}"
            else:
                assert name in known_config_keys(module), f"{module}: unknown config key {name}"


def test_the_token_is_read_from_the_environment_by_this_release():
    """The plan never passes hf_access_token: MaxText must take HF_TOKEN from the environment."""
    source = read("configs/pyconfig.py")
    assert 'os.environ.get("HF_TOKEN")' in source


def test_data_template_ships_with_the_release(tutorial_config):
    assert tutorial_config.data_template_path in wheel().namelist()


@pytest.mark.parametrize("model", SUPPORTED_MODELS)
def test_supported_models_are_known_to_the_release(model):
    assert f"maxtext/configs/models/{model}.yml" in wheel().namelist()
    hf_ids_block = re.search(r"^HF_IDS = \{(.*?)^\}", read("utils/globals.py"), re.S | re.M).group(1)
    assert model in re.findall(r'^\s+"([^"]+)":', hf_ids_block, re.M)
    assert f'"{model}":' in read("checkpoint_conversion/utils/param_mapping.py")


def test_the_checker_rejects_unknown_keys():
    assert "num_batchs" not in known_config_keys(maxtext.TRAIN_RL)
    assert "hf_model_path" in known_flags(maxtext.TO_HUGGINGFACE)
    assert "override_model_architecture" in known_flags(maxtext.TO_HUGGINGFACE)
    assert "lazy_load_tensors" in known_flags(maxtext.TO_MAXTEXT)
