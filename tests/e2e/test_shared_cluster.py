"""cluster_mode=shared with manual runs of the pipeline: the cluster stays up until the last run using it
ends, whichever ends first (the run that created it, or the one that joined), and cluster_mode=create is
refused on a cluster that shared runs use (tests/gke has the refusal on a cluster another live run created).
The scenario starts with its module's first test and goes on beside the tests after it; a test ordered last
(``e2e_last``, see conftest.py) checks it."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from scripts.local_airflow import stage_table
from sim import faults
from tpu_rl.run import RunIdentity
from tpu_rl_testing import SIM_CREATE_CONF, SMALL_SLICE, cluster_or_none

pytestmark = pytest.mark.e2e

DAG_ID = "maxtext_rl_tpu"
RUN_TIMEOUT = 1200
#: The held run's training lasts this long, so that it likely ends after the other run.
HELD_SECONDS = 150


def wait_for_task(airflow, run_id: str, task_id: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while airflow.task_instances(DAG_ID, run_id)[task_id]["state"] != "success":
        assert time.monotonic() < deadline, stage_table(airflow.task_instances(DAG_ID, run_id))
        time.sleep(3)


def hold_training(api, run_id: str) -> str:
    """Sets a rule holding the training of a run for HELD_SECONDS; returns the rule's name."""
    name = f"e2e-shared-hold-{uuid.uuid4().hex[:6]}"
    jobset = RunIdentity(DAG_ID, run_id).jobset_name("qwen", "train")
    faults.set_fault(api, name, prefix=jobset, stage="train_rl", run_seconds=HELD_SECONDS)
    return name


@pytest.fixture(scope="session")
def shared_runs(airflow_stack, session_gke):
    """The scenario, started by the module's first test: its runs create their own clusters and mostly wait, so
    they go on while the tests after it run.

    Two clusters at once: on the first the creator's training is held, on the second the joiner's, so that each
    order of ending is likely. The creators are triggered here; a thread triggers each joiner once its creator
    has made the cluster, then a run in create mode on the first cluster (the intruder), and watches which run
    of each pair ends first. Yields ({order: (conf, creator, joiner)}, the intruder's run id, the thread's future
    of :func:`first_to_end`). Removes its rules at the end."""
    airflow_stack.wait_for_healthy_dag(DAG_ID)
    airflow_stack.unpause(DAG_ID)
    api, rules, token = faults.core_api(), [], uuid.uuid4().hex[:6]
    scenarios = {}
    try:
        for order in ("creator-held", "joiner-held"):
            conf = {
                **SIM_CREATE_CONF,
                **SMALL_SLICE,
                "cluster_mode": "shared",
                "cluster_name": f"tpu-rl-sh-{order[0]}-{token}",
            }
            creator, joiner = (f"e2e__shared__{order}__{role}__{token}" for role in ("creator", "joiner"))
            rules.append(hold_training(api, creator if order == "creator-held" else joiner))
            airflow_stack.trigger(DAG_ID, conf, run_id=creator)
            scenarios[order] = (conf, creator, joiner)
        intruder = f"e2e__shared__intruder__{token}"
        with ThreadPoolExecutor(1, thread_name_prefix="e2e-shared-cluster") as thread:
            ending = thread.submit(join_then_watch, airflow_stack, session_gke, scenarios, intruder)
            yield scenarios, intruder, ending
    finally:
        for name in rules:
            faults.clear_faults(api, name)


def join_then_watch(airflow, gke, scenarios: dict, intruder: str) -> dict[str, tuple[str, str]]:
    for conf, creator, joiner in scenarios.values():
        wait_for_task(airflow, creator, "create_cluster")
        airflow.trigger(DAG_ID, conf, run_id=joiner)
    # A run in create mode with the name of a shared cluster, while its (held) creator uses it: refused.
    airflow.trigger(DAG_ID, {**scenarios["creator-held"][0], "cluster_mode": "create"}, run_id=intruder)
    return first_to_end(airflow, gke, scenarios)


def first_to_end(airflow, gke, scenarios: dict, timeout: float = RUN_TIMEOUT) -> dict[str, tuple[str, str]]:
    """For each scenario (conf, run, run): the run that reaches a final state first and the one still going at
    that moment; the shared cluster is checked to be there at that moment, while the other still uses it."""
    found, deadline = {}, time.monotonic() + timeout
    while len(found) < len(scenarios):
        assert time.monotonic() < deadline, f"not every scenario had a run ending in {timeout:.0f} s: {found}"
        for order, (conf, *run_ids) in scenarios.items():
            if order in found:
                continue
            states = {run_id: airflow.run(DAG_ID, run_id)["state"] for run_id in run_ids}
            ended = [run_id for run_id, state in states.items() if state in ("success", "failed")]
            if ended:
                assert len(ended) == 1, f"{order}: both runs ended between two polls: {states}"
                assert cluster_or_none(gke, conf["cluster_name"]) is not None, f"{order}: gone with {ended[0]}"
                found[order] = (ended[0], next(r for r in run_ids if r != ended[0]))
        time.sleep(2)
    return found


def test_the_creators_are_triggered(airflow, shared_runs):
    scenarios, _, _ = shared_runs
    for _, creator, _ in scenarios.values():
        assert airflow.run(DAG_ID, creator)["state"] in ("queued", "running", "success", "failed")


@pytest.mark.e2e_last
def test_a_shared_cluster_stays_until_the_last_run_ends_in_either_order(airflow, gke, shared_runs):
    scenarios, intruder, ending = shared_runs
    shared_conf = scenarios["creator-held"][0]
    for order, (first, last) in ending.result().items():  # (the thread's own waits have deadlines)
        conf = scenarios[order][0]
        assert airflow.run(DAG_ID, first)["state"] == "success", stage_table(airflow.task_instances(DAG_ID, first))
        # The first run to end left the cluster to the other, which still used it.
        log = airflow.task_log(
            DAG_ID, first, "delete_cluster", airflow.task_instances(DAG_ID, first)["delete_cluster"]["try_number"]
        )
        assert f"Shared cluster {conf['cluster_name']} stays: still used by {DAG_ID} / {last}" in log, log[-2000:]
        # The last one deletes it.
        assert airflow.wait_for_run(DAG_ID, last, RUN_TIMEOUT) == "success", stage_table(
            airflow.task_instances(DAG_ID, last)
        )
        assert cluster_or_none(gke, conf["cluster_name"]) is None, order
        log = airflow.task_log(
            DAG_ID, last, "delete_cluster", airflow.task_instances(DAG_ID, last)["delete_cluster"]["try_number"]
        )
        assert f"shared cluster {conf['cluster_name']}'s lease" in log and "deleting the cluster" in log, log[-2000:]

    assert airflow.wait_for_run(DAG_ID, intruder, RUN_TIMEOUT) == "failed"
    tasks = airflow.task_instances(DAG_ID, intruder)
    assert tasks["create_cluster"]["state"] == "failed" and tasks["create_cluster"]["try_number"] == 1
    log = airflow.task_log(DAG_ID, intruder, "create_cluster", 1)
    assert (
        f"cluster {shared_conf['cluster_name']} is shared by runs in cluster_mode 'shared'" in log
        and "fix: set cluster_mode to 'shared'" in log
    ), log[-2000:]
    assert tasks["delete_cluster"]["state"] == "success"  # its teardown left the shared cluster to its runs
