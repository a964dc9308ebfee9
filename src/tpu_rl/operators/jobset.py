"""Operator that runs one JobSet to its end on a GKE cluster (or any cluster), surviving worker restarts.

The JobSet's name is fixed by the manifest (derived from the DAG run and stage), and its annotations
record which DAG run, task and try submitted it, so any later try finds it again: it adopts a running
JobSet, accepts a Completed one, and replaces a Failed one only on a new try. While the JobSet runs
the task is deferred (the worker slot is free); the trigger streams progress and the workload log.

Only light imports at module level: DAG files import this at parse time.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from tpu_rl import environment
from tpu_rl import jobset_status as st
from tpu_rl.compat import AirflowException, TaskDeferralTimeout, TaskDeferred
from tpu_rl.contract import XCOM_JOBSET  # the JobSet the task tracks (name, namespace, uid, created)
from tpu_rl.hooks.kubernetes import ClusterTarget, KubernetesApiHook
from tpu_rl.links import JobSetLogsLink, JobSetWorkloadLink
from tpu_rl.run import LABEL_VALUE_MAX, RunIdentity, slug
from tpu_rl.vocabulary import (
    ANNOTATION_DAG_ID,
    ANNOTATION_RUN_ID,
    ANNOTATION_SUBMITTED_TRY,
    ANNOTATION_TASK_ID,
    LABEL_TASK_ID,
    PATHWAYS_JOBSET_NAME_MAX,
)

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.triggers.base import BaseTrigger


class JobSetFailedError(AirflowException):
    """The JobSet ended Failed, or vanished while the task waited for it."""


class JobSetOperator(BaseOperator):
    """Submit a JobSet, or adopt the one an earlier try submitted, and wait deferred until it ends.

    :param manifest: the JobSet (a dict, templated). ``metadata.name`` must be set and stable for the
        DAG run and stage; labels and annotations identifying the task are added.
    :param namespace: namespace of the JobSet (a namespace in the manifest wins).
    :param cluster: the cluster to run it on, a :class:`~tpu_rl.hooks.kubernetes.ClusterTarget` (its names are
        templated): a Kubernetes connection, or a GKE cluster reached through ``gcp_conn_id`` (tokens
        refreshed by the Google provider). Or else its fields as keywords: ``kubernetes_conn_id="k"``, or
        ``project_id``, ``location`` and ``cluster_name`` (with ``gcp_conn_id``, ``use_dns_endpoint``).
    :param delete_on_kill: delete the JobSet when the task is killed, marked failed or cleared while it
        runs, or when ``execution_timeout`` expires.
    :param delete_on_success: delete a Completed JobSet at once instead of leaving it to its TTL.
    :param log_tail_lines: lines of the workload log kept for the failure message and the XCom result.
    :param progress_interval: seconds between progress lines while nothing changes.
    :param deletion_timeout: how long to wait for a Failed JobSet's pods to go before resubmitting.
    """

    template_fields: Sequence[str] = ("manifest", "namespace", "cluster")
    template_fields_renderers = {"manifest": "json"}
    operator_extra_links = (JobSetWorkloadLink(), JobSetLogsLink())
    ui_color = "#d5e8f7"

    def __init__(
        self,
        *,
        manifest: dict | None = None,
        namespace: str = "default",
        cluster: ClusterTarget | None = None,
        delete_on_kill: bool = True,
        delete_on_success: bool = False,
        log_tail_lines: int = 100,
        progress_interval: float = 300,
        deletion_timeout: float = 600,
        **kwargs: Any,
    ) -> None:
        connection = {key: kwargs.pop(key) for key in ClusterTarget.KEYWORDS if key in kwargs}
        super().__init__(**kwargs)
        if cluster and connection:
            raise ValueError(f"{self.task_id}: give the cluster as cluster=, not also {sorted(connection)}")
        self.manifest = manifest
        self.namespace = namespace
        #: None until a subclass sets it (the pipeline's stages: from the run's params).
        self.cluster = ClusterTarget(**connection) if connection else cluster
        self.delete_on_kill = delete_on_kill
        self.delete_on_success = delete_on_success
        self.log_tail_lines = log_tail_lines
        self.progress_interval = progress_interval
        self.deletion_timeout = deletion_timeout
        #: The JobSet this task instance tracks: {"name", "namespace", "uid", "created"}.
        self.tracked: dict[str, str] | None = None

    # -- what subclasses may change ---------------------------------------------------------------

    def build_manifest(self, context: Context) -> dict:
        """The JobSet to run: a copy of ``manifest``."""
        if not self.manifest:
            raise ValueError(f"{self.task_id}: no JobSet manifest given")
        return copy.deepcopy(self.manifest)

    def before_jobset(self, context: Context) -> None:
        """Runs first in ``execute``, before the JobSet is submitted or adopted. It may skip or fail the task,
        or defer it: the method it resumes in continues with :meth:`run_jobset` once the way is clear."""

    def before_submit(self, context: Context) -> None:
        """Runs before a new JobSet is submitted (not when a running or Completed one is adopted, and before
        a Failed one is replaced); it may fail the task."""

    def trigger_kwargs(self) -> dict[str, Any]:
        """More keywords for the JobSet's trigger (serialised with it)."""
        return {}

    def after_failed(self, context: Context, event: dict[str, Any]) -> dict | None:
        """Runs when the JobSet Failed, before the task fails: it may submit a replacement and defer (a resume),
        or return the task's result (the work was done after all, e.g. with ``succeed``); None: the task fails
        with the JobSet's failure."""
        return None

    def after_stuck(self, context: Context, event: dict[str, Any]) -> None:
        """Runs when the trigger's watchdog deleted the JobSet (its ``stuck``: ``kind``, ``step``), before the task
        fails for a retry; it may fail the task for good (a retry would be stuck the same way)."""

    def after_completed(self, context: Context, event: dict[str, Any]) -> None:
        """Runs when the JobSet Completed, with the trigger's event (its ``evaluation_lines``, ``log_tail``);
        when a Completed JobSet of an earlier try was adopted (nothing watched it), the event has only the
        ``evaluation_lines`` its trigger recorded on it, or nothing."""

    def after_jobset_ended(self, context: Context) -> None:
        """Runs once the task knows its JobSet writes no more: Completed (adopted or awaited), Failed, or
        deleted while the task waited."""

    def on_tracked(self, context: Context, jobset: dict) -> None:
        """Runs once the task tracks ``jobset``, submitted by this try or adopted from an earlier one (the
        submitting try is in its annotation ``tpu-rl.dev/submitted-try``)."""

    def on_abandon(self, deleted: bool) -> None:
        """Runs when the task stops without seeing its JobSet end: a failure while submitting or adopting it
        (``deleted`` False: the JobSet may still run), or a kill or ``execution_timeout`` after which
        ``delete_on_kill`` deleted it (``deleted`` True; its pods may still be terminating)."""

    # -- hooks ------------------------------------------------------------------------------------

    @cached_property
    def hook(self) -> KubernetesApiHook:
        if self.cluster is None:
            raise ValueError(f"{self.task_id}: no cluster given")
        return KubernetesApiHook(self.cluster)

    # -- execution --------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict | None:
        self.before_jobset(context)
        return self.run_jobset(context)

    def run_jobset(self, context: Context) -> dict | None:
        """Adopt this task's JobSet if it runs or Completed, else submit it (replacing a Failed one only on a
        new try); then wait deferred until it ends."""
        try:
            return self._adopt_or_submit(context)
        except TaskDeferred:
            raise
        except BaseException:
            self.on_abandon(deleted=False)
            raise

    def _adopt_or_submit(self, context: Context) -> dict | None:
        manifest = self._identified(self.build_manifest(context), context)
        name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
        existing = self.hook.get_jobset(name, namespace)
        if existing and _adoptable(existing):
            return self._adopt(context, existing, manifest)
        self.before_submit(context)
        if existing:
            self._clear_for_submission(context, existing, manifest)
        created = self.hook.create_jobset(manifest, namespace)
        self.log.info("Submitted JobSet %s/%s (uid %s)", namespace, name, created["metadata"]["uid"])
        self._track(context, created)
        self._defer(context, created)
        return None

    def _adopt(self, context: Context, existing: dict, manifest: dict) -> dict | None:
        """Wait for a running JobSet of an earlier try, or finish with a Completed one."""
        self._check_ours(existing, manifest)
        self._track(context, existing)
        meta = existing["metadata"]
        condition = st.terminal_condition(existing)
        if condition is None:
            self.log.info(
                "Adopting running JobSet %s/%s (uid %s, submitted by try %s): not resubmitting",
                meta["namespace"],
                meta["name"],
                meta["uid"],
                _submitted_try(existing),
            )
            self._defer(context, existing)
            return None
        self.log.info("JobSet %s/%s already Completed: %s", meta["namespace"], meta["name"], condition.get("message"))
        # Nothing watches it now: the lines its trigger recorded on it (the evaluation) stand for the event's.
        kept = list((st.log_record(existing, meta["uid"]).get("kept") or {}).values())
        result = self._finish_success(existing, log_tail=[])
        self.after_completed(context, {"evaluation_lines": kept} if kept else {})
        self.after_jobset_ended(context)
        return result

    def _clear_for_submission(self, context: Context, existing: dict, manifest: dict) -> None:
        """Wait until a JobSet being deleted is gone; delete a Failed one, unless this try submitted it."""
        meta = existing["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
        if meta.get("deletionTimestamp"):
            self.log.info("JobSet %s/%s is being deleted; waiting until it is gone", namespace, name)
            self.hook.wait_until_gone(name, namespace, uid, self.deletion_timeout)
            return
        self._check_ours(existing, manifest)
        self._track(context, existing)
        failure = st.explain_failure(existing, [])
        try_number = context["ti"].try_number
        if try_number <= _submitted_try(existing):
            raise JobSetFailedError(failure)
        self.log.warning(
            "JobSet submitted by try %s failed; try %s replaces it.\n%s", _submitted_try(existing), try_number, failure
        )
        self.hook.delete_jobset(name, namespace, uid=uid)
        self.hook.wait_until_gone(name, namespace, uid, self.deletion_timeout)

    def _defer(self, context: Context, jobset: dict) -> None:
        self.defer(trigger=self._trigger(jobset), method_name="execute_complete", timeout=self._remaining_time(context))

    def _trigger(self, jobset: dict) -> BaseTrigger:
        """The wait for ``jobset``, on the cluster as this task reached it (a GKE cluster's endpoint resolved)."""
        from tpu_rl.triggers.jobset import JobSetTrigger

        cluster = self.cluster.with_endpoint(*self.hook.gke_endpoint) if self.cluster.is_gke else self.cluster
        replicated_job, container = st.log_source(jobset)
        meta = jobset["metadata"]
        return JobSetTrigger(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            log_replicated_job=replicated_job,
            log_container=container,
            cluster=cluster,
            progress_interval=self.progress_interval,
            log_tail_lines=self.log_tail_lines,
            delete_on_kill=self.delete_on_kill,
            **self.trigger_kwargs(),
        )

    def _remaining_time(self, context: Context) -> timedelta | None:
        """``execution_timeout`` counts from the task's start, deferral included: the trigger gets the rest."""
        if self.execution_timeout is None:
            return None
        from airflow.sdk import timezone

        started = context["ti"].start_date or timezone.utcnow()
        return max(self.execution_timeout - (timezone.utcnow() - started), timedelta(seconds=1))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict:
        """The trigger's event: the JobSet Completed, Failed or was deleted; in every case it writes no more, and
        ``after_jobset_ended`` runs on every way out of the task but a deferral (``after_failed`` submitted a
        replacement to wait for)."""
        self.tracked = {k: event[k] for k in ("name", "namespace", "uid")}
        ended = True
        try:
            if event["status"] == "failed" and (result := self.after_failed(context, event)) is not None:
                return result
            if event["status"] == "stuck":
                self.after_stuck(context, event)
            if event["status"] != "success":
                raise JobSetFailedError(event["message"])
            return self.succeed(context, event)
        except TaskDeferred:
            ended = False
            raise
        finally:
            if ended:
                self.after_jobset_ended(context)

    def succeed(self, context: Context, event: dict[str, Any]) -> dict:
        """The task's result for a JobSet whose work is done (its event): ``after_completed`` runs."""
        self.log.info("%s", event["message"])
        result = self._finish_success(
            {"metadata": self.tracked, "status": {"restarts": event.get("restarts", 0)}}, event["log_tail"]
        )
        self.after_completed(context, event)
        return result

    def _finish_success(self, jobset: dict, log_tail: list[str]) -> dict:
        meta = jobset["metadata"]
        if self.delete_on_success:
            self.hook.delete_jobset(meta["name"], meta["namespace"], uid=meta["uid"])
        return {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "state": "Completed",
            "restarts": int((jobset.get("status") or {}).get("restarts") or 0),
            "log_tail": log_tail,
        }

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context):
        """The scheduler resumes a deferred task whose trigger timed out (``execution_timeout``) with
        ``__fail__``: the base class raises TaskDeferralTimeout. Delete the JobSet before failing."""
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except TaskDeferralTimeout:
            self.tracked = self.tracked or context["ti"].xcom_pull(task_ids=self.task_id, key=XCOM_JOBSET)
            self.log.error("execution_timeout expired while waiting for JobSet %s", self.tracked)
            self.on_kill()
            raise

    def on_kill(self) -> None:
        """Called on SIGTERM or timeout while execute/execute_complete runs; while deferred, the trigger
        (when its task left the deferral) and resume_execution cover the same ground."""
        if not (self.delete_on_kill and self.tracked):
            return
        t = self.tracked
        if self.hook.delete_jobset(t["name"], t["namespace"], uid=t["uid"]):
            self.log.info("Deleted JobSet %s/%s (uid %s)", t["namespace"], t["name"], t["uid"])
        self.on_abandon(deleted=True)

    # -- identity ---------------------------------------------------------------------------------

    def _identified(self, manifest: dict, context: Context) -> dict:
        """The manifest with labels (sanitized, for selectors) and annotations (full values) naming the
        DAG run (with its named Airflow environment), task and try that submit it."""
        ti = context["ti"]
        meta = manifest.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            raise ValueError(f"{self.task_id}: the JobSet manifest needs metadata.name (stable for the run)")
        _check_pathways_name(manifest, name)
        meta["namespace"] = meta.get("namespace") or self.namespace
        run = RunIdentity(ti.dag_id, ti.run_id, environment=environment.current())
        labels = meta.setdefault("labels", {})
        for key, value in run.labels().items():  # a manifest built for the run's scope names its key already
            labels.setdefault(key, value)
        labels[LABEL_TASK_ID] = slug(ti.task_id, LABEL_VALUE_MAX) or "task"
        meta.setdefault("annotations", {}).update(
            {
                **run.annotations(),
                ANNOTATION_TASK_ID: ti.task_id,
                ANNOTATION_SUBMITTED_TRY: str(ti.try_number),
            }
        )
        return manifest

    def _check_ours(self, existing: dict, manifest: dict) -> None:
        """Never adopt or replace a JobSet that another DAG run or task submitted under the same name."""
        ours = manifest["metadata"]["annotations"]
        theirs = existing["metadata"].get("annotations") or {}
        keys = (ANNOTATION_DAG_ID, ANNOTATION_RUN_ID, ANNOTATION_TASK_ID)
        if any(theirs.get(k) != ours[k] for k in keys):
            found = {k: theirs.get(k) for k in keys}
            raise JobSetFailedError(
                f"JobSet {manifest['metadata']['namespace']}/{manifest['metadata']['name']} exists but was not "
                f"submitted by this task ({found}); refusing to adopt or replace it"
            )

    def _track(self, context: Context, jobset: dict) -> None:
        meta = jobset["metadata"]
        self.tracked = {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "created": meta.get("creationTimestamp", ""),
        }
        context["ti"].xcom_push(key=XCOM_JOBSET, value=self.tracked)
        self.on_tracked(context, jobset)

    def link_params(self) -> dict[str, str] | None:
        """What the extra links need, once a JobSet is tracked on a GKE cluster."""
        cluster = self.cluster
        if not (self.tracked and cluster and cluster.cluster_name):
            return None
        return {
            "project_id": cluster.project_id,
            "location": cluster.location,
            "cluster_name": cluster.cluster_name,
            "namespace": self.tracked["namespace"],
            "name": self.tracked["name"],
            "since": self.tracked.get("created", ""),
        }


def _adoptable(jobset: dict) -> bool:
    """Running or Completed, and not being deleted: a later try waits for it instead of submitting again."""
    condition = st.terminal_condition(jobset)
    return not jobset["metadata"].get("deletionTimestamp") and (condition is None or condition["type"] == st.COMPLETED)


def _check_pathways_name(manifest: dict, name: str) -> None:
    if (
        st.is_pathways(manifest)
        and len(name) > PATHWAYS_JOBSET_NAME_MAX
        and not (manifest.get("spec", {}).get("network", {}).get("subdomain"))
    ):
        raise ValueError(
            f"Pathways JobSet name {name!r} is longer than {PATHWAYS_JOBSET_NAME_MAX} characters: the "
            "coordinator address would exceed 63 characters and its Jobs would fail silently"
        )


def _submitted_try(jobset: dict) -> int:
    return int((jobset["metadata"].get("annotations") or {}).get(ANNOTATION_SUBMITTED_TRY) or 0)
