"""JobSetOperator under Airflow's own task runner: dag.test() runs the task with a real TaskInstance in
the metadata database, defers it, runs the trigger in-process and resumes it (needs the database of
scripts/test.sh)."""

from __future__ import annotations

import pytest
from jobset_helpers import CONN_ID, tpu_jobset, unique

from tpu_rl.operators.jobset import JobSetOperator

pytestmark = pytest.mark.jobset


def test_dag_test_runs_submit_defer_and_resume(sim):
    from airflow.models.xcom import XComModel
    from airflow.sdk import DAG
    from airflow.utils.session import create_session

    name = unique("dagtest")
    with DAG("jobset_operator_dag_test", schedule=None) as dag:
        JobSetOperator(task_id="train", manifest=tpu_jobset(name, run_seconds=3), kubernetes_conn_id=CONN_ID,
                       progress_interval=10)
    run = dag.test()

    assert run.state == "success"
    (jobset,) = sim.jobsets(name)
    assert jobset["metadata"]["annotations"]["tpu-rl.dev/run-id"] == run.run_id
    with create_session() as session:
        values = {
            x.key: XComModel.deserialize_value(x)
            for x in session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, task_ids="train"))
        }
    assert values["jobset"]["uid"] == jobset["metadata"]["uid"]
    assert values["return_value"]["state"] == "Completed"
    assert any("simulated workload" in line for line in values["return_value"]["log_tail"])
