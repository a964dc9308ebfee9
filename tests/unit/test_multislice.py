"""Several slices: train_rl goes down MaxText 0.2.4's multislice branch (whole slices per role, FSDP x tensor in a
slice, data parallel over the slices), what that branch cannot run is refused at validation, and the emulated
trainer fails where MaxText does (sim/maxtext_devices.py)."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from sim.maxtext_devices import device_split
from sim.maxtext_emulator import pathways_slices
from sim.maxtext_outputs import PodFailure
from tpu_rl import maxtext
from tpu_rl.config import ConfigError, RunConfig
from tpu_rl.layout import GcsLayout
from tpu_rl.manifests import training_jobset
from tpu_rl_testing import REPO

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

#: Two v6e-64 slices, laid out as the multislice branch can: no expert axis.
TWO_SLICES = {"cluster_nodepool_count": 2, "ici_expert_parallelism": 1}
SLICE_KEYS = ("num_trainer_slices", "num_samplers_slices")


def problems_for(conf: dict, **overrides) -> dict[str, str]:
    with pytest.raises(ConfigError) as raised:
        RunConfig.from_params({**conf, **overrides})
    return {p.field: str(p) for p in raised.value.problems}


def train_args(config: RunConfig, run) -> dict[str, str]:
    return dict(maxtext.train_rl(config, GcsLayout(config, run)).config)


def test_one_slice_keeps_maxtexts_single_slice_branch(tutorial_config, run):
    args = train_args(tutorial_config, run)
    assert not set(SLICE_KEYS) & set(args)
    assert (args["trainer_devices_fraction"], args["sampler_devices_fraction"]) == ("0.5", "0.5")
    assert device_split(args, 1, 64)[0] == "Running on a single slice"


@pytest.mark.parametrize(
    ("overrides", "trainer", "sampler"),
    [
        ({}, "1", "1"),
        ({"cluster_nodepool_count": 4}, "2", "2"),
        (
            {"cluster_nodepool_count": 3, "trainer_devices_fraction": 0.333333, "sampler_devices_fraction": 0.666667},
            "1",
            "2",
        ),
    ],
)
def test_several_slices_give_each_role_whole_slices(tutorial_conf, run, overrides, trainer, sampler):
    config = RunConfig.from_params({**tutorial_conf, **TWO_SLICES, **overrides})
    args = train_args(config, run)
    assert (args["num_trainer_slices"], args["num_samplers_slices"]) == (trainer, sampler)
    assert "dcn_data_parallelism" not in args and "num_slices" not in args  # the branch sets them from the counts
    assert device_split(args, config.cluster_nodepool_count, config.slice.chips) == ["Running with Multislice"]


def test_fractions_that_split_a_slice_are_refused(tutorial_conf):
    found = problems_for(tutorial_conf, **{**TWO_SLICES, "cluster_nodepool_count": 3})
    assert "gives 1.5 of the 3 slices" in found["trainer_devices_fraction"]
    assert "multiple of 1/3" in found["sampler_devices_fraction"]
    found = problems_for(tutorial_conf, **TWO_SLICES, trainer_devices_fraction=0.75, sampler_devices_fraction=0.25)
    assert "gives 0.5 of the 2 slices" in found["sampler_devices_fraction"]


def test_expert_parallelism_is_refused_on_several_slices(tutorial_conf, tutorial_config):
    assert tutorial_config.ici_expert_parallelism == 4  # one slice keeps the tutorial's expert axis
    found = problems_for(tutorial_conf, cluster_nodepool_count=2)
    assert "no expert axis" in found["ici_expert_parallelism"]
    assert "set ici_expert_parallelism to 1" in found["ici_expert_parallelism"]


def test_tensor_parallelism_must_divide_a_slice(tutorial_conf):
    small = {"tpu_type": "v6e-16", "topology": "4x4", "rollout_tensor_parallelism": 4}
    conf = {**TWO_SLICES, **small, "cluster_nodepool_count": 4, "ici_tensor_parallelism": 32}
    found = problems_for(tutorial_conf, **conf)
    assert "32 does not divide the 16 chips of a slice" in found["ici_tensor_parallelism"]


@pytest.mark.parametrize(
    ("extra", "slices", "words"),
    [
        ({"num_samplers_slices": 1}, 1, "sets 'num_samplers_slices'"),
        ({"num_slices": 2}, 2, "sets 'num_slices'"),
        ({"dcn_fsdp_parallelism": 2}, 2, "sets dcn_fsdp_parallelism=2"),
        ({"ici_data_parallelism": 2}, 2, "sets ici_data_parallelism=2"),
        ({"ici_fsdp_parallelism": 8}, 2, "or set it to 16"),
    ],
)
def test_axes_the_branch_sets_or_cannot_lay_are_refused(tutorial_conf, extra, slices, words):
    conf = {**TWO_SLICES, "cluster_nodepool_count": slices, "extra_train_args": extra}
    assert words in problems_for(tutorial_conf, **conf)["extra_train_args"]


def test_axes_the_branch_accepts(tutorial_conf):
    extra = {"dcn_data_parallelism": 2, "ici_fsdp_parallelism": 16, "dcn_fsdp_parallelism": 1}
    RunConfig.from_params({**tutorial_conf, **TWO_SLICES, "extra_train_args": extra})


def test_the_plan_command_refuses_a_trainer_across_a_slice_and_a_half(tmp_path):
    conf = json.loads((REPO / "include/examples/tutorial.json").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**conf, **TWO_SLICES, "cluster_nodepool_count": 3}))
    result = subprocess.run(
        [sys.executable, "-m", "tpu_rl.plan", "--conf", str(bad)], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode != 0 and result.stdout == ""
    assert "trainer_devices_fraction: gives 1.5 of the 3 slices" in result.stderr


# ---------------------------------------------------------------- the emulated trainer's split


def split_failure(args, slices, chips) -> PodFailure:
    with pytest.raises(PodFailure) as failed:
        device_split(args, slices, chips)
    return failed.value


def test_the_single_slice_branch_on_several_slices_fails_as_jax_does(tutorial_config, run):
    """What the package emitted before: two slices, no slice counts; the trainer's half of the devices is one slice
    while its config's num_slices is two (jax mesh_utils.create_hybrid_device_mesh)."""
    args = train_args(tutorial_config, run)
    failure = split_failure(args, 2, 64)
    assert "Number of slices 1 must equal the product of dcn_mesh_shape" in str(failure)
    assert failure.lines[0] == "Running on a single slice"
    assert "Number of slices 2 must equal" in str(split_failure(args, 3, 64))  # a trainer on 1.5 slices


def test_the_single_slice_branch_lays_the_samplers_mesh_with_the_trainers_axes(tutorial_config, run):
    args = {**train_args(tutorial_config, run), "sampler_devices_fraction": "0.375"}
    assert "Unspecified value unable to be determined with the given ICI" in str(split_failure(args, 1, 64))


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"ici_expert_parallelism": "4"}, "Number of devices per slice 64 does not match the product of the ICI"),
        ({"ici_tensor_parallelism": "3"}, "trainer_devices_per_slice (64) must be divisible by tensor parallelism"),
        ({"ici_fsdp_parallelism": "8"}, "ici_fsdp_parallelism (8) * ici_tensor_parallelism (4) must equal"),
        ({"num_samplers_slices": "2"}, "Not enough slices for trainer and samplers"),
        ({"num_samplers_slices": "-1"}, "should be both -1 or positive"),
        ({"dcn_fsdp_parallelism": "2"}, "DCN parallelism requested but only one slice available"),
    ],
)
def test_the_multislice_branch_fails_where_maxtext_does(tutorial_conf, run, change, error):
    args = train_args(RunConfig.from_params({**tutorial_conf, **TWO_SLICES}), run)
    assert error in str(split_failure({**args, **change}, 2, 64))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"cluster_nodepool_count": 2, "ici_expert_parallelism": 1},
        {"cluster_nodepool_count": 6, "ici_expert_parallelism": 1, "ici_tensor_parallelism": 8},
        {"tpu_type": "v6e-16", "topology": "4x4", "cluster_nodepool_count": 2, "ici_expert_parallelism": 1},
        {"tpu_type": "v6e-16", "topology": "4x4", "ici_tensor_parallelism": 2, "ici_expert_parallelism": 2},
    ],
)
def test_what_validation_accepts_the_emulated_trainer_splits(tutorial_conf, run, overrides):
    """The emulator reads the slices from the head's resource manager, as Pathways is told them."""
    config = RunConfig.from_params({**tutorial_conf, "rollout_tensor_parallelism": 4, **overrides})
    head = next(j for j in training_jobset(config, run)["spec"]["replicatedJobs"] if j["name"] != "worker")
    spec = head["template"]["spec"]["template"]["spec"]
    pod = SimpleNamespace(
        spec=SimpleNamespace(
            init_containers=[SimpleNamespace(args=c.get("args")) for c in spec.get("initContainers", [])],
            containers=[SimpleNamespace(args=c.get("args")) for c in spec["containers"]],
        )
    )
    slices = pathways_slices(pod)
    assert slices == (config.cluster_nodepool_count, config.slice.chips)
    device_split(train_args(config, run), *slices)
