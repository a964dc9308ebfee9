"""A short fault campaign (scripts/chaos.py, ``make chaos`` at length): two runs at once, each meeting three faults
dealt from the whole catalogue by a seed (GKE's throttling, refusals while it upgrades, unavailability, slow replies
and creates, stockouts, missing quota; the cluster's API front end answering 503 or dropping connections; Cloud
Storage 503s; preemptions, a half-written step, a flooded log; components killed, a triggerer paused, the broker,
the metadata database and the API server restarted), at moments drawn by the same seed. It runs after every other
test, alone on the stack: its strikes would hit their runs. ``TPU_RL_CHAOS_SEED`` deals another campaign.
"""

from __future__ import annotations

import functools
import os

import pytest

from scripts import chaos

pytestmark = pytest.mark.e2e

#: The campaign make test deals unless TPU_RL_CHAOS_SEED says otherwise: one run meets a flooded, rotated trainer
#: log, its cluster's API dropping connections and Cloud Storage 503s on its reads; the other a preemption during a
#: save, a restart of the metadata database and a slow pool create that shows ERROR before RUNNING.
SEED = 355


@pytest.mark.e2e_alone
def test_runs_meeting_random_faults_hold_every_invariant(airflow, session_gke, gcs):
    seed = int(os.environ.get("TPU_RL_CHAOS_SEED", SEED))
    campaign = chaos.Campaign(
        airflow, functools.partial(airflow.script, check=False), session_gke, gcs, seed, chaos.deal(seed, 2, 3)
    )
    try:
        campaign.start()
        campaign.drive()
    finally:
        campaign.clear_rules()
    report = f"seed {seed}\n{chaos.table(campaign)}"
    print(report)
    assert not any(run.problems for run in campaign.runs), report
    assert all(run.checks for run in campaign.runs), report
    # Every fault dealt was met: the campaign proves what it says it drew.
    assert [run.injected for run in campaign.runs] == [run.kinds for run in campaign.runs], report
