"""The preflight stage: before the bucket, the cluster or a pool exists, what Compute Engine says of the project is
held against what the run will ask for (``tpu_rl.project_check`` reads and judges, with ``tpu_rl.preflight``)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from tpu_rl.compat import AirflowFailException
from tpu_rl.contract import Task
from tpu_rl.preflight import report_lines
from tpu_rl.project_check import check_project
from tpu_rl.run_scope import RunScoped


class PreflightOperator(RunScoped, BaseOperator):
    """Fails the run, without retries, when the project cannot give it what it needs (every capacity candidate's
    reservation or TPU quota refused, or the CPU quota of the cluster's pools short), each problem with its fix;
    pushes the candidates it left out, which ``create_tpu_pools`` never tries, and what it could not check."""

    ui_color = "#e8f4fd"

    def execute(self, context: Any) -> dict[str, Any]:
        scope = self.bind_scope(context)
        if self._run_is_past_it(context):
            # The run started under a version without this stage: Airflow adds the new task to a running run,
            # whose own pools the quotas would now count against it.
            self.log.info("The run had created its resources before this stage existed: nothing to check")
            return {"skipped": {}, "warnings": []}
        result = check_project(scope.config, scope.run, scope.compute)
        if result is None:
            self.log.info("The run creates no cluster and no TPU pool: nothing to check")
            return {"skipped": {}, "warnings": []}
        for line in report_lines(result):
            (self.log.info if line.endswith(": ok") else self.log.warning)("Preflight: %s", line)
        if not result.passed:
            raise AirflowFailException(result.failure())
        return {
            "skipped": {str(index): why for index, why in result.skipped.items()},
            "warnings": [str(w) for w in result.all_warnings()],
        }

    @staticmethod
    def _run_is_past_it(context: Any) -> bool:
        """Whether the run's ``ensure_bucket`` has a state: the run went past where this stage stands."""
        ti = context["ti"]
        states = getattr(ti, "get_task_states", None)
        if states is None:  # a task instance without the Task SDK's reads (the operator run outside Airflow)
            return False
        found = states(dag_id=ti.dag_id, task_ids=[Task.ENSURE_BUCKET], run_ids=[ti.run_id])
        return (found.get(ti.run_id) or {}).get(Task.ENSURE_BUCKET) not in (None, "none", "removed")
