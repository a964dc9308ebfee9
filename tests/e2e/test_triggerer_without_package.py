"""A run on an Airflow whose triggerer cannot import the package (Cloud Composer 3 with the package in
plugins/): it fails in check_triggerer, before anything billable exists, naming the fix.

The stack's two triggerers are replaced for this one run by Airflow's own triggerer started in an interpreter
without ``tpu_rl`` (tests/e2e/without_package.py), then restored. No other run may defer meanwhile, so
these tests run before every other end-to-end test (marker ``e2e_first``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid

import pytest

from tpu_rl_testing import REPO, SIM_CREATE_CONF, SMALL_SLICE, cluster_or_none

pytestmark = [pytest.mark.e2e, pytest.mark.e2e_first]

DAG_ID = "maxtext_rl_tpu"


@pytest.fixture(scope="module")
def failed_run(airflow):
    """(run id, conf, task instances) of one run that the triggerer without the package had to serve."""
    suffix = uuid.uuid4().hex[:6]
    conf = {
        **SIM_CREATE_CONF,
        **SMALL_SLICE,
        "cluster_name": f"e2e-notrig-{suffix}",
        "gcs_bucket": f"tpu-rl-notrig-{suffix}",
    }
    airflow.script("stop", "triggerer", "triggerer-2")
    log = REPO / ".airflow" / "stack" / "triggerer-without-package.log"
    triggerer = airflow.script("exec", "python", "tests/e2e/without_package.py", "triggerer", background=True, log=log)
    try:
        run_id = airflow.trigger(DAG_ID, conf, run_id=f"e2e__notrig__{suffix}")
        state = airflow.wait_for_run(DAG_ID, run_id, 600)
        assert state == "failed"
        yield run_id, conf, airflow.task_instances(DAG_ID, run_id), log.read_text()
    finally:
        os.killpg(triggerer.pid, signal.SIGTERM)  # the triggerer and its trigger runner
        try:
            triggerer.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(triggerer.pid, signal.SIGKILL)
        airflow.script("start")


def test_the_run_fails_in_check_triggerer_naming_the_fix(airflow, failed_run):
    run_id, _, tasks, triggerer_log = failed_run
    check = tasks["check_triggerer"]
    assert check["state"] == "failed"
    # Its own failure (AirflowFailException) is never retried. An attempt before it may have been ended by
    # Airflow's race on a trigger that fails at once (the deferral's executor event processed after the task
    # was queued again: the scheduler logs a "state mismatch" and retries); that is the only retry allowed.
    races = airflow.request(
        "GET", f"/api/v2/eventLogs?dag_id={DAG_ID}&run_id={run_id}&task_id=check_triggerer&event=state%20mismatch"
    )["total_entries"]
    assert check["try_number"] == 1 + races
    log = airflow.task_log(DAG_ID, run_id, "check_triggerer", check["try_number"])
    assert "No module named 'tpu_rl'" in log
    assert "install the distribution tpu-rl" in log and "Nothing was created" in log
    assert "Trigger failed to load code" in triggerer_log  # the triggerer really tried, and could not


def test_nothing_billable_was_created(failed_run, gke, gcs):
    _, conf, tasks, _ = failed_run
    for task in ("guard", "ensure_bucket", "create_cluster", "create_tpu_pools", "delete_cluster"):
        assert tasks[task]["state"] in (None, "upstream_failed"), (task, tasks[task]["state"])
    assert gcs.lookup_bucket(conf["gcs_bucket"]) is None
    assert cluster_or_none(gke, conf["cluster_name"]) is None
