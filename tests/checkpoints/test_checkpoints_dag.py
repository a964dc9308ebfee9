"""The checkpoint tasks inside a real Airflow run (``dag.test()`` on the metadata database of
``make test``): deferral through the in-process triggerer, the skip as a task state, the Asset event
as a database row."""

from __future__ import annotations

import json

import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, task

from checkpoint_writers import write_hf_export, write_orbax_step
from tpu_rl.operators.outputs import PublishHfExportOperator, SkipIfCheckpointCompleteOperator
from tpu_rl.sensors.checkpoints import HfExportSensor, OrbaxCheckpointSensor

pytestmark = pytest.mark.checkpoints

CONVERTED_STEP = "m/max-text-format/conv/0/"
FINAL = "m/hf-trained/run/"
DAG_ID = "tpu_rl_checkpoints_flow_test"


@pytest.fixture
def no_leftover_dag():
    """Leave the local metadata database as it was: the DAG, its runs and its serialized versions go."""
    from airflow.api.common.delete_dag import delete_dag

    yield
    delete_dag(DAG_ID)


def build_dag(bucket, asset):
    with DAG(dag_id=DAG_ID, schedule=None) as dag:
        check = SkipIfCheckpointCompleteOperator(task_id="check_converted", bucket=bucket.name, prefix=CONVERTED_STEP)

        @task
        def hf_to_maxtext():
            write_orbax_step(bucket, CONVERTED_STEP)

        verify_converted = OrbaxCheckpointSensor(
            task_id="verify_converted", trigger_rule="none_failed", bucket=bucket.name, prefix=CONVERTED_STEP,
            poke_interval=1, timeout=60,
        )

        @task
        def maxtext_to_hf(ti=None):
            prefix = f"m/hf-staging/run/attempt-{ti.try_number}/"
            ti.xcom_push(key="attempt_prefix", value=prefix)
            ti.xcom_push(key="submitted_at", value=ti.start_date.isoformat())
            write_hf_export(bucket, prefix, shards=2)

        attempt = "ti.xcom_pull(task_ids='maxtext_to_hf', key='{}')"
        verify_export = HfExportSensor(
            task_id="verify_export", bucket=bucket.name, prefix="{{ " + attempt.format("attempt_prefix") + " }}",
            not_before="{{ " + attempt.format("submitted_at") + " }}", poke_interval=1, timeout=60,
        )
        publish = PublishHfExportOperator(
            task_id="publish_export", bucket=bucket.name, source_prefix="{{ " + attempt.format("attempt_prefix") + " }}",
            destination_prefix=FINAL, asset=asset, final_step="50", source_run=f"gs://{bucket.name}/m/trained/run/",
        )
        check >> hf_to_maxtext() >> verify_converted >> maxtext_to_hf() >> verify_export >> publish
        publish >> EmptyOperator(task_id="done")
    _sync_to_db(dag)
    return dag


def _sync_to_db(dag):
    """dag.test() runs only serialized DAGs of a bundle; this one lives in a test module, so write it."""
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG

    from airflow.utils.session import create_session

    with create_session() as session:
        update_dag_parsing_results_in_db(
            "dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session=session
        )


def test_second_run_skips_the_conversion_and_each_publish_emits_an_asset_event(bucket, no_leftover_dag):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    asset = Asset(name=f"model-{bucket.name}", uri=f"gs://{bucket.name}/{FINAL}")
    dag = build_dag(bucket, asset)
    states = []
    for _ in range(2):
        run = dag.test()
        states.append({ti.task_id: ti.state for ti in run.get_task_instances()})
        assert run.state == "success", states[-1]

    assert states[0]["check_converted"] == "success" and states[0]["hf_to_maxtext"] == "success"
    assert states[1]["check_converted"] == "skipped" and states[1]["hf_to_maxtext"] == "skipped"
    assert states[1]["verify_converted"] == "success"
    with create_session() as session:
        events = (
            session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.name == asset.name).all()
        )
        extras = [json.loads(e.extra) if isinstance(e.extra, str) else e.extra for e in events]
    assert len(extras) == 2
    assert extras[0] == {"uri": f"gs://{bucket.name}/{FINAL}", "final_step": 50, "source_run": f"gs://{bucket.name}/m/trained/run/"}
