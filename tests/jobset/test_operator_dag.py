"""JobSetOperator under Airflow's own task runner: dag.test() runs the task with a real TaskInstance in
the metadata database, defers it, runs the trigger in-process and resumes it (needs the database of
scripts/test.sh). The test DAG lives in tests/jobset/dags/, added as a DAG bundle for this test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpu_rl.run import RunIdentity

pytestmark = pytest.mark.jobset
REPO = Path(__file__).resolve().parents[2]
DAG_ID = "jobset_operator_dag_test"


@pytest.fixture
def test_bundle(monkeypatch):
    bundle = "airflow.dag_processing.bundles.local.LocalDagBundle"
    monkeypatch.setenv(
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST",
        json.dumps(
            [
                # The test bundle first (dag.test() syncs bundles in order until it finds the DAG); the
                # project's bundle stays configured, so this shared database keeps it active.
                {"name": "jobset-tests", "classpath": bundle, "kwargs": {"path": str(Path(__file__).parent / "dags")}},
                {"name": "dags-folder", "classpath": bundle, "kwargs": {"path": str(REPO / "dags")}},
            ]
        ),
    )


def test_dag_test_runs_submit_defer_and_resume(sim, test_bundle):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag = DagBag(str(Path(__file__).parent / "dags")).get_dag(DAG_ID)
    run = dag.test()

    assert run.state == "success"
    name = RunIdentity(DAG_ID, run.run_id).jobset_name("jt", "train")
    (jobset,) = sim.jobsets(name)
    assert jobset["metadata"]["annotations"]["tpu-rl.dev/run-id"] == run.run_id
    with create_session() as session:
        values = {
            x.key: XComModel.deserialize_value(x)
            for x in session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=DAG_ID, task_ids="train"))
        }
    assert values["jobset"]["uid"] == jobset["metadata"]["uid"]
    assert values["return_value"]["state"] == "Completed"
    assert values["return_value"]["name"] == name
    # Extra links reach the UI through XCom, written by the task runner (no plugin); empty off GKE.
    assert values["_link_JobSetWorkloadLink"] == "" and values["_link_JobSetLogsLink"] == ""
