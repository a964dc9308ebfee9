"""A run on an Airflow whose triggerer cannot import the package (Cloud Composer 3 with the package in
plugins/), and one whose triggerer has the package but lacks a module its triggers import only when they run
(kubernetes_asyncio): each fails in check_triggerer, before anything billable exists, naming the fix.

The stack's two triggerers are replaced for each run by Airflow's own triggerer started in an interpreter
without ``tpu_rl`` (or without the dependency: tests/e2e/without_package.py), then restored. No other run may
defer meanwhile, so these tests run before every other end-to-end test (marker ``e2e_first``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tpu_rl_testing import SIM_CREATE_CONF, SMALL_SLICE, cluster_or_none, stack_answer

pytestmark = [pytest.mark.e2e, pytest.mark.e2e_first]

DAG_ID = "maxtext_rl_tpu"


def _run_on_a_triggerer_without(airflow, label: str, *without: str):
    """(run id, conf, task instances, the triggerer's log) of one run that a triggerer started by
    tests/e2e/without_package.py (with ``without``, its ``--without`` arguments) had to serve."""
    suffix = uuid.uuid4().hex[:6]
    conf = {
        **SIM_CREATE_CONF,
        **SMALL_SLICE,
        "cluster_name": f"e2e-{label}-{suffix}",
        "gcs_bucket": f"tpu-rl-{label}-{suffix}",
    }
    airflow.script("stop", "triggerer", "triggerer-2")
    log = Path(stack_answer("state")) / f"triggerer-{label}.log"
    script = ("exec", "python", "tests/e2e/without_package.py", *without, "triggerer")
    triggerer = airflow.script(*script, background=True, log=log)
    try:
        run_id = airflow.trigger(DAG_ID, conf, run_id=f"e2e__{label}__{suffix}")
        state = airflow.wait_for_run(DAG_ID, run_id, 600)
        assert state == "failed"
        return run_id, conf, airflow.task_instances(DAG_ID, run_id), log.read_text()
    finally:
        os.killpg(triggerer.pid, signal.SIGTERM)  # the triggerer and its trigger runner
        try:
            triggerer.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(triggerer.pid, signal.SIGKILL)
        airflow.script("start")


@pytest.fixture(scope="module")
def failed_run(airflow):
    """The run that a triggerer without the package had to serve."""
    return _run_on_a_triggerer_without(airflow, "notrig")


@pytest.fixture(scope="module")
def run_without_a_dependency(airflow):
    """The run that a triggerer with the package and without kubernetes_asyncio had to serve."""
    return _run_on_a_triggerer_without(airflow, "nodep", "--without", "kubernetes_asyncio")


def _check_triggerer_log(airflow, run_id: str, tasks: dict) -> str:
    """check_triggerer's log, once its failure is known to be its own (AirflowFailException, never retried)."""
    check = tasks["check_triggerer"]
    assert check["state"] == "failed"
    # An attempt before it may have been ended by Airflow's race on a trigger that fires at once (the deferral's
    # executor event processed after the task was queued again: the scheduler logs a "state mismatch" and
    # retries); that is the only retry allowed.
    races = airflow.request(
        "GET", f"/api/v2/eventLogs?dag_id={DAG_ID}&run_id={run_id}&task_id=check_triggerer&event=state%20mismatch"
    )["total_entries"]
    assert check["try_number"] == 1 + races
    return airflow.task_log(DAG_ID, run_id, "check_triggerer", check["try_number"])


def _nothing_billable(conf: dict, tasks: dict, gke, gcs) -> None:
    for task in ("guard", "ensure_bucket", "create_cluster", "create_tpu_pools", "delete_cluster"):
        assert tasks[task]["state"] in (None, "upstream_failed"), (task, tasks[task]["state"])
    assert gcs.lookup_bucket(conf["gcs_bucket"]) is None
    assert cluster_or_none(gke, conf["cluster_name"]) is None


def test_the_run_fails_in_check_triggerer_naming_the_fix(airflow, failed_run):
    run_id, _, tasks, triggerer_log = failed_run
    log = _check_triggerer_log(airflow, run_id, tasks)
    assert "No module named 'tpu_rl'" in log
    assert "install the distribution tpu-rl" in log and "Nothing was created" in log
    assert "Trigger failed to load code" in triggerer_log  # the triggerer really tried, and could not


def test_nothing_billable_was_created(failed_run, gke, gcs):
    _, conf, tasks, _ = failed_run
    _nothing_billable(conf, tasks, gke, gcs)


def test_a_dependency_the_triggers_import_later_fails_the_run_in_check_triggerer(airflow, run_without_a_dependency):
    """The package's trigger modules import without kubernetes_asyncio; the JobSet wait, hours later, would not."""
    run_id, _, tasks, _ = run_without_a_dependency
    log = _check_triggerer_log(airflow, run_id, tasks)
    assert "kubernetes_asyncio.client (ModuleNotFoundError: No module named 'kubernetes_asyncio')" in log
    assert "install tpu-rl with its dependencies" in log and "Nothing was created" in log


def test_nothing_billable_was_created_without_the_dependency(run_without_a_dependency, gke, gcs):
    _, conf, tasks, _ = run_without_a_dependency
    _nothing_billable(conf, tasks, gke, gcs)
