"""check_triggerer: the run's one deferral before anything billable, and what it says when the triggerer
cannot run the package's trigger, runs none, or runs another version."""

from __future__ import annotations

import asyncio

import pytest

import tpu_rl
from tpu_rl.compat import AirflowFailException, TaskDeferred
from tpu_rl.operators.setup import TriggererCheckOperator
from tpu_rl.triggers.triggerer import TriggererCheckTrigger

# What the triggerer hands back (Trigger.submit_failure) when it cannot import the trigger's classpath.
MISSING = {
    "error": "Trigger failure",
    "traceback": [
        "Traceback (most recent call last):\n",
        '  File ".../airflow/jobs/triggerer_job_runner.py", line 1340, in create_triggers\n',
        "ModuleNotFoundError: No module named 'tpu_rl'\n",
    ],
}


def _operator() -> TriggererCheckOperator:
    return TriggererCheckOperator(task_id="check_triggerer")


def test_defers_on_the_packages_own_trigger_which_reports_the_triggerers_version():
    with pytest.raises(TaskDeferred) as deferred:
        _operator().execute({})
    trigger = deferred.value.trigger
    assert type(trigger) is TriggererCheckTrigger
    assert trigger.serialize() == (
        "tpu_rl.triggers.triggerer.TriggererCheckTrigger",
        {"sent_by": tpu_rl.__version__, "hold_seconds": 10.0},
    )

    async def first_event():
        return await anext(TriggererCheckTrigger(sent_by="x", hold_seconds=0).run())

    assert asyncio.run(first_event()).payload["version"] == tpu_rl.__version__


def test_a_triggerer_without_the_package_fails_the_run_naming_the_fix():
    """AirflowFailException: the task's retries (for Airflow's race on a quick trigger) are not spent on it."""
    with pytest.raises(AirflowFailException) as failed:
        _operator().resume_execution("__fail__", MISSING, {})
    message = str(failed.value)
    assert "No module named 'tpu_rl'" in message
    assert "install the distribution tpu-rl" in message and "custom PyPI package" in message
    assert "Nothing was created" in message


def test_no_triggerer_at_all_fails_it_at_the_timeout_naming_the_triggerer():
    with pytest.raises(AirflowFailException, match="needs a running triggerer"):
        _operator().resume_execution("__fail__", {"error": "Trigger timeout"}, {})


def _event(**changes) -> dict:
    v = tpu_rl.__version__
    return {"version": v, "deferred_by": v, "host": "triggerer-1", "imported": ["aiohttp"], "failed": [], **changes}


def test_a_triggerer_of_another_version_than_the_deferring_worker_fails_it():
    """The comparison is with the version that deferred (the event names it), not with the worker that resumes."""
    with pytest.raises(AirflowFailException, match="runs tpu-rl 9.9.9, the worker that deferred this task 0.0.1"):
        _operator().execute_complete({}, _event(version="9.9.9", deferred_by="0.0.1"))
    with pytest.raises(AirflowFailException, match=f"runs tpu-rl {tpu_rl.__version__}, the worker that deferred"):
        _operator().execute_complete({}, _event(deferred_by="0.0.1"))  # triggerer and resuming worker agree
    _operator().execute_complete({}, _event())


def test_an_event_of_the_2_4_0_trigger_is_compared_with_this_worker():
    """A triggerer still on 2.4.0 sends neither the deferring version nor its imports."""
    with pytest.raises(
        AirflowFailException, match=f"runs tpu-rl 2.4.0, the worker that deferred this task {tpu_rl.__version__}"
    ):
        _operator().execute_complete({}, {"version": "2.4.0", "host": "triggerer-1"})
    _operator().execute_complete({}, {"version": tpu_rl.__version__, "host": "triggerer-1"})


def test_a_module_the_triggers_need_that_the_triggerer_cannot_import_fails_the_run_naming_it():
    error = "ModuleNotFoundError: No module named 'kubernetes_asyncio'"
    with pytest.raises(AirflowFailException) as failed:
        _operator().execute_complete({}, _event(failed=[{"module": "kubernetes_asyncio.client", "error": error}]))
    message = str(failed.value)
    assert f"kubernetes_asyncio.client ({error})" in message
    assert "install tpu-rl with its dependencies" in message and "Nothing was created" in message
