"""What a run reports of its training: the quality gate before the export, the figures the published Asset
event carries, and the summary its last task prints (and sends, with a notifier connection).

The figures come from the XComs of the tasks that saw them: ``train_rl`` (the evaluation, the preemptions),
``delete_tpu_pools`` (when each slice's nodes existed), ``verify_training`` (the final step), ``publish_export``
(the model's URI).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseOperator

from tpu_rl import training_metrics as tm
from tpu_rl.compat import AirflowFailException
from tpu_rl.contract import (
    CAPACITY_CANDIDATES,
    FINAL_STEP,
    PUBLISHED_MODEL,
    SLICE_TIMES,
    TRAINING_CAPACITY,
    TRAINING_EVALUATION,
    TRAINING_PREEMPTIONS,
    Pull,
)
from tpu_rl.preemption import describe_accounting
from tpu_rl.run_scope import RunScope, RunScoped


def pull(context: Any, what: Pull) -> Any:
    """An XCom of the contract, from the task that pushed it."""
    return context["ti"].xcom_pull(task_ids=what.task, key=what.key)


@dataclass(frozen=True)
class TrainingFigures:
    """The training's evaluation and TPU cost, as the run's tasks recorded them."""

    evaluation: tm.Evaluation | None
    cost: dict[str, Any] | None

    @classmethod
    def of(cls, context: Any, scope: RunScope) -> TrainingFigures:
        evaluation = tm.Evaluation.from_dict(pull(context, TRAINING_EVALUATION))
        slices = pull(context, SLICE_TIMES)
        cost = tm.tpu_cost(slices, scope.config) if slices is not None and scope.config.tpu_pools_per_run else None
        return cls(evaluation, cost)

    def event_extra(self, scope: RunScope) -> dict[str, Any]:
        """For the Asset event: ``evaluation`` (``before``/``after`` figures, or None with the reason) and
        ``tpu`` (chip-hours, cost, price and slices, or None with the reason)."""
        config = scope.config
        return {
            "evaluation": self.evaluation.to_dict() if self.evaluation and config.evaluation_batches else None,
            "evaluation_note": tm.describe_evaluation(self.evaluation, config),
            "tpu": self.cost,
            "tpu_note": tm.describe_cost(self.cost, config),
        }


class QualityGateOperator(RunScoped, BaseOperator):
    """The run's quality gate (``min_post_accuracy``, ``require_no_regression``) on the trainer's evaluation,
    before anything is exported: a model that fails it is never published, and the run fails with both sets
    of figures. The training's checkpoints stay (they may still be wanted). Without a gate it only logs the
    evaluation."""

    ui_color = "#fde9c9"

    def execute(self, context: Any) -> None:
        scope = self.bind_scope(context)
        evaluation = TrainingFigures.of(context, scope).evaluation
        self.log.info("%s", tm.describe_evaluation(evaluation, scope.config))
        if scope.config.require_no_regression and (note := tm.regression_note(evaluation)):
            self.log.info("require_no_regression passes: %s", note)
        reasons = tm.quality_gate(evaluation, scope.config)
        if reasons:
            # The figures will not change on a retry: fail at once.
            raise AirflowFailException(
                "The trained model fails the quality gate, so it is not exported or published (its checkpoints "
                f"stay under {scope.uri(scope.layout.actor_checkpoints_prefix)}): " + "; ".join(reasons)
            )


class RunSummaryOperator(RunScoped, BaseOperator):
    """The run's last task (``pipeline_done``): it runs when the work succeeded, so its state is the work's
    outcome, and logs one block (final step, evaluation before and after, TPU chip-hours and cost, the
    model's URI), returned as its XCom. With ``notify_conn_id`` set, the block is also mailed to
    ``notify_to`` through the SMTP provider's notifier (the sender: the connection's ``from_email``); a
    failed notification is logged, never fatal."""

    ui_color = "#d8f0d8"

    def execute(self, context: Any) -> str:
        scope = self.bind_scope(context)
        figures = TrainingFigures.of(context, scope)
        final_step = pull(context, FINAL_STEP)
        summary = tm.run_summary(
            final_step=int(final_step) if final_step is not None else None,
            evaluation=figures.evaluation,
            cost=figures.cost,
            model_uri=pull(context, PUBLISHED_MODEL),
            config=scope.config,
            preemptions=describe_accounting(pull(context, TRAINING_PREEMPTIONS)),
            capacity=(pull(context, TRAINING_CAPACITY) or pull(context, CAPACITY_CANDIDATES) or {}).get("lines") or (),
        )
        self.log.info("%s", summary)
        if scope.config.notify_conn_id:
            self._notify(context, scope, summary)
        return summary

    def _notify(self, context: Any, scope: RunScope, summary: str) -> None:
        from html import escape

        config = scope.config
        try:  # Also the import: an environment without the SMTP provider still ends the run as it went.
            from airflow.providers.smtp.notifications.smtp import SmtpNotifier

            SmtpNotifier(
                to=config.notify_to,
                smtp_conn_id=config.notify_conn_id,
                subject=f"{scope.run.dag_id} {scope.run.run_id}: done",
                html_content=f"<pre>{escape(summary)}</pre>",
            ).notify(context)
        except Exception as error:  # The model is published: a mail that cannot go out does not undo that.
            self.log.warning("Could not send the summary through connection %s: %s", config.notify_conn_id, error)
        else:
            self.log.info("Sent the summary to %s through connection %s", config.notify_to, config.notify_conn_id)
