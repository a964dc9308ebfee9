"""The training record: a run's training parameters stored next to its checkpoints on the first attempt,
and every later attempt refused when they differ (``train_rl`` resumes from the run's latest checkpoint);
and the run's preemptions, added as ``train_rl`` meets them, so a retried or cleared task counts them too;
and, with several capacity candidates, why the run left each one (``failover.Attempt``), so a new try of
``create_tpu_pools`` goes on from where the run is instead of from the first candidate.

:func:`check_training_record` is the check; :class:`TrainingRecordCheckOperator` runs it as a task, and
:class:`RunTrainingRecordCheckOperator` is the DAG's task, on the run's record. ``TrainRlOperator`` runs
the same check before each submission.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from tpu_rl.checkpoints import training_record_changes
from tpu_rl.compat import AirflowException, AirflowFailException
from tpu_rl.failover import Attempt
from tpu_rl.hooks import gcs
from tpu_rl.preemption import PreemptionRecord
from tpu_rl.run_scope import RunScope, RunScoped

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The record's list of the run's preemptions (:class:`~tpu_rl.preemption.PreemptionRecord` as JSON).
PREEMPTIONS_KEY = "preemptions"
#: The record's evaluation of the model before training: the first ``Pre RL Training`` figures of the run (a
#: resumed attempt evaluates the weights it restored, not the model the run started from).
BASELINE_KEY = "evaluation_before"
#: The record's list of the run's capacity attempts (:class:`~tpu_rl.failover.Attempt` as JSON), oldest first.
CAPACITY_ATTEMPTS_KEY = "capacity_attempts"
#: The record's list of the times the watchdog ended the training (``kind``, ``step``), oldest first.
STALLS_KEY = "stalls"


def check_training_record(
    bucket: gcs.GcsBucketHook,
    record_object: str,
    parameters: Mapping[str, Any],
    log: Any,
) -> str:
    """Records a run's training parameters next to its checkpoints on the first attempt, and refuses
    (AirflowFailException) any later attempt whose parameters differ. Returns the record's URI."""
    uri = bucket.uri(record_object)
    current = json.loads(json.dumps(dict(parameters)))  # As it reads back from JSON.
    created, stored = bucket.json_object(record_object).read_or_create({"parameters": current})
    if created:
        log.info("Recorded the run's training parameters in %s", uri)
        return uri
    recorded = stored["parameters"]
    if changes := training_record_changes(recorded, current):
        raise AirflowFailException(
            f"Refusing to resume the run recorded in {uri}: its checkpoints were trained with other "
            f"parameters ({'; '.join(changes)}). Start a new DAG run, or restore the recorded values."
        )
    log.info("Training parameters match %s: resuming the same run", uri)
    return uri


def recorded_preemptions(bucket: gcs.GcsBucketHook, record_object: str) -> list[PreemptionRecord]:
    """The preemptions the run's record holds (none in a record written before preemptions were counted)."""
    document = _read_record(bucket, record_object)
    return [PreemptionRecord.from_json(entry) for entry in document.get(PREEMPTIONS_KEY, [])]


def record_preemption(
    bucket: gcs.GcsBucketHook, record_object: str, record: PreemptionRecord
) -> list[PreemptionRecord]:
    """Adds ``record`` to the run's record (its parameters untouched); returns every preemption recorded."""

    def add(document: dict) -> dict:
        document.setdefault(PREEMPTIONS_KEY, []).append(record.to_json())
        return document

    document = bucket.json_object(record_object).update(add)
    return [PreemptionRecord.from_json(entry) for entry in document[PREEMPTIONS_KEY]]


def record_stall(bucket: gcs.GcsBucketHook, record_object: str, stall: Mapping[str, Any]) -> list[dict]:
    """Adds the watchdog's ``stall`` (``kind``, ``step``) to the run's record; returns every stall recorded, this
    one last."""

    def add(document: dict) -> dict:
        document.setdefault(STALLS_KEY, []).append({"kind": stall.get("kind"), "step": stall.get("step")})
        return document

    return list(bucket.json_object(record_object).update(add)[STALLS_KEY])


def recorded_capacity_attempts(bucket: gcs.GcsBucketHook, record_object: str) -> list[Attempt]:
    """Why the run left each capacity candidate so far (none in a record written before candidates existed)."""
    return [Attempt.from_json(entry) for entry in _read_record(bucket, record_object).get(CAPACITY_ATTEMPTS_KEY, [])]


def record_capacity_attempts(bucket: gcs.GcsBucketHook, record_object: str, attempts: Sequence[Attempt]) -> None:
    """Replaces the run's capacity attempts with ``attempts`` (the recorded ones and those of this try, in order;
    none: a new round from the first candidate)."""

    def replace(document: dict) -> dict:
        document[CAPACITY_ATTEMPTS_KEY] = [attempt.to_json() for attempt in attempts]
        return document

    bucket.json_object(record_object).update(replace)


def add_capacity_attempt(bucket: gcs.GcsBucketHook, record_object: str, attempt: Attempt) -> list[Attempt]:
    """Adds ``attempt`` (a preemption on the candidate the slices came from) to the run's capacity attempts;
    returns them all, for ``failover.next_candidate``."""

    def add(document: dict) -> dict:
        document.setdefault(CAPACITY_ATTEMPTS_KEY, []).append(attempt.to_json())
        return document

    document = bucket.json_object(record_object).update(add)
    return [Attempt.from_json(entry) for entry in document[CAPACITY_ATTEMPTS_KEY]]


def record_baseline(bucket: gcs.GcsBucketHook, record_object: str, before: Mapping[str, Any] | None) -> dict | None:
    """The run's evaluation before training: the one recorded, else ``before`` (an attempt's ``Pre`` figures),
    which is then recorded. None while no attempt has logged one."""
    stored = _read_record(bucket, record_object).get(BASELINE_KEY)
    if stored or not before:
        return stored

    def add(document: dict) -> dict:
        document.setdefault(BASELINE_KEY, dict(before))
        return document

    return bucket.json_object(record_object).update(add)[BASELINE_KEY]


def _read_record(bucket: gcs.GcsBucketHook, record_object: str) -> dict:
    stored = bucket.json_object(record_object).read()
    if stored is None:
        raise AirflowException(f"{bucket.uri(record_object)}: the run's training record is missing")
    return stored.document()


class TrainingRecordCheckOperator(BaseOperator):
    """Records a run's training parameters next to its checkpoints, and refuses a resume that changes them.

    ``train_rl`` resumes from the latest checkpoint of the same run and fast-forwards the data;
    changing ``num_batches``, ``batch_size``, the dataset or the model under it corrupts the run
    silently. Run this before launching a training attempt (the DAG's ``train_rl`` also runs
    :func:`check_training_record` before each submission).

    :param bucket: bucket name, without ``gs://``.
    :param record_object: ``GcsLayout.training_record_object``.
    :param parameters: the parameters that must not change within a run (plain JSON values).

    XCom return value: the record's ``gs://`` URI.
    """

    template_fields: Sequence[str] = ("bucket", "record_object", "parameters", "gcp_conn_id")

    def __init__(
        self,
        *,
        bucket: str,
        record_object: str,
        parameters: Mapping[str, Any],
        gcp_conn_id: str = "google_cloud_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.bucket = bucket
        self.record_object = record_object
        self.parameters = parameters
        self.gcp_conn_id = gcp_conn_id

    def execute(self, context: Context) -> str:
        return check_training_record(
            gcs.GcsBucketHook(self.bucket, self.gcp_conn_id), self.record_object, self.parameters, self.log
        )


class RunTrainingRecordCheckOperator(RunScoped, TrainingRecordCheckOperator):
    """``check_training_record`` of the DAG: the run's bucket, record object and :func:`~tpu_rl.layout.training_record`
    (typed values), filled in when the task renders, so the Rendered Template view shows them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(bucket="", record_object="", parameters={}, **kwargs)

    def resolve_scope(self, scope: RunScope, context: Any) -> None:
        self.bucket, self.gcp_conn_id = scope.config.gcs_bucket, scope.config.gcp_conn_id
        self.record_object = scope.layout.training_record_object
        self.parameters = scope.training_record
