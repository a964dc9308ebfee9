"""The pipeline's DAG, built by one function for every DAG that runs it: the manual ``maxtext_rl_tpu`` and
each recurring program of ``include/programs.yaml``. Each DAG file only says which DAG it is."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, BaseOperator

from tpu_rl.candidates import CREATE_TPU_POOLS_TIMEOUT_MINUTES
from tpu_rl.contract import EXPORT_ATTEMPT_PREFIX, EXPORT_SUBMITTED_AT, FINAL_STEP, TRAINER_COMPLETED, Task
from tpu_rl.operators.cluster import ClusterReadySensor, CreateClusterOperator, DeleteClusterOperator
from tpu_rl.operators.leases import WaitForTpuCapacitySensor
from tpu_rl.operators.preflight import PreflightOperator
from tpu_rl.operators.publish import RunPublishHfExportOperator
from tpu_rl.operators.retention import PruneCheckpointsOperator
from tpu_rl.operators.run_report import QualityGateOperator, RunSummaryOperator
from tpu_rl.operators.setup import (
    CreateHfTokenSecretOperator,
    EnsureBucketOperator,
    EnsureJobSetOperator,
    TriggererCheckOperator,
    ValidateRunConfigOperator,
)
from tpu_rl.operators.tpu_pools import CreateTpuNodePoolsOperator, DeleteTpuNodePoolsOperator
from tpu_rl.operators.training_record import RunTrainingRecordCheckOperator
from tpu_rl.operators.workloads import (
    HfToMaxTextOperator,
    MaxTextToHfOperator,
    TrainRlOperator,
)
from tpu_rl.params import check_defaults, trigger_params
from tpu_rl.sensors.checkpoints import (
    RunConvertedCheckpointSensor,
    RunFinalTrainingCheckpointSensor,
    RunHfExportSensor,
)

CLEANUP_RETRIES = {"retries": 10, "retry_delay": timedelta(minutes=2)}
#: Above every other task's priority (the default weight rule gives at most the number of tasks).
SLICE_TEARDOWN_PRIORITY = 1000
DEFAULT_ARGS = {"retries": 2, "retry_delay": timedelta(minutes=1), "execution_timeout": timedelta(hours=1)}
TAGS = ["maxtext", "tpu", "gke", "rl"]


def exported_model_asset(dag_id: str) -> Asset:
    """The Asset a DAG's published models are events of; downstream DAGs (serving, evaluation) schedule on it."""
    return Asset(name=f"{dag_id}_hf_model")


def build_pipeline(
    dag_id: str,
    *,
    doc_md: str,
    description: str = "MaxText RL post-training on a GKE TPU slice, end to end",
    schedule: Any = None,
    start_date: datetime | None = None,
    end_date: datetime | None = None,
    catchup: bool = False,
    max_active_runs: int = 16,
    param_defaults: Mapping[str, Any] | None = None,
    is_paused_upon_creation: bool | None = None,
    tags: list[str] | None = None,
) -> DAG:
    """The pipeline as a DAG. ``param_defaults`` replace the trigger form's defaults (a program's params)."""
    params = trigger_params()
    for name, value in (param_defaults or {}).items():
        params[name].value = value
    if schedule is not None:
        check_defaults(dag_id, params)
    # The form is given to the DAG once its tasks exist: Airflow deep-copies the DAG's params into every
    # operator it builds (63 copies of 68 Params a DAG, most of a program's parse time), and a task reads
    # them from the DAG when it runs anyway. Given at construction, Airflow would also check them (above).
    with DAG(
        dag_id=dag_id,
        description=description,
        doc_md=doc_md,
        schedule=schedule,
        start_date=start_date,
        end_date=end_date,
        catchup=catchup,
        max_active_runs=max_active_runs,
        is_paused_upon_creation=is_paused_upon_creation,
        default_args=DEFAULT_ARGS,
        tags=tags or TAGS,
    ) as dag:
        _wire_tasks(exported_model_asset(dag_id))
    dag.params.update(params)
    return dag


def _wire_tasks(exported_model: Asset) -> None:
    guard, cluster_setups = _cluster_tasks()
    verify_converted = _conversion_tasks(after=cluster_setups[-1])
    train, verify_training, delete_tpu_pools = _training_tasks(after=verify_converted)
    publish_export = _export_tasks(exported_model, after=verify_training)
    delete_cluster = DeleteClusterOperator(task_id=Task.DELETE_CLUSTER, **CLEANUP_RETRIES)
    # Only after the export is published (and checked again there): removes the checkpoints it superseded, as the
    # run's keep_checkpoints says.
    prune_checkpoints = PruneCheckpointsOperator(task_id=Task.PRUNE_CHECKPOINTS, **CLEANUP_RETRIES)
    # Runs when the work succeeded (its state is the work's outcome): logs the run's summary.
    done = RunSummaryOperator(task_id=Task.PIPELINE_DONE, execution_timeout=timedelta(minutes=10))

    publish_export >> delete_cluster
    publish_export >> prune_checkpoints >> done
    # publish_export waits for the slices to be gone, so its Asset event carries their TPU time.
    train >> delete_tpu_pools >> [delete_cluster, publish_export]
    # A failed create still tears down (guard is a setup that succeeded); a failed teardown fails the run;
    # the work's outcome is carried by pipeline_done (docs/how-to/retry-clear-stop.md).
    # Everything the workloads need from the cluster is a setup, so clearing a stage re-runs it (each adopts
    # or skips what exists) after a teardown removed the cluster or, in an existing one, the run's Secret.
    delete_cluster.as_teardown(setups=[guard, *cluster_setups], on_failure_fail_dagrun=True)


def _cluster_tasks() -> tuple[EmptyOperator, list[BaseOperator]]:
    """From the config's validation to the run's Secret on a ready cluster: the guard, and the cluster's setups
    (the last one: what the workloads wait for)."""
    validate = ValidateRunConfigOperator(task_id=Task.VALIDATE_CONFIG, retries=0)
    # Before anything billable: a triggerer that cannot import the package fails the run here, naming the fix
    # (without a retry: AirflowFailException). Its retries are for Airflow's own race on a quick trigger.
    check_triggerer = TriggererCheckOperator(task_id=Task.CHECK_TRIGGERER, retry_delay=timedelta(seconds=10))
    # Before anything is created: the project's reservations and quotas against what the run asks for.
    preflight = PreflightOperator(task_id=Task.PREFLIGHT, execution_timeout=timedelta(minutes=10))
    guard = EmptyOperator(task_id=Task.GUARD)
    bucket = EnsureBucketOperator(task_id=Task.ENSURE_BUCKET)
    create_cluster = CreateClusterOperator(task_id=Task.CREATE_CLUSTER)
    wait_for_cluster = ClusterReadySensor(
        task_id=Task.WAIT_FOR_CLUSTER, mode="reschedule", poke_interval=60, timeout=timedelta(hours=1)
    )
    jobset = EnsureJobSetOperator(task_id=Task.ENSURE_JOBSET)
    token = CreateHfTokenSecretOperator(task_id=Task.HF_TOKEN_SECRET)
    validate >> check_triggerer >> preflight >> guard >> bucket >> create_cluster >> wait_for_cluster >> jobset >> token
    return guard, [create_cluster, wait_for_cluster, jobset, token]


def _conversion_tasks(after: BaseOperator) -> BaseOperator:
    """The shared base checkpoint, converted or found: its check is what training waits for."""
    # Skips when the shared base checkpoint is complete; else converts under a lock in the bucket, or waits
    # (deferred) while another run converts it.
    hf_to_maxtext = HfToMaxTextOperator(task_id=Task.HF_TO_MAXTEXT, execution_timeout=timedelta(hours=4))
    verify_converted = RunConvertedCheckpointSensor(
        task_id=Task.VERIFY_CONVERTED, trigger_rule="none_failed", timeout=timedelta(minutes=30)
    )
    after >> hf_to_maxtext >> verify_converted
    return verify_converted


def _training_tasks(after: BaseOperator) -> tuple[BaseOperator, BaseOperator, BaseOperator]:
    """The slice's setup, the training and its teardown, and the final checkpoint's check: (train_rl,
    verify_training, delete_tpu_pools)."""
    # Fails the run before TPU pools exist; train_rl repeats the same check before every submission.
    check_training_record = RunTrainingRecordCheckOperator(task_id=Task.CHECK_TRAINING_RECORD)
    # Like guard for the cluster: a setup that succeeds, so delete_tpu_pools runs even when the create fails
    # half-way (a stockout leaves a pool in ERROR; with two slices, the first pool may exist).
    pools_guard = EmptyOperator(task_id=Task.TPU_POOLS_GUARD)
    # With a capacity_group: waits (rescheduled) until the group has the run's slices free, and takes them;
    # delete_tpu_pools gives them back. A week: a backfill's later intervals queue behind earlier trainings,
    # each of which may take train_rl's 72 h.
    wait_for_capacity = WaitForTpuCapacitySensor(
        task_id=Task.WAIT_FOR_TPU_CAPACITY, mode="reschedule", poke_interval=30, timeout=timedelta(days=7)
    )
    # Its timeout holds while it waits for capacity (capacity_wait_minutes, at most the maximum; the capacity
    # candidates' waits are checked against it) and creates.
    create_tpu_pools = CreateTpuNodePoolsOperator(
        task_id=Task.CREATE_TPU_POOLS, execution_timeout=timedelta(minutes=CREATE_TPU_POOLS_TIMEOUT_MINUTES)
    )
    train = TrainRlOperator(task_id=Task.TRAIN_RL, execution_timeout=timedelta(hours=72))
    # The slice bills by the hour: when worker slots are short, its deletion is queued before any other task.
    delete_tpu_pools = DeleteTpuNodePoolsOperator(
        task_id=Task.DELETE_TPU_POOLS,
        priority_weight=SLICE_TEARDOWN_PRIORITY,
        weight_rule="absolute",
        **CLEANUP_RETRIES,
    )
    verify_training = RunFinalTrainingCheckpointSensor(
        task_id=Task.VERIFY_TRAINING,
        trainer_completed=TRAINER_COMPLETED.template(),
        timeout=timedelta(minutes=30),
    )
    after >> check_training_record >> pools_guard >> wait_for_capacity >> create_tpu_pools >> train >> verify_training
    delete_tpu_pools.as_teardown(setups=[pools_guard, wait_for_capacity, create_tpu_pools])
    return train, verify_training, delete_tpu_pools


def _export_tasks(exported_model: Asset, after: BaseOperator) -> BaseOperator:
    """The quality gate, the export to Hugging Face's format, its check and its publication (returned)."""
    # Before anything is exported: a model that fails the run's quality gate is never published.
    quality_gate = QualityGateOperator(task_id=Task.QUALITY_GATE, execution_timeout=timedelta(minutes=10))
    maxtext_to_hf = MaxTextToHfOperator(
        task_id=Task.MAXTEXT_TO_HF, step_task_id=FINAL_STEP.task, execution_timeout=timedelta(hours=4)
    )
    verify_export = RunHfExportSensor(
        task_id=Task.VERIFY_EXPORT,
        prefix=EXPORT_ATTEMPT_PREFIX.template(),
        not_before=EXPORT_SUBMITTED_AT.template(),
        timeout=timedelta(minutes=30),
    )
    publish_export = RunPublishHfExportOperator(
        task_id=Task.PUBLISH_EXPORT,
        source_prefix=EXPORT_ATTEMPT_PREFIX.template(),
        asset=exported_model,
        final_step=FINAL_STEP.template(),
    )
    after >> quality_gate >> maxtext_to_hf >> verify_export >> publish_export
    return publish_export
