"""The contract between the pipeline's tasks, and between them and the run's Training tab: the task ids, and
every (task, XCom key) that a task or the UI pulls from another task. ``pipeline.py`` names its tasks from
here; the run report, the Training tab and the templated fields pull through here. Renaming a task or a key
is one edit, and ``tests/unit/test_contract.py`` checks every pulled pair against the DAG the factory builds.

Pure: no Airflow.
"""

from __future__ import annotations

from dataclasses import dataclass


class Task:
    """The pipeline's task ids."""

    VALIDATE_CONFIG = "validate_config"
    CHECK_TRIGGERER = "check_triggerer"
    PREFLIGHT = "preflight"
    GUARD = "guard"
    ENSURE_BUCKET = "ensure_bucket"
    CREATE_CLUSTER = "create_cluster"
    WAIT_FOR_CLUSTER = "wait_for_cluster"
    ENSURE_JOBSET = "ensure_jobset"
    HF_TOKEN_SECRET = "hf_token_secret"
    HF_TO_MAXTEXT = "hf_to_maxtext"
    VERIFY_CONVERTED = "verify_converted"
    CHECK_TRAINING_RECORD = "check_training_record"
    TPU_POOLS_GUARD = "tpu_pools_guard"
    WAIT_FOR_TPU_CAPACITY = "wait_for_tpu_capacity"
    CREATE_TPU_POOLS = "create_tpu_pools"
    TRAIN_RL = "train_rl"
    DELETE_TPU_POOLS = "delete_tpu_pools"
    VERIFY_TRAINING = "verify_training"
    QUALITY_GATE = "quality_gate"
    MAXTEXT_TO_HF = "maxtext_to_hf"
    VERIFY_EXPORT = "verify_export"
    PUBLISH_EXPORT = "publish_export"
    PRUNE_CHECKPOINTS = "prune_checkpoints"
    DELETE_CLUSTER = "delete_cluster"
    PIPELINE_DONE = "pipeline_done"


#: XCom keys a task pushes for others (``return_value``: what the task returns).
RETURN_VALUE = "return_value"
XCOM_EVALUATION = "evaluation"
XCOM_TRAINER_COMPLETED = "trainer_completed"
XCOM_PREEMPTIONS = "preemptions"
XCOM_TPU_SLICES = "tpu_slices"
XCOM_ATTEMPT_PREFIX = "attempt_prefix"
XCOM_SUBMITTED_AT = "submitted_at"
XCOM_JOBSET = "jobset"
#: ``create_tpu_pools`` and ``train_rl``, with several capacity candidates: the one the slices came from and why the
#: others were left.
XCOM_CAPACITY = "capacity"


@dataclass(frozen=True)
class Pull:
    """One XCom another task or the UI reads: the task that pushes it, and its key."""

    task: str
    key: str = RETURN_VALUE

    def template(self) -> str:
        """The Jinja expression of a templated field that reads it."""
        key = "" if self.key == RETURN_VALUE else f", key='{self.key}'"
        return "{{ ti.xcom_pull(task_ids='" + self.task + "'" + key + ") }}"


#: ``preflight``: ``skipped``, the capacity candidates it left out (index as a string -> why); ``warnings``, what it
#: could not check (``tpu_rl.preflight``).
PREFLIGHT_RESULT = Pull(Task.PREFLIGHT)
#: ``train_rl``: the trainer's evaluation before and after training (``Evaluation.to_dict()``, or None).
TRAINING_EVALUATION = Pull(Task.TRAIN_RL, XCOM_EVALUATION)
#: ``train_rl``: whether the trainer printed its success line (a normal exit).
TRAINER_COMPLETED = Pull(Task.TRAIN_RL, XCOM_TRAINER_COMPLETED)
#: ``train_rl``: the training JobSet it follows (``name``, ``namespace``, ``uid``, ``created``: when the current
#: attempt was submitted, a retry's, a clear's or a preemption's resume).
TRAINING_JOBSET = Pull(Task.TRAIN_RL, XCOM_JOBSET)
#: ``train_rl``: the run's preemptions (``preemption.accounting``).
TRAINING_PREEMPTIONS = Pull(Task.TRAIN_RL, XCOM_PREEMPTIONS)
#: ``delete_tpu_pools``: when each slice the run created had its nodes (``gke.slice_times``).
SLICE_TIMES = Pull(Task.DELETE_TPU_POOLS, XCOM_TPU_SLICES)
#: ``create_tpu_pools``, with several capacity candidates: ``serving`` (the candidate the slices came from),
#: ``attempts`` (``failover.Attempt.to_json``) and ``lines`` (why each candidate was left).
CAPACITY_CANDIDATES = Pull(Task.CREATE_TPU_POOLS, XCOM_CAPACITY)
#: ``train_rl``, with several capacity candidates: the same, once its pools are RUNNING (after a move for
#: preemptions, on another candidate than create_tpu_pools's): it stands for create_tpu_pools's when pushed.
TRAINING_CAPACITY = Pull(Task.TRAIN_RL, XCOM_CAPACITY)
#: ``verify_training``: the run's final step (int).
FINAL_STEP = Pull(Task.VERIFY_TRAINING)
#: ``maxtext_to_hf``: the export attempt's folder.
EXPORT_ATTEMPT_PREFIX = Pull(Task.MAXTEXT_TO_HF, XCOM_ATTEMPT_PREFIX)
#: ``maxtext_to_hf``: when the export's JobSet was created (the export check ignores older files).
EXPORT_SUBMITTED_AT = Pull(Task.MAXTEXT_TO_HF, XCOM_SUBMITTED_AT)
#: ``publish_export``: the published model's URI.
PUBLISHED_MODEL = Pull(Task.PUBLISH_EXPORT)

#: Every XCom pulled across tasks or by the UI.
PULLED = (
    PREFLIGHT_RESULT,
    TRAINING_EVALUATION,
    TRAINER_COMPLETED,
    TRAINING_JOBSET,
    TRAINING_PREEMPTIONS,
    SLICE_TIMES,
    CAPACITY_CANDIDATES,
    TRAINING_CAPACITY,
    FINAL_STEP,
    EXPORT_ATTEMPT_PREFIX,
    EXPORT_SUBMITTED_AT,
    PUBLISHED_MODEL,
)
