"""The pipeline's three workloads: the JobSet operator, aimed at the run's cluster, with its manifest built
from the run's validated config at execute time."""

from __future__ import annotations

from typing import Any

from tpu_rl import manifests
from tpu_rl.operators.jobset import ANNOTATION_SUBMITTED_TRY, JobSetOperator
from tpu_rl.run_context import config_of, layout_of, run_of

#: XCom keys of the export: where its attempt writes, and since when (older objects there are stale).
XCOM_ATTEMPT_PREFIX = "attempt_prefix"
XCOM_SUBMITTED_AT = "submitted_at"


class RunJobSetOperator(JobSetOperator):
    """Targets the cluster named by the run's params (a Kubernetes connection, or GKE)."""

    def _aim(self, context: Any) -> None:
        config = config_of(context)
        self.namespace = config.namespace
        self.gcp_conn_id = config.gcp_conn_id
        if config.kubernetes_conn_id:
            self.kubernetes_conn_id = config.kubernetes_conn_id
        else:
            self.project_id, self.location, self.cluster_name = config.project, config.region, config.cluster_name

    def execute(self, context: Any) -> dict | None:
        self._aim(context)
        return super().execute(context)

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Any):
        self._aim(context)
        return super().resume_execution(next_method, next_kwargs, context)


class HfToMaxTextOperator(RunJobSetOperator):
    def build_manifest(self, context: Any) -> dict:
        return manifests.hf_to_maxtext_jobset(config_of(context), run_of(context))


class TrainRlOperator(RunJobSetOperator):
    def build_manifest(self, context: Any) -> dict:
        return manifests.training_jobset(config_of(context), run_of(context))


class MaxTextToHfOperator(RunJobSetOperator):
    """Exports the step the final-checkpoint sensor resolved, into a fresh prefix per submitting try."""

    def __init__(self, *, step_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_task_id = step_task_id

    def build_manifest(self, context: Any) -> dict:
        step = context["ti"].xcom_pull(task_ids=self.step_task_id)
        if step is None:
            raise ValueError(f"No final training step from task {self.step_task_id}")
        prefix = layout_of(context).export_attempt_prefix(context["ti"].try_number)
        return manifests.maxtext_to_hf_jobset(config_of(context), run_of(context), int(step), prefix)

    def _track(self, context: Any, jobset: dict) -> None:
        """An adopted JobSet writes where the try that submitted it told it to: publish that prefix."""
        super()._track(context, jobset)
        meta = jobset["metadata"]
        submitted_try = int((meta.get("annotations") or {}).get(ANNOTATION_SUBMITTED_TRY) or context["ti"].try_number)
        context["ti"].xcom_push(key=XCOM_ATTEMPT_PREFIX, value=layout_of(context).export_attempt_prefix(submitted_try))
        context["ti"].xcom_push(key=XCOM_SUBMITTED_AT, value=meta.get("creationTimestamp"))
