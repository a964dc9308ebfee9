"""The checkpoint tasks inside a real Airflow run (``dag.test()`` on the metadata database of
``make test``): deferral through the in-process triggerer, the skip as a task state, the Asset event
as a database row."""

from __future__ import annotations

import json
import time
from functools import cached_property

import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, task
from checkpoint_writers import write_hf_export, write_orbax_step
from conversion_fakes import InMemoryJobSets, jobset_event, layout, run_conf

from tpu_rl.operators.jobset import XCOM_JOBSET
from tpu_rl.operators.publish import PublishHfExportOperator
from tpu_rl.operators.workloads import HfToMaxTextOperator
from tpu_rl.output_checks import OrbaxStep
from tpu_rl.sensors.checkpoints import HfExportSensor, OrbaxCheckpointSensor
from tpu_rl.triggers.checkpoints import GcsOutputTrigger

pytestmark = [pytest.mark.checkpoints, pytest.mark.usefixtures("metadata_db")]

FINAL = "m/hf-trained/run/"
DAG_ID = "tpu_rl_checkpoints_flow_test"


class ConversionWithoutCluster(HfToMaxTextOperator):
    """The DAG's hf_to_maxtext (checkpoint check, lock, submit, deferred wait, release) with the cluster
    replaced: submitting the JobSet writes the checkpoint its pod would write, and the deferred wait for the
    JobSet (``JobSetOperator._defer``) is a wait in the triggerer for that checkpoint. The JobSet operator
    against a real API server is tested in tests/jobset."""

    def __init__(self, *, bucket_name: str, **kwargs):
        super().__init__(**kwargs)
        self.bucket_name = bucket_name

    @cached_property
    def hook(self):
        cluster = InMemoryJobSets()
        create = cluster.create_jobset

        def create_and_convert(body, namespace):
            write_orbax_step(GcsBucket.of(self.bucket_name), layout(self.bucket_name).converted_step_prefix)
            return create(body, namespace)

        cluster.create_jobset = create_and_convert
        return cluster

    def _defer(self, context, jobset):
        self.defer(
            trigger=GcsOutputTrigger(
                self.bucket_name,
                OrbaxStep(prefix=layout(self.bucket_name).converted_step_prefix),
                deadline=time.time() + 60,
                poll_interval=1,
            ),
            method_name="checkpoint_written",
        )

    def checkpoint_written(self, context, event):
        tracked = context["ti"].xcom_pull(task_ids=self.task_id, key=XCOM_JOBSET)
        return self.execute_complete(context, jobset_event(tracked, "success"))


class GcsBucket:
    @staticmethod
    def of(name):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project="test", credentials=AnonymousCredentials()).bucket(name)


@pytest.fixture
def no_leftover_dag():
    """Leave the local metadata database as it was: the DAG, its runs and its serialized versions go."""
    from airflow.api.common.delete_dag import delete_dag

    yield
    delete_dag(DAG_ID)


def build_dag(bucket, asset):
    converted_step = layout(bucket.name).converted_step_prefix
    with DAG(dag_id=DAG_ID, schedule=None, params=run_conf(bucket.name)) as dag:
        hf_to_maxtext = ConversionWithoutCluster(task_id="hf_to_maxtext", bucket_name=bucket.name)
        verify_converted = OrbaxCheckpointSensor(
            task_id="verify_converted",
            trigger_rule="none_failed",
            bucket=bucket.name,
            prefix=converted_step,
            poke_interval=1,
            timeout=60,
        )

        @task
        def maxtext_to_hf(ti=None):
            prefix = f"m/hf-staging/run/attempt-{ti.try_number}/"
            ti.xcom_push(key="attempt_prefix", value=prefix)
            ti.xcom_push(key="submitted_at", value=ti.start_date.isoformat())
            write_hf_export(bucket, prefix, shards=2)

        attempt = "ti.xcom_pull(task_ids='maxtext_to_hf', key='{}')"
        verify_export = HfExportSensor(
            task_id="verify_export",
            bucket=bucket.name,
            prefix="{{ " + attempt.format("attempt_prefix") + " }}",
            not_before="{{ " + attempt.format("submitted_at") + " }}",
            poke_interval=1,
            timeout=60,
        )
        publish = PublishHfExportOperator(
            task_id="publish_export",
            bucket=bucket.name,
            source_prefix="{{ " + attempt.format("attempt_prefix") + " }}",
            destination_prefix=FINAL,
            asset=asset,
            final_step="50",
            source_run=f"gs://{bucket.name}/m/trained/run/",
        )
        hf_to_maxtext >> verify_converted >> maxtext_to_hf() >> verify_export >> publish
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

    assert states[0]["hf_to_maxtext"] == "success"  # Locked, converted (deferred), released.
    assert states[1]["hf_to_maxtext"] == "skipped"  # The checkpoint is complete.
    assert states[1]["verify_converted"] == "success"
    assert bucket.get_blob(layout(bucket.name).conversion_lock_object) is None
    with create_session() as session:
        events = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.name == asset.name)
            .all()
        )
        extras = [json.loads(e.extra) if isinstance(e.extra, str) else e.extra for e in events]
    assert len(extras) == 2
    assert extras[0] == {
        "uri": f"gs://{bucket.name}/{FINAL}",
        "final_step": 50,
        "source_run": f"gs://{bucket.name}/m/trained/run/",
    }
