"""The run's scope: what one task execution of a DAG run works with, resolved once from the task's context.

:class:`RunScope` holds the run's params and identity, and derives from them, once, the validated
:class:`~tpu_rl.config.RunConfig`, the :class:`~tpu_rl.layout.GcsLayout`, the cluster to reach and the hooks a
task execution calls (GKE, the cluster's Kubernetes API, the bucket and the output checks' reads), each made once.
The config is rebuilt in every task from the run's params (deterministic, and nothing passes through XCom).

:class:`RunScoped` gives it to the pipeline's operators and sensors (in the manner of the Google
provider's ``GKEOperatorMixin``): ``bind_scope(context)`` at each entry (template rendering, ``execute``,
a resume after a deferral) builds it the first time and returns the same object after; ``self.scope``
reads it anywhere else, ``on_kill`` included. After rendering, :meth:`RunScoped.resolve_scope` fills the
operator's templated fields with the concrete values of the run, so the Rendered Template view shows them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tpu_rl import environment
from tpu_rl.config import RunConfig
from tpu_rl.layout import GcsLayout, training_record
from tpu_rl.run import DataInterval, RunIdentity

if TYPE_CHECKING:
    from tpu_rl.hooks.compute import ComputeApiHook
    from tpu_rl.hooks.gcs import GcsBucketHook, GcsReadHook
    from tpu_rl.hooks.gke import GkeApiHook
    from tpu_rl.hooks.kubernetes import ClusterTarget, KubernetesApiHook


@dataclass(frozen=True)
class RunScope:
    """The run's params and identity, and the task instance's try; the rest derived once, on first use.

    :param params: the run's params (the trigger form's values).
    :param run: the DAG run's identity, with the Airflow environment the task runs in.
    :param task_id: the task, and
    :param try_number: its try (None outside a task instance, e.g. in the GKE operator tests).
    """

    params: Mapping[str, Any] = field(repr=False)
    run: RunIdentity
    task_id: str | None = None
    try_number: int | None = None
    interval: DataInterval | None = None

    @classmethod
    def of(cls, context: Any) -> RunScope:
        ti = context.get("ti")
        interval = _program_interval(context)
        return cls(
            dict(context["params"]),
            RunIdentity(
                context["dag"].dag_id,
                context["run_id"],
                interval.start.isoformat() if interval else None,
                environment.current(),  # the worker's, when the task runs: what the run's marks name
            ),
            getattr(ti, "task_id", None),
            getattr(ti, "try_number", None),
            interval,
        )

    @cached_property
    def config(self) -> RunConfig:
        """The validated config, with the run's interval data filled in (raises
        :class:`~tpu_rl.config.ConfigError` for params that cannot work)."""
        return RunConfig.from_params(dict(self.params)).for_interval(self.interval)

    @cached_property
    def layout(self) -> GcsLayout:
        return GcsLayout(self.config, self.run)

    @cached_property
    def cluster_target(self) -> ClusterTarget:
        from tpu_rl.hooks.kubernetes import ClusterTarget

        return ClusterTarget.for_run(self.config)

    @cached_property
    def gke(self) -> GkeApiHook:
        """The GKE API of the run's project and region, one client per task execution."""
        from tpu_rl.hooks.gke import GkeApiHook

        return GkeApiHook(self.config.gcp_conn_id, self.config.project, self.config.region)

    @cached_property
    def compute(self) -> ComputeApiHook:
        """Compute Engine's reads of the preflight, through the run's Google connection."""
        from tpu_rl.hooks.compute import ComputeApiHook

        return ComputeApiHook(self.config.gcp_conn_id)

    @cached_property
    def kubernetes(self) -> KubernetesApiHook:
        """The Kubernetes API of the run's cluster, one client per task execution."""
        from tpu_rl.hooks.kubernetes import KubernetesApiHook

        return KubernetesApiHook(self.cluster_target)

    @cached_property
    def storage_reads(self) -> GcsReadHook:
        """The reads of the output checks, through the run's Google connection."""
        from tpu_rl.hooks.gcs import GcsReadHook

        return GcsReadHook(self.config.gcp_conn_id)

    @cached_property
    def bucket(self) -> GcsBucketHook:
        """The run's bucket, one storage client per task execution: its JSON objects (leases, the training
        record, the conversion lock) and the folder moves of a preemption's resume."""
        from tpu_rl.hooks.gcs import GcsBucketHook

        return GcsBucketHook(self.config.gcs_bucket, self.config.gcp_conn_id)

    @cached_property
    def training_record(self) -> dict[str, Any]:
        return training_record(self.config)

    def uri(self, prefix: str) -> str:
        return self.layout.uri(prefix)


#: Run types whose outputs belong to their data interval (a manual run's belong to the run).
INTERVAL_RUN_TYPES = ("scheduled", "backfill")
#: Intervals counted at most, from the DAG's start date to a run's interval.
MAX_INTERVALS_COUNTED = 100_000


def _program_interval(context: Any) -> DataInterval | None:
    """The data interval of a scheduled or backfilled run, with its index among the DAG's intervals."""
    dag_run, start = context.get("dag_run"), context.get("data_interval_start")
    run_type = getattr(dag_run, "run_type", None)
    if str(getattr(run_type, "value", run_type)) not in INTERVAL_RUN_TYPES or start is None:
        return None
    return DataInterval(start, context["data_interval_end"], _interval_index(context["dag"], start))


def _interval_index(dag: Any, start: Any) -> int:
    """How many of the DAG's intervals (its cron schedule from its start date) begin before ``start``."""
    from croniter import croniter

    from tpu_rl.compat import cron_expression

    fire_times = croniter(cron_expression(dag.timetable), dag.start_date - timedelta(microseconds=1))
    for index in range(MAX_INTERVALS_COUNTED):
        if fire_times.get_next(datetime) >= start:
            return index
    raise ValueError(f"{dag.dag_id}: more than {MAX_INTERVALS_COUNTED} intervals before {start}")


class RunScoped:
    """Mixin for the pipeline's operators and sensors: the run's :class:`RunScope`, resolved once per task
    execution.

    Entry points bind it: rendering, ``execute`` and ``resume_execution`` here; a subclass that defines
    its own ``execute`` (or ``poke``) starts it with ``scope = self.bind_scope(context)``.
    """

    _run_scope: RunScope | None = None

    def bind_scope(self, context: Any) -> RunScope:
        """The scope of this task execution: built from ``context`` the first time, the same object after
        (an operator object reused for another run or try, as tests do, gets a new one)."""
        scope = RunScope.of(context)
        if self._run_scope != scope:
            self._run_scope = scope
            self.resolve_scope(scope, context)
        return self._run_scope

    @property
    def scope(self) -> RunScope:
        if self._run_scope is None:
            raise RuntimeError(f"{type(self).__name__}: the run's scope is read before bind_scope(context)")
        return self._run_scope

    def resolve_scope(self, scope: RunScope, context: Any) -> None:
        """Called once per bound scope: set the fields that come from the run's config (the Rendered
        Template view shows them), and forget anything derived from a previous scope."""

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        super().render_template_fields(context, jinja_env)  # type: ignore[misc]
        self._run_scope = None  # Rendering may have replaced fields resolved before: resolve them again.
        self.bind_scope(context)

    def execute(self, context: Any, **kwargs: Any) -> Any:
        self.bind_scope(context)
        return super().execute(context, **kwargs)  # type: ignore[misc]

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Any) -> Any:
        self.bind_scope(context)
        return super().resume_execution(next_method, next_kwargs, context)  # type: ignore[misc]
