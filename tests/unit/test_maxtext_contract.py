"""Contract with the MaxText release in the tutorial's image (0.2.4): every module, config key and flag the
plan emits exists there, and every model the form offers is known to its configs and converters.
MaxText refuses unknown keys at start-up: on a TPU slice that is an expensive way to find a typo."""

import hashlib
import os
import re
import shlex
import subprocess
import sys
import urllib.request
import warnings
import zipfile
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from tpu_rl import checkpoints, config_rules, maxtext, training_metrics
from tpu_rl.checkpoints import TRAINER_SUCCESS_LINE
from tpu_rl.config import RunConfig
from tpu_rl.config_rules import INTERVAL_DATA_KEYS, MAXTEXT_DEFAULT_TEST_BATCHES, SUPPORTED_MODELS
from tpu_rl.layout import GcsLayout
from tpu_rl.plan import plan_documents
from tpu_rl.run import DataInterval

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

MAXTEXT_VERSION = "0.2.4"
#: The least Tunix release MaxText 0.2.4's wheel asks for (google-tunix>=0.1.7; its post-training install pins a
#: later commit, TUNIX_COMMIT below, which the Tunix markers are read at), and the metrics library Tunix writes
#: TensorBoard files through (MaxText 0.2.4: google-metrax>=0.2.4).
TUNIX_LEAST_RELEASE = "0.1.7"
METRAX_VERSION = "0.2.4"
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpu-rl"


@lru_cache
def cached_wheel(project: str, version: str) -> zipfile.ZipFile:
    """The release's wheel, downloaded once into ~/.cache/tpu-rl/<project>-<version>/."""
    folder = CACHE_ROOT / f"{project}-{version}"
    wheels = list(folder.glob("*.whl"))
    if not wheels:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
                f"{project}=={version}",
                "-d",
                str(folder),
            ],
            check=True,
        )
        wheels = list(folder.glob("*.whl"))
    return zipfile.ZipFile(wheels[0])


def wheel() -> zipfile.ZipFile:
    return cached_wheel("maxtext", MAXTEXT_VERSION)


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
                    args = words[at + 2 :]  # up to the command that follows (the export's copy)
                    found.append((words[at + 1], args[: args.index("&&")] if "&&" in args else args))
    return found


@pytest.fixture(
    params=[
        {},
        {
            "dataset_name": "nvidia/OpenMathInstruct-2",
            "extra_train_args": {
                "rl.num_iterations": 2,
                "hf_train_files": "hf://datasets/nvidia/OpenMathInstruct-2/data/train_1M-*.parquet",
                "train_split": "train_1M",
                "eval_dataset_name": "nvidia/OpenMathInstruct-2",
            },
        },
        {"cluster_nodepool_count": 2, "ici_expert_parallelism": 1},
    ]
)
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


def test_the_multislice_branch_the_package_relies_on():
    """Several slices: the package sets num_trainer_slices / num_samplers_slices (rl.yml's -1 is the single-slice
    branch), and validation refuses what the multislice branch cannot lay out (tpu_rl.config_rules
    _validate_multislice; the emulator: sim/maxtext_devices.py)."""
    rl_yml = yaml.safe_load(read("configs/post_train/rl.yml"))
    assert (rl_yml["num_trainer_slices"], rl_yml["num_samplers_slices"]) == (-1, -1)
    source = read("utils/model_creation_utils.py")
    for marker in (
        "if config.num_trainer_slices == -1 and config.num_samplers_slices == -1:",
        'max_logging.log("Running on a single slice")',
        "num_trainer_devices = int(num_devices * config.trainer_devices_fraction)",
        "elif config.num_trainer_slices > 0 and config.num_samplers_slices > 0:",
        'raise ValueError("Not enough slices for trainer and samplers")',
        "trainer_fsdp = trainer_devices_per_slice // tp",
        '"ici_fsdp_parallelism": trainer_fsdp,',
        '"dcn_data_parallelism": config.num_trainer_slices,',
        '"ici_fsdp_parallelism": len(sampler_devices) // config.num_samplers_slices,',
        '"ici_tensor_parallelism": -1,',
    ):
        assert marker in source, marker
    assert "ici_expert_parallelism" not in source  # the branch leaves the expert axis as given: it must be 1
    assert 'does not match"\n      f" the product of the {parallelism_type} parallelism' in read("utils/max_utils.py")


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


# --- what the trainer reports: its TensorBoard tags and its evaluation lines (docs/reference/training-metrics.md)


#: The Tunix commit MaxText 0.2.4's post-training install pins (dependencies/extra_deps/post_train_github_deps.txt),
#: and the archive it installs: what the image runs, and what every Tunix marker in this file is read from.
TUNIX_COMMIT = "c4ec573d29e4c3a3955b348256d464b119c8a6d1"
TUNIX_ARCHIVE_URL = f"https://github.com/google/tunix/archive/{TUNIX_COMMIT}.zip"
#: Each file a Tunix marker is read from, with its git blob id at TUNIX_COMMIT (git rev-parse COMMIT:tunix/PATH):
#: a file is read only if its bytes hash to it, so a marker found is the commit's. No Tunix release on PyPI holds
#: these files (0.1.7, the newest, is older than the commit and differs in each of them).
TUNIX_BLOBS_AT_COMMIT = {
    "sft/metrics_logger.py": "50ace9bae1d34731aac2f40d4a80f691c596b9ca",
    "sft/peft_trainer.py": "f9c43f46c0a82233073a0e042647bf5ddace8f2f",
    "sft/checkpoint_manager.py": "eff10e3354c3851a713eba537be54db00b93b4c2",
    "rl/rl_cluster.py": "14bd15a966aa943f682d5ebf98733b8edd550bd6",
    "rl/reward_manager.py": "c80b0d7ffb9106a4216dc8036e02f27104739704",
    "rl/grpo/grpo_learner.py": "82dba67025c7e27aead6f62264d9daf2913ce646",
}
#: A clone of google/tunix (work tree or bare) to take the commit from where GitHub is out of reach.
TUNIX_REPO_VARIABLE = "TUNIX_REPO"


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes: what git rev-parse COMMIT:PATH prints for the file at that commit."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fetch_tunix_archive(archive: Path) -> None:
    """The commit's source as a zip laid out as GitHub's archive, from TUNIX_REPO if set, else GitHub; kept only
    when every file the markers are read from is the commit's."""
    partial = archive.with_suffix(".part")
    repo = os.environ.get(TUNIX_REPO_VARIABLE)
    if repo:
        command = ["git", "-C", repo, "archive", "--format=zip", f"--prefix=tunix-{TUNIX_COMMIT}/", "-o", str(partial)]
        made = subprocess.run([*command, TUNIX_COMMIT, "tunix"], capture_output=True, text=True)
        assert made.returncode == 0, f"{TUNIX_REPO_VARIABLE}={repo}: {made.stderr}"
    else:
        with urllib.request.urlopen(TUNIX_ARCHIVE_URL, timeout=30) as response:
            partial.write_bytes(response.read())
    for path in TUNIX_BLOBS_AT_COMMIT:
        tunix_file(zipfile.ZipFile(partial), path)
    partial.rename(archive)


@lru_cache
def tunix_archive() -> tuple[zipfile.ZipFile | None, str]:
    """The pinned commit's source, fetched once into ~/.cache/tpu-rl/google-tunix-<commit>/; or why it cannot be."""
    archive = CACHE_ROOT / f"google-tunix-{TUNIX_COMMIT}" / f"tunix-{TUNIX_COMMIT}.zip"
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        try:
            fetch_tunix_archive(archive)
        except OSError as error:
            return None, (
                f"Tunix {TUNIX_COMMIT} is on GitHub only, out of reach here ({error}): set {TUNIX_REPO_VARIABLE} to "
                f"a clone of google/tunix, or put its archive ({TUNIX_ARCHIVE_URL}) at {archive}"
            )
    return zipfile.ZipFile(archive), ""


def tunix_file(archive: zipfile.ZipFile, path: str) -> str:
    """tunix/<path> in the archive, if its bytes are the file's at TUNIX_COMMIT."""
    name = f"tunix-{TUNIX_COMMIT}/tunix/{path}"
    assert name in archive.namelist(), f"{archive.filename} has no {name}"
    data = archive.read(name)
    assert git_blob_id(data) == TUNIX_BLOBS_AT_COMMIT[path], f"{name} in {archive.filename} is not the commit's"
    return data.decode()


def tunix(path: str) -> str:
    """tunix/<path> at TUNIX_COMMIT; where the commit's source cannot be had, the least release MaxText asks for
    (0.1.7, from PyPI), with a warning saying so: its markers were found unchanged at the commit when they were
    written, and a check against a release beats none."""
    archive, why_not = tunix_archive()
    if archive is None:
        warnings.warn(f"{why_not}; read from google-tunix {TUNIX_LEAST_RELEASE} instead", stacklevel=2)
        return cached_wheel("google-tunix", TUNIX_LEAST_RELEASE).read(f"tunix/{path}").decode()
    return tunix_file(archive, path)


def test_the_release_pins_the_tunix_commit_the_markers_are_read_at():
    pins = wheel().read("dependencies/extra_deps/post_train_github_deps.txt").decode()
    [pinned] = re.findall(r"^google-tunix @ https://github\.com/google/tunix/archive/(\w+)\.zip$", pins, re.M)
    assert pinned == TUNIX_COMMIT, (
        f"MaxText pins Tunix {pinned}, the markers were read at {TUNIX_COMMIT}: set TUNIX_COMMIT to it, record "
        "each file's blob id at the new commit in TUNIX_BLOBS_AT_COMMIT, run this file with "
        f"{TUNIX_REPO_VARIABLE}=<a clone> (or with GitHub in reach) and redo the Tunix line numbers in "
        "docs/reference/training-metrics.md"
    )
    assert TUNIX_COMMIT in (Path(__file__).resolve().parents[2] / "docs/reference/training-metrics.md").read_text()


def test_a_file_is_read_only_with_the_commits_bytes(tmp_path):
    """A file that is not the commit's (here Tunix 0.1.7's, which has every marker) is refused, not read."""
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git hash-object of the empty file
    release = cached_wheel("google-tunix", TUNIX_LEAST_RELEASE).read("tunix/sft/metrics_logger.py")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as other:
        other.writestr(f"tunix-{TUNIX_COMMIT}/tunix/sft/metrics_logger.py", release)
    with pytest.raises(AssertionError, match="is not the commit's"):
        tunix_file(zipfile.ZipFile(tmp_path / "other.zip"), "sft/metrics_logger.py")


def test_the_release_requires_the_tunix_and_metrax_read_here():
    metadata = wheel().read(f"maxtext-{MAXTEXT_VERSION}.dist-info/METADATA").decode()
    assert f"Requires-Dist: google-tunix>={TUNIX_LEAST_RELEASE}; extra == 'tpu-post-train'" in metadata
    assert f"Requires-Dist: google-metrax>={METRAX_VERSION}; extra == 'tpu-post-train'" in metadata


def test_event_files_are_where_the_layout_looks(tutorial_config, run):
    """tensorboard_dir is <base_output_directory>/<run_name>/tensorboard/, and train_rl logs there."""
    assert 'tensorboard_dir = os.path.join(self.base_output_directory, self.run_name, "tensorboard", "")' in read(
        "configs/types.py"
    )
    assert re.search(
        r"MetricsLoggerOptions\(\s*log_dir=trainer_config.tensorboard_dir", read("trainers/post_train/rl/train_rl.py")
    )
    layout = GcsLayout(tutorial_config, run)
    args = dict(maxtext.train_rl(tutorial_config, layout).config)
    assert layout.uri(layout.tensorboard_prefix) == f"{args['base_output_directory']}{args['run_name']}/tensorboard/"


def test_the_event_files_are_written_by_the_emulators_writer():
    """Tunix logs through metrax's TensorboardBackend, a tensorboardX SummaryWriter: the emulator uses it too."""
    backend = cached_wheel("google-metrax", METRAX_VERSION).read("metrax/logging/tensorboard_backend.py").decode()
    assert "from tensorboardX import writer" in backend and "writer.SummaryWriter(logdir=log_dir)" in backend
    assert "self._writer.add_scalar(event_name, value, current_step)" in backend
    assert "TensorboardBackend(\n              log_dir=self.log_dir," in tunix("sft/metrics_logger.py")


def test_the_tags_read_are_the_ones_tunix_writes():
    """Tag = prefix/mode/name; learner metrics 'group/name' split at the first '/'; mode 'train'."""
    assert 'f"{metrics_prefix}/{mode}/{metric_name}", scalar_value, step=step' in tunix("sft/metrics_logger.py")
    assert 'TRAIN = "train"' in tunix("sft/metrics_logger.py")
    assert 'prefix, metric_name = metric_name.split("/", maxsplit=1)' in tunix("rl/rl_cluster.py")
    reward_manager = tunix("rl/reward_manager.py")
    assert 'f"{prefix}/sum": (np.nansum(rewards, axis=axis), np.mean)' in reward_manager
    assert '_calculate_scalar_reward_log_metrics(rewards, prefix="rewards")' in reward_manager
    assert training_metrics.REWARD_TAG == "rewards/train/sum"
    assert 'actor_config.metrics_prefix = "actor"' in tunix("rl/rl_cluster.py")
    assert 'self.metrics_logger.log(self.metrics_prefix, "loss", loss, self._mode, step)' in tunix(
        "sft/peft_trainer.py"
    )
    assert training_metrics.LOSS_TAG == "actor/train/loss"
    assert '"kl": np.mean,' in tunix("rl/grpo/grpo_learner.py")
    assert training_metrics.KL_TAG == "actor/train/kl"


def evaluation_format(when: str) -> str:
    """The f-string train_rl logs its evaluation with, as written in the release."""
    source = read("trainers/post_train/rl/train_rl.py")
    return re.search(rf'max_logging\.warning\(\s*(f"{when} RL Training: .*?)\s*\)\n', source, re.S).group(1)


@pytest.mark.parametrize("when", ["Pre", "Post"])
def test_the_evaluation_lines_of_this_release_are_parsed(when):
    values = {
        "corr": 12,
        "total": 20,
        "accuracy": 60.0,
        "partial_accuracy": 65.0,
        "format_accuracy": 95.0,
        "mean_reward": 0.71234,
    }
    line = eval(f"({evaluation_format(when)})", {}, values)  # the release's own f-string, filled in

    evaluation = training_metrics.parse_evaluation([f"W1201 10:00:00.000000 1 train_rl.py:786] {line}"])

    score = evaluation.before if when == "Pre" else evaluation.after
    assert score == training_metrics.Score(
        correct=12, total=20, accuracy=60.0, partial_accuracy=65.0, format_accuracy=95.0, mean_reward=0.7123
    )


def test_evaluation_runs_around_training_only_with_test_batches():
    source = read("trainers/post_train/rl/train_rl.py")
    pre, success, post = (
        source.index(text) for text in ('f"Pre RL Training', f'"{TRAINER_SUCCESS_LINE}"', 'f"Post RL Training')
    )
    assert pre < success < post
    for at in (pre, post):
        assert source.rfind("if trainer_config.num_test_batches > 0:", 0, at) > source.rfind("\n  max_logging", 0, at)
    rl_defaults = yaml.safe_load(read("configs/post_train/rl.yml"))
    assert rl_defaults["num_test_batches"] == MAXTEXT_DEFAULT_TEST_BATCHES


@pytest.mark.parametrize(
    "data", [{"train_split": "train[{first}:{stop}]"}, {"hf_train_files": "gs://b/prompts/week={ds}/*.parquet"}]
)
def test_a_programs_interval_data_reaches_the_keys_train_rl_loads_its_training_data_from(tutorial_conf, run, data):
    """A program's data keys are passed to train_rl as config keys of this release, and they are what its
    get_dataset reads the training split from (a key it ignored would train every interval on the same data)."""
    source = read("trainers/post_train/rl/train_rl.py")
    assert source.count("split=trainer_config.train_split,") >= 2  # both branches of prepare_datasets' training data
    assert source.count("data_files=trainer_config.hf_train_files,") >= 2
    assert 'datasets.load_dataset(\n        "parquet",\n        data_files={split: data_files},' in source

    interval = DataInterval(datetime(2026, 11, 3, tzinfo=UTC), datetime(2026, 11, 4, tzinfo=UTC), 2)
    config = RunConfig.from_params({**tutorial_conf, "interval_data": data, "examples_per_interval": 200})
    [train_args] = [
        args for module, args in module_invocations(config.for_interval(interval), run) if module == maxtext.TRAIN_RL
    ]
    rendered = {key: template.format(**interval.template_values(200)) for key, template in data.items()}
    assert {f"{key}={value}" for key, value in rendered.items()} <= set(train_args)
    assert set(data) <= set(INTERVAL_DATA_KEYS) and set(data) <= known_config_keys(maxtext.TRAIN_RL)


# --- what the package relies on of the Tunix commit and the Orbax release the image runs ------------------

ORBAX_VERSION = "0.12.8"


def orbax(path: str) -> str:
    return cached_wheel("orbax-checkpoint", ORBAX_VERSION).read(f"orbax/checkpoint/{path}").decode()


def test_orbax_skips_a_step_without_its_commit_marker_and_writes_the_marker_last():
    """What the set-aside and the final-step check rely on (checkpoints.plan_resume): on gs:// a step folder is
    written in place, commit_success.txt last, and a folder without it is no step to restore."""
    assert "COMMIT_SUCCESS_FILE = 'commit_success.txt'" in orbax("_src/path/atomicity_types.py")
    assert checkpoints.COMMIT_SUCCESS == "commit_success.txt"
    step = orbax("_src/path/step.py")
    assert "if not is_path_finalized(" in step and "return None" in step.split("if not is_path_finalized(", 1)[1][:400]
    atomicity = orbax("_src/path/atomicity.py")
    assert "COMMIT_SUCCESS_FILE" in atomicity.split("class CommitFileTemporaryPath", 1)[1]
    assert "return atomicity.CommitFileTemporaryPath" in orbax("_src/path/atomicity_defaults.py")


def test_the_planned_steps_are_maxtexts():
    """configs/types.py: train_steps = int(num_batches x rl.num_iterations x train_fraction x num_epoch)."""
    source = read("configs/types.py")
    assert (
        "int(self.dataset.num_batches * self.rl.num_iterations * self.dataset.train_fraction * self.num_epoch)"
        in source
    )


def test_a_hub_dataset_is_loaded_with_hf_subset_and_the_recipe_sets_files_split_and_evaluation():
    """What config_rules._validate_dataset refuses and recommends."""
    source = read("trainers/post_train/rl/train_rl.py")
    assert "data = datasets.load_dataset(dataset_name, name=tmvp_config.hf_subset, split=split)" in source
    rl = yaml.safe_load(read("configs/post_train/rl.yml"))
    assert (rl["hf_subset"], rl["eval_dataset_name"]) == ("main", "openai/gsm8k")
    recipe = read("trainers/post_train/rl/scripts/run_qwen3_30b_rl.sh")
    for pair in config_rules.DATASET_RECIPE.split(", "):
        assert pair in recipe, pair


def test_the_emulated_trainer_loads_a_hub_dataset_as_maxtext_does():
    """The MaxText emulator refuses what train_rl's datasets.load_dataset(dataset_name, name=hf_subset) would: a
    dataset alone whose configs lack rl.yml's hf_subset; data files are read as parquet, whatever the name."""
    from sim.maxtext_data import load_hub_dataset
    from sim.maxtext_outputs import PodFailure

    hf_subset = yaml.safe_load(read("configs/post_train/rl.yml"))["hf_subset"]
    with pytest.raises(PodFailure, match=f"BuilderConfig '{hf_subset}' not found"):
        load_hub_dataset("nvidia/OpenMathInstruct-2", hf_subset, None)
    load_hub_dataset("nvidia/OpenMathInstruct-2", hf_subset, "gs://b/prompts/*.parquet")
    load_hub_dataset("openai/gsm8k", hf_subset, None)


def test_tunix_logs_the_step_it_restored():
    """The line that tells an attempt that resumed (its Pre evaluation scores trained weights)."""
    assert "'Restored params from step: %d in %.3f seconds'" in tunix("sft/checkpoint_manager.py")
    assert (
        training_metrics.kept_line_kind("I1 checkpoint_manager.py:293] Restored params from step: 40 in 1.2 seconds")
        == "Restored"
    )
