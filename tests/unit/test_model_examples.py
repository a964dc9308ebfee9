"""The example confs of "Run another model" (docs/how-to/models.md): one for each model validation accepts, each
planned by the plan command as a user runs it, and the page naming exactly those files."""

import dataclasses
import json
import math
import re

import pytest
import yaml

from tpu_rl import plan
from tpu_rl.config import RunConfig
from tpu_rl.config_rules import SUPPORTED_MODELS
from tpu_rl_testing import REPO

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

EXAMPLES = REPO / "include/examples/models"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.json"))
PAGE = REPO / "docs/how-to/models.md"
#: How the page names an example file: its path from the repository root.
EXAMPLE_PATH = re.compile(r"include/examples/models/([\w.-]+\.json)")


def _conf(path) -> dict:
    return json.loads(path.read_text())


def _default(name: str):
    return next(f.default for f in dataclasses.fields(RunConfig) if f.name == name)


def _strings(node) -> list[str]:
    """Every string in a plan document (commands, arguments, names), to find what a JobSet runs."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return []


def _jobset(docs: list[dict], stage: str) -> dict:
    """The JobSet of one stage (hf2mt, train, mt2hf): its name is <workload_prefix>-<stage>-<run key>."""
    [jobset] = [d for d in docs if d.get("kind") == "JobSet" and d["metadata"]["name"].split("-")[1] == stage]
    return jobset


def _pod_specs(jobset: dict) -> list[dict]:
    return [job["template"]["spec"]["template"]["spec"] for job in jobset["spec"]["replicatedJobs"]]


def _planned(path, capsys) -> list[dict]:
    """What ``python -m tpu_rl.plan --conf <path>`` prints, as YAML documents; fails with its message if it refuses."""
    code = plan.main(["--conf", str(path)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    return [doc for doc in yaml.safe_load_all(printed.out) if doc]


def test_every_supported_model_has_exactly_one_example_named_after_it():
    models = [_conf(path)["model_name"] for path in EXAMPLE_FILES]
    assert sorted(models) == sorted(SUPPORTED_MODELS)
    assert [path.stem for path in EXAMPLE_FILES] == [_conf(path)["model_name"] for path in EXAMPLE_FILES]


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda path: path.stem)
def test_each_example_plans_its_checkpoint_on_the_slice_it_asks_for(path, capsys):
    conf = _conf(path)
    docs = _planned(path, capsys)

    chips = math.prod(int(side) for side in conf["topology"].split("x"))
    chips_per_host = int(re.fullmatch(r"ct6e-standard-(\d+)t", conf["compute_type"]).group(1))
    assert int(conf["tpu_type"].removeprefix("v6e-")) == chips  # v6e sizes count chips
    pools = [d["nodePool"] for d in docs if d.get("gkeRequest") == "CreateNodePool"]
    assert len(pools) == conf["cluster_nodepool_count"]
    for pool in pools:
        assert pool["config"]["machine_type"] == conf["compute_type"]
        assert pool["placement_policy"]["tpu_topology"] == conf["topology"]
        assert pool["initial_node_count"] == chips // chips_per_host

    training = " ".join(_strings(_jobset(docs, "train")))
    assert f"model_name={conf['model_name']} " in training
    assert f"tokenizer_path={conf['tokenizer_path']} " in training

    conversion = _jobset(docs, "hf2mt")
    assert f"--hf_model_path={conf['hf_model_path']}" in " ".join(_strings(conversion))
    [pod] = _pod_specs(conversion)
    assert {c["resources"]["requests"]["memory"] for c in pod["containers"]} == {conf["conversion_memory"]}
    [cluster] = [d["cluster"] for d in docs if d.get("gkeRequest") == "CreateCluster"]
    machines = {pool["name"]: pool["config"]["machine_type"] for pool in cluster["node_pools"]}
    cpu_machine = conf.get("pw_cpu_machine_type", _default("pw_cpu_machine_type"))
    assert machines[pod["nodeSelector"]["cloud.google.com/gke-nodepool"]] == cpu_machine


def test_the_models_page_has_one_row_for_each_example_and_names_no_other():
    """The page's table cannot drift from the files: a row for each, with its model, checkpoint and slice."""
    text = PAGE.read_text()
    assert sorted(set(EXAMPLE_PATH.findall(text))) == [path.name for path in EXAMPLE_FILES]
    rows = [line for line in text.splitlines() if line.startswith("|") and EXAMPLE_PATH.search(line)]
    assert sorted(name for row in rows for name in EXAMPLE_PATH.findall(row)) == [path.name for path in EXAMPLE_FILES]
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        [name] = EXAMPLE_PATH.findall(cells[-1])
        conf = _conf(EXAMPLES / name)
        count, slice_ = conf["cluster_nodepool_count"], f"{conf['tpu_type']} ({conf['topology']})"
        assert cells[:2] == [f"`{conf['model_name']}`", f"`{conf['hf_model_path']}`"], row
        assert cells[2].startswith(slice_ if count == 1 else f"{count} x {slice_}"), row
