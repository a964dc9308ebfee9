"""
### Reaper of what dead `maxtext_rl_tpu` runs left behind

Teardown runs only if Airflow does. When a run's metadata is lost (the run deleted, the environment
deleted or restored from a snapshot, a teardown never run), its cluster, TPU node pools, JobSets and
Secrets keep billing. This DAG finds them by this package's ownership marks, asks Airflow about the run
that made each one, and keeps or reaps it:

- **keep**: its run is queued or running; another live run uses its cluster; it is younger than
  `grace_minutes`; the cluster was created with `keep_cluster`.
- **reap**: its run ended or no longer exists, and the grace period has passed.

Nothing without the marks is ever listed: clusters of `cluster_mode=existing` are not this package's, only
the JobSets, Secrets and per-run pools runs put in them. **Dry run by default**: it reports; `delete=true`
deletes. The report is in the log and in the XCom `report`; reapable TPU capacity left in place fails the
task, so alerting fires. Paused at creation: unpause it once `watch` lists your projects and locations.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Param

from tpu_rl.operators.reaper import ReapOrphanedResourcesOperator
from tpu_rl.run import REAPER_DAG_ID

#: How often it looks; the declaration's schedule.
SCHEDULE = timedelta(minutes=15)
#: Default for the form's `watch`: TPU_RL_REAPER_WATCH="my-project/us-east5,other-project/europe-west4".
WATCH = [w for w in os.environ.get("TPU_RL_REAPER_WATCH", "").split(",") if w]

with DAG(
    dag_id=REAPER_DAG_ID,
    description="Finds and removes what dead maxtext_rl_tpu runs left in GKE",
    doc_md=__doc__,
    schedule=SCHEDULE,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=True,
    params={
        "watch": Param(
            WATCH,
            type="array",
            items={"type": "string"},
            title="Projects and locations",
            description="project/location entries (e.g. my-project/us-east5) where runs create clusters.",
        ),
        "grace_minutes": Param(
            60,
            type="number",
            minimum=0,
            title="Grace period (minutes)",
            description="Resources younger than this are kept whatever their run's state.",
        ),
        "delete": Param(
            False,
            type="boolean",
            title="Delete",
            description="false: report only (dry run). true: delete what is reaped.",
        ),
        "gcp_conn_id": Param("google_cloud_default", type="string", title="Google Cloud connection"),
    },
    default_args={"retries": 0},
    tags=["maxtext", "tpu", "gke", "cleanup"],
) as dag:
    ReapOrphanedResourcesOperator(task_id="reap", execution_timeout=timedelta(minutes=10))
