"""A recurring program from the shipped example (include/examples/programs.yaml) backfilled as users do it:
the Airflow CLI on the local stack, the scheduler and the triggerer, the GKE emulator and the simulated TPU
cluster.

Three daily intervals with capacity for one slice, in a shared cluster: the trainings run one at a time,
the base checkpoint is converted once, each interval has its own outputs and Asset event, and the cluster is
created once and deleted by the last run to leave. The program's first capacity candidate, on demand in
us-east5-b, is stocked out the whole time (a GKE emulator fault on the cluster): every interval trains on its
second, in us-east5-a, and the nightly schedule holds. One interval's training crashes (a sim fault on its
JobSet, every try); a second backfill with ``--reprocess-behavior failed`` runs only that interval again,
which resumes from its last checkpoint.

The backfill starts at the start of the e2e session (a test marked ``e2e_start``); a thread waits for its
intervals and starts the second backfill as soon as they end. A test ordered last (``e2e_last``, see conftest.py)
checks both: their runs go on while the other scenarios run on the same stack (their own clusters, bucket prefixes
and capacity).
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from scripts.local_airflow import stage_table
from sim import faults, gke_faults
from tpu_rl.config import RunConfig
from tpu_rl.programs import load_programs
from tpu_rl.run import RunIdentity
from tpu_rl_testing import REPO, SMALL_SLICE, cluster_or_none

pytestmark = pytest.mark.e2e

PROGRAM = "maxtext_rl_tpu_daily"
#: The shipped example's declaration (include/examples/programs.yaml), which the stack's DAG file reads.
DECLARED = next(p for p in load_programs(REPO / "include/examples/programs.yaml") if p.dag_id == PROGRAM)
PROGRAM_START, PROGRAM_END = DECLARED.start_date.date(), DECLARED.end_date.date()
EXAMPLES_PER_INTERVAL = 200
TOKEN = uuid.uuid4().hex[:6]
CLUSTER = f"tpu-rl-bf-{TOKEN}"
CONF = {**SMALL_SLICE, "cluster_name": CLUSTER, "gcs_bucket": f"tpu-rl-bf-{TOKEN}", "capacity_group": f"bf-{TOKEN}"}
RUN_TIMEOUT = 2400
FAILING = 1  # the index (in the backfill) of the interval whose training crashes
#: The GKE emulator's fault rule: the program's first capacity candidate has no capacity.
STOCKOUT = f"e2e-backfill-stockout-{TOKEN}"


def stack_cli(*args: str) -> str:
    done = subprocess.run(["scripts/airflow-stack.sh", "cli", *args], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@functools.cache
def days() -> list[datetime]:
    """The three latest complete intervals the program schedules (its end_date is the last interval with its
    prompts): unpausing the program then creates no other run (the scheduler's next interval is the latest,
    already in the backfill). Fixed at the first call: a session that goes past midnight UTC checks the
    intervals it backfilled."""
    last = min(datetime.now(UTC).date() - timedelta(days=1), PROGRAM_END)
    return [datetime.combine(last - timedelta(days=n), datetime.min.time(), UTC) for n in (2, 1, 0)]


def interval_run(day: datetime) -> RunIdentity:
    return RunIdentity(PROGRAM, f"backfill__{day.isoformat()}", day.isoformat())


def backfill(airflow, reprocess: str) -> dict:
    first, last = days()[0], days()[-1]
    stack_cli(
        "backfill",
        "create",
        "--dag-id",
        PROGRAM,
        "--from-date",
        f"{first:%Y-%m-%d}",
        "--to-date",
        f"{last:%Y-%m-%d}",
        "--max-active-runs",
        "3",
        "--reprocess-behavior",
        reprocess,
        "--dag-run-conf",
        json.dumps(CONF),
    )
    backfills = airflow.request("GET", f"/api/v2/backfills?dag_id={PROGRAM}&limit=100")["backfills"]
    return max(backfills, key=lambda b: b["id"])


def runs_by_day(airflow) -> dict[datetime, dict]:
    body = airflow.request("GET", f"/api/v2/dags/{PROGRAM}/dagRuns?limit=100")
    return {datetime.fromisoformat(r["logical_date"].replace("Z", "+00:00")): r for r in body["dag_runs"]}


def wait_for_days(airflow) -> dict[datetime, str]:
    runs = runs_by_day(airflow)
    return {day: airflow.wait_for_run(PROGRAM, runs[day]["dag_run_id"], RUN_TIMEOUT) for day in days()}


def assert_trained_on_its_slice(airflow, run_id: str, tasks: dict, day: datetime) -> None:
    """The trainer's log names the split of the program's data (train[{first}:{stop}]) of the interval."""
    index = (day.date() - PROGRAM_START).days
    log = airflow.task_log(PROGRAM, run_id, "train_rl", tasks["train_rl"]["try_number"])
    split = f"train[{index * EXAMPLES_PER_INTERVAL}:{(index + 1) * EXAMPLES_PER_INTERVAL}]"
    assert f"Loaded Hugging Face dataset openai/gsm8k with split {split}" in log, log[-3000:]


def slice_span(tasks: dict) -> tuple[datetime, datetime]:
    """From the capacity taken (create_tpu_pools starts) to the slice deleted (delete_tpu_pools ends)."""
    return (
        datetime.fromisoformat(tasks["create_tpu_pools"]["start_date"]),
        datetime.fromisoformat(tasks["delete_tpu_pools"]["end_date"]),
    )


def interval_events(airflow) -> dict[str, dict]:
    """This module's Asset events by interval start: {data_interval_start: extra}."""
    events = airflow.request("GET", "/api/v2/assets/events?limit=100&order_by=-timestamp")["asset_events"]
    ours = f"gs://{CONF['gcs_bucket']}/"  # (a reused stack keeps earlier sessions' events)
    return {
        e["extra"]["data_interval_start"]: e["extra"]
        for e in events
        if e["source_dag_id"] == PROGRAM and e["extra"]["uri"].startswith(ours)
    }


def cluster_creates(gke) -> int:
    operations = gke.list_operations(parent="projects/tpu-rl-sim/locations/us-east5").operations
    return sum(
        op.operation_type.name == "CREATE_CLUSTER" and op.target_link.endswith(f"/clusters/{CLUSTER}")
        for op in operations
    )


@dataclass
class Backfilled:
    """The first backfill as it ended (what the second one then changes), and the second one."""

    states: dict[datetime, str]
    runs: dict[datetime, dict]
    tasks: dict[datetime, dict]
    events: dict[str, dict]
    cluster_creates: int
    cluster_left: object
    completed: bool = False
    second: dict | None = None
    redone_state: str | None = None


def wait_for_completed(airflow, backfill: dict, timeout: float = 120) -> bool:
    """Whether Airflow marks the backfill completed within ``timeout`` seconds (its last run has ended)."""
    deadline = time.monotonic() + timeout
    while not airflow.request("GET", f"/api/v2/backfills/{backfill['id']}")["completed_at"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(5)
    return True


def first_then_failed_again(airflow, gke, first_backfill: dict) -> Backfilled:
    """Waits for the first backfill's intervals, records them, then (if the crashing interval failed as meant, once
    Airflow marks the backfill completed) removes its fault and backfills again with ``--reprocess-behavior
    failed``, waiting for the rerun interval.
    Run in a thread from the start of the session, so the rerun goes on while the other tests run."""
    states = wait_for_days(airflow)
    runs = runs_by_day(airflow)
    first = Backfilled(
        states=states,
        runs=runs,
        tasks={day: airflow.task_instances(PROGRAM, runs[day]["dag_run_id"]) for day in days()},
        events=interval_events(airflow),
        cluster_creates=cluster_creates(gke),
        cluster_left=cluster_or_none(gke, CLUSTER),
    )
    failing = days()[FAILING]
    if states[failing] != "failed":
        return first  # (the check fails on the states)
    # Airflow refuses a second backfill of the DAG until the scheduler marks the first one completed.
    first.completed = wait_for_completed(airflow, first_backfill)
    if not first.completed:
        return first
    faults.clear_faults(faults.core_api(), f"e2e-backfill-{TOKEN}")
    first.second = backfill(airflow, "failed")
    first.redone_state = airflow.wait_for_run(PROGRAM, runs[failing]["dag_run_id"], RUN_TIMEOUT)
    return first


@pytest.fixture(scope="session")
def program_backfill(airflow_stack, session_gke):
    """Starts the first backfill (the DAG paused: nothing runs until it is unpaused, after the fault is set),
    and the thread of :func:`first_then_failed_again`. Yields (the first backfill, the thread's future)."""
    airflow = airflow_stack.client
    airflow_stack.wait_for_healthy_dag(PROGRAM)
    # What an earlier session on this database left: a backfill it did not see end would refuse the new one.
    for earlier in airflow.request("GET", f"/api/v2/backfills?dag_id={PROGRAM}&limit=100")["backfills"]:
        if not earlier["completed_at"]:
            airflow.request("PUT", f"/api/v2/backfills/{earlier['id']}/cancel")
    for run in airflow.request("GET", f"/api/v2/dags/{PROGRAM}/dagRuns?limit=100")["dag_runs"]:
        airflow.request("DELETE", f"/api/v2/dags/{PROGRAM}/dagRuns/{run['dag_run_id']}")
    api = faults.core_api()
    crashing = interval_run(days()[FAILING]).jobset_name("qwen", "train")
    faults.set_fault(
        api, f"e2e-backfill-{TOKEN}", prefix=crashing, stage="train_rl", maxtext_fault="crash-at-step=3", exit_code=3
    )
    # (TPU hosts only: the cluster's CPU pools in that zone are created as usual)
    gke_faults.set_fault(
        STOCKOUT,
        "stockout",
        cluster=CLUSTER,
        zone="us-east5-b",
        capacity_type="on_demand",
        machine_type=RunConfig.from_params({**DECLARED.params, **CONF}).compute_type,
    )
    try:
        created = backfill(airflow, "none")
        airflow.unpause(PROGRAM)
        with ThreadPoolExecutor(1, thread_name_prefix="e2e-backfill") as thread:
            yield created, thread.submit(first_then_failed_again, airflow, session_gke, created)
    finally:
        faults.clear_faults(api, f"e2e-backfill-{TOKEN}")
        gke_faults.clear_faults(STOCKOUT)
        airflow.request("PATCH", f"/api/v2/dags/{PROGRAM}", {"is_paused": True})


@pytest.mark.e2e_start
def test_the_backfill_is_created_from_the_cli_with_one_run_per_interval(program_backfill, airflow):
    created, _ = program_backfill
    runs = runs_by_day(airflow)
    assert set(days()) <= set(runs)
    assert {runs[day]["run_type"] for day in days()} == {"backfill"}
    assert created["max_active_runs"] == 3 and created["dag_id"] == PROGRAM


@pytest.mark.e2e_last
def test_a_backfill_trains_one_interval_at_a_time_and_reprocessing_failed_resumes_only_the_failed_one(
    program_backfill, airflow, gke, gcs
):
    created, backfilled = program_backfill
    first = backfilled.result()  # (the thread's waits have deadlines)
    runs, tasks, failing = first.runs, first.tasks, days()[FAILING]
    detail = "\n".join(f"{day:%Y-%m-%d}\n{stage_table(tasks[day])}" for day in days())
    assert first.states == {day: "failed" if day == failing else "success" for day in days()}, detail
    assert tasks[failing]["train_rl"]["state"] == "failed", detail

    # Each interval's slice came from the program's second candidate, the first stocked out.
    for day in days():
        capacity = airflow.xcom(PROGRAM, runs[day]["dag_run_id"], "create_tpu_pools", "capacity")
        assert capacity["serving"] == 1, (day, capacity)
        assert [(a["candidate"], a["outcome"]) for a in capacity["attempts"]] == [(0, "stockout")], (day, capacity)
        assert capacity["lines"][1] == "candidate 1 (on_demand in us-east5-a): the slices came from it", capacity
    # Capacity 1: the slices' lifetimes never overlap.
    spans = sorted(slice_span(tasks[day]) for day in days())
    assert all(earlier[1] <= later[0] for earlier, later in pairwise(spans)), spans
    # The base checkpoint is converted by one run; the others find it (skipped).
    assert sorted(tasks[day]["hf_to_maxtext"]["state"] for day in days()) == ["skipped", "skipped", "success"]

    # Each interval trains on its own slice of the data, into its own folder; the export and Asset event
    # are the interval's.
    for day in days():
        if day != failing:  # (a crashed trainer's log shows only its error)
            assert_trained_on_its_slice(airflow, runs[day]["dag_run_id"], tasks[day], day)
    for day in days():
        if day == failing:
            assert day.isoformat() not in first.events
            continue
        published = airflow.xcom(PROGRAM, runs[day]["dag_run_id"], "publish_export")
        assert interval_run(day).slug in published and first.events[day.isoformat()]["uri"] == published

    # The shared cluster: created by one run, kept while others held it, deleted by the last to leave.
    assert first.cluster_creates == 1
    assert first.cluster_left is None
    leaving = {
        day: airflow.task_log(
            PROGRAM, runs[day]["dag_run_id"], "delete_cluster", tasks[day]["delete_cluster"]["try_number"]
        )
        for day in days()
    }
    # (only this cluster's lines: a reused stack appends a rerun's logs to an earlier session's file)
    assert sum(f"shared cluster {CLUSTER}'s lease" in log for log in leaving.values()) == 1, leaving
    assert sum(f"Shared cluster {CLUSTER} stays" in log for log in leaving.values()) == 2, leaving

    assert first.completed, "the backfill is not marked completed 120 s after its last run ended"
    # A second backfill reprocessing failed intervals runs that interval only, and its training resumes from
    # the checkpoint of step 2 the crashed one kept.
    second = airflow.request("GET", f"/api/v2/backfills/{first.second['id']}")
    assert second["id"] != created["id"]
    again = airflow.task_instances(PROGRAM, runs[failing]["dag_run_id"])
    assert first.redone_state == "success", stage_table(again)
    for day in days():
        if day != failing:  # completed intervals are left alone
            assert airflow.run(PROGRAM, runs[day]["dag_run_id"])["end_date"] == runs[day]["end_date"]
    log = airflow.task_log(PROGRAM, runs[failing]["dag_run_id"], "train_rl", again["train_rl"]["try_number"])
    assert "Restored params from step: 2 in " in log, log[-3000:]
    assert_trained_on_its_slice(airflow, runs[failing]["dag_run_id"], again, failing)
    actor = f"qwen3-30b-a3b/trained/{interval_run(failing).slug}/rl/checkpoints/actor/"
    listing = {b.name[len(actor) :] for b in gcs.list_blobs(CONF["gcs_bucket"], prefix=actor)}
    assert {"2/commit_success.txt", "4/commit_success.txt"} <= listing, sorted(listing)
    assert cluster_or_none(gke, CLUSTER) is None
    # The redone interval is published as its interval's model, and Airflow records both backfills done.
    published = airflow.xcom(PROGRAM, runs[failing]["dag_run_id"], "publish_export")
    assert interval_events(airflow)[failing.isoformat()]["uri"] == published
    assert wait_for_completed(airflow, second), "the second backfill is not marked completed 120 s after its run ended"
