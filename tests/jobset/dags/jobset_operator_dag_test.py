"""DAG for test_operator_dag.py: the JobSet's name comes from the run, as in the pipeline's DAG."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG
from jobset_helpers import CONN_ID, tpu_jobset

from tpu_rl.operators.jobset import JobSetOperator
from tpu_rl.run import RunIdentity


class RunNamedJobSetOperator(JobSetOperator):
    def build_manifest(self, context):
        ti = context["ti"]
        return tpu_jobset(RunIdentity(ti.dag_id, ti.run_id).jobset_name("jt", "train"), run_seconds=3)


with DAG("jobset_operator_dag_test", schedule=None, catchup=False):
    RunNamedJobSetOperator(
        task_id="train", kubernetes_conn_id=CONN_ID, progress_interval=10, execution_timeout=timedelta(minutes=5)
    )
