"""GKE's long-running operations, awaited deferred: the base of every operator that asks GKE to change the
cluster or its node pools. It submits, defers on one operation still running (``triggers.gke.GkeOperationTrigger``,
no worker slot), submits again when it is done, and waits out what GKE refuses for now.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import BaseOperator

from tpu_rl import gke
from tpu_rl.compat import AirflowException, AirflowFailException
from tpu_rl.config import RunConfig
from tpu_rl.hooks.gke import GkeRefusedError
from tpu_rl.run_scope import RunScoped

OPERATION_POLL_SECONDS = 10
#: After GKE refused a request for throttling (or while busy with an operation it does not list), how long to wait
#: before asking again; and after how many refusals in a row (about 20 minutes) the task fails.
REFUSED_RETRY_SECONDS = 30
REFUSED_RETRIES = 40


class AwaitsGkeOperations(RunScoped, BaseOperator):
    """Defers on GKE long-running operations, one deferral at a time: an operator submits what it can
    (``submit(context, step)``: the TPU pools' creates and deletes all at once, since GKE runs operations on
    different node pools side by side; the cluster's operations one after another, since GKE refuses any other
    operation during one of them), defers on one operation still running, and submits again when it is done.

    :param poll_interval: seconds between the trigger's checks of an operation.
    :param refused_retry_interval: seconds before a request GKE refused for throttling is asked again.
    """

    def __init__(
        self,
        *,
        poll_interval: float = OPERATION_POLL_SECONDS,
        refused_retry_interval: float = REFUSED_RETRY_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.poll_interval = poll_interval
        self.refused_retry_interval = refused_retry_interval

    def submit(self, context: Any, step: int, **wait: Any) -> Any:
        """Submits operation ``step`` onwards (skipping what exists); defers on the first one submitted.
        ``wait``: what an operator carries from one deferral to the next (the capacity deadline)."""
        raise NotImplementedError

    def _wait_for(self, config: RunConfig, operation_name: str) -> dict[str, Any]:
        """The keywords of a wait for GKE's operation ``operation_name`` in the run's project and region (a
        ``triggers.gke.GkeOperationTrigger``, or its pool-create subclass with its own keywords added)."""
        return {
            "operation_name": operation_name,
            "project_id": config.project,
            "location": config.region,
            "gcp_conn_id": config.gcp_conn_id,
            "poll_interval": self.poll_interval,
        }

    def _await(
        self, config: RunConfig, operation_name: str, next_step: int | None = None, method_name: str = "operation_done"
    ) -> None:
        from tpu_rl.triggers.gke import GkeOperationTrigger

        self.defer(
            trigger=GkeOperationTrigger(**self._wait_for(config, operation_name)),
            method_name=method_name,
            kwargs={"next_step": next_step},
        )

    def wait_out(self, refused: GkeRefusedError, what: str, refusals: int, **wait: Any) -> None:
        """Defers until GKE takes a refused request again, then submits again (:meth:`resubmit`): through the
        operation that blocks it (the run's own, or GKE's: a control-plane upgrade, an auto-repair), or
        ``refused_retry_interval`` when GKE throttles. Fails after :data:`REFUSED_RETRIES` refusals in a row, and at
        once when IAM refuses (the message names the permission and the role to grant)."""
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger

        from tpu_rl.triggers.gke import GkeOperationTrigger

        if refused.refusal is gke.Refusal.PERMISSION:  # no wait grants a role
            raise AirflowFailException(f"GKE refused to {what}: {refused.message}")
        if refusals >= REFUSED_RETRIES:
            raise AirflowException(
                f"GKE refused to {what} {refusals} times in a row: {refused.message}; fix: see the message (GKE "
                "runs at most 5 operations at once on a cluster, and refuses most while its own upgrade or repair "
                "runs); a retry of this task asks again."
            )
        config, kwargs = self.scope.config, {**wait, "refusals": refusals + 1}
        if (blocking := refused.blocking) is not None:
            self.log.info(
                "GKE refuses to %s while operation %s (%s) runs (%s): waiting for it",
                what,
                blocking.name,
                blocking.operation_type.name,
                refused.message,
            )
            trigger: Any = GkeOperationTrigger(**self._wait_for(config, blocking.name))
        else:
            self.log.warning(
                "GKE refuses to %s for now (%s: %s): asking again in %.0f s",
                what,
                refused.refusal,
                refused.message,
                self.refused_retry_interval,
            )
            trigger = DateTimeTrigger(moment=datetime.now(UTC) + timedelta(seconds=self.refused_retry_interval))
        self.defer(trigger=trigger, method_name="resubmit", kwargs=kwargs)

    def resubmit(self, context: Any, event: Any = None, **wait: Any) -> Any:
        """After the wait for a refused request: submits again. The blocking operation's outcome is not the run's
        to judge (GKE's upgrade, another pool's create)."""
        return self.submit(context, 0, **wait)

    def operation_done(self, context: Any, event: dict[str, Any], next_step: int | None = None, **wait: Any) -> Any:
        if event["status"] in ("failed", "error"):
            raise AirflowException(f"GKE operation {event.get('operation_name')} failed: {event['message']}")
        # The trigger reports every DONE operation as a success; GKE marks a failed one (a stockout,
        # a missing reservation) DONE with an error: read it.
        operation = self.bind_scope(context).gke.get_operation(event["operation_name"])
        if operation.error.code or operation.status_message:
            message = operation.error.message or operation.status_message
            return self.operation_failed(context, operation, message, next_step=next_step, **wait)
        self.log.info(
            "GKE operation %s (%s %s) is done",
            operation.name,
            operation.operation_type.name,
            operation.target_link.rsplit("/projects/", 1)[-1],
        )
        if next_step is not None:
            return self.submit(context, next_step, **wait)

    def operation_failed(self, context: Any, operation: Any, message: str, next_step: int | None, **wait: Any) -> None:
        """A DONE operation with an error: fails the task, or (a subclass) tries again."""
        raise AirflowException(f"GKE operation {operation.name} ({operation.operation_type.name}) failed: {message}")
