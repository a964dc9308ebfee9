"""Sensors that prove a stage's output in Cloud Storage is complete before the next stage uses it.

Deferrable by default: one check in the worker, then, when the output is not complete yet, the wait
happens in the triggerer, not in a worker slot. With
``deferrable=False`` they poke with the same check of :mod:`tpu_rl.hooks.gcs` that the trigger runs
(use ``mode="reschedule"`` to free the slot). Each sensor names its check of :mod:`tpu_rl.output_checks`
(:meth:`GcsOutputSensor.output_check`); the first check, the poke and the trigger all run that one object.
On timeout the task fails with the last list of what is missing.

The ``Run...`` sensors are the DAG's: the bucket, the prefix and the rule's values come from the run's
scope (:mod:`tpu_rl.run_scope`), resolved when the task renders, so the Rendered Template view shows them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from tpu_rl.compat import AirflowSensorTimeout
from tpu_rl.hooks.gcs import GcsReadHook
from tpu_rl.maxtext import export_files_beyond_the_converters
from tpu_rl.output_checks import FinalTrainingStep, HfExport, OrbaxStep, OutputCheck
from tpu_rl.run_scope import RunScope, RunScoped
from tpu_rl.timestamps import parse_optional_time

if TYPE_CHECKING:
    from airflow.sdk import Context


class GcsOutputSensor(BaseSensorOperator):
    """Waits until a check finds ``gs://<bucket>/<prefix>`` complete: deferred (the trigger runs the check)
    or poking (the sensor runs it).

    :param bucket: bucket name, without ``gs://``.
    :param prefix: the folder to check, ending in ``/``.
    :param timeout: how long to wait before failing with what is missing.
    :param poke_interval: seconds between checks.
    """

    template_fields: Sequence[str] = ("bucket", "prefix", "gcp_conn_id")
    ui_color = "#d7e8d4"

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str,
        gcp_conn_id: str = "google_cloud_default",
        deferrable: bool = True,
        timeout: timedelta | float = timedelta(minutes=30),
        poke_interval: timedelta | float = 60,
        **kwargs: Any,
    ) -> None:
        super().__init__(timeout=timeout, poke_interval=poke_interval, **kwargs)
        self.bucket = bucket
        self.prefix = prefix
        self.gcp_conn_id = gcp_conn_id
        self.deferrable = deferrable

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    def output_check(self) -> OutputCheck:
        """What to check, its arguments resolved now (templated fields are rendered)."""
        raise NotImplementedError

    def result(self, event: dict[str, Any]) -> Any:
        """The XCom return value of a complete output."""
        return event["uri"]

    def execute(self, context: Context) -> Any:
        if not self.prefix.endswith("/"):  # e.g. "None" from an XCom that was never pushed
            raise ValueError(f"prefix {self.prefix!r} is not a folder (it must end in '/')")
        if not self.deferrable:
            return super().execute(context)
        # Checked once before deferring: an output that is already whole (a conversion skipped because the
        # checkpoint was there, a training that just ended) needs no trigger and no second trip through the
        # scheduler.
        done = self.poke(context)
        if done:
            self.log.info("%s is complete", self.uri)
            return done.xcom_value
        from tpu_rl.triggers.checkpoints import GcsOutputTrigger

        trigger = GcsOutputTrigger(
            self.bucket,
            self.output_check(),
            deadline=time.time() + self.timeout,
            poll_interval=self.poke_interval,
            gcp_conn_id=self.gcp_conn_id,
        )
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        if event["status"] != "complete":
            raise AirflowSensorTimeout(event["message"])
        self.log.info("%s is complete", event["uri"])
        self._warn(event)
        return self.result(event)

    def poke(self, context: Context) -> bool | PokeReturnValue:
        verdict, found = GcsReadHook(self.gcp_conn_id).run_now(self.bucket, self.output_check())
        if not verdict.complete:
            self.log.info("%s not complete yet: %s", self.uri, verdict.describe())
            return False
        self._warn(found)
        return PokeReturnValue(True, self.result({"uri": self.uri, **found}))

    def _warn(self, found: dict[str, Any]) -> None:
        """What the check accepted but a person should know (a committed step whose leaves it could not find)."""
        if found.get("warning"):
            self.log.warning("%s: %s", self.uri, found["warning"])


class OrbaxCheckpointSensor(GcsOutputSensor):
    """Waits for an Orbax step folder (``prefix``, e.g. the converted checkpoint's ``.../0/``).

    :param items: item folders the step must hold (``["items"]`` for the converted checkpoint).

    XCom return value: the step folder's ``gs://`` URI.
    """

    def __init__(self, *, items: Sequence[str] = ("items",), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.items = list(items)

    def output_check(self) -> OutputCheck:
        return OrbaxStep(prefix=self.prefix, items=self.items)


class FinalTrainingCheckpointSensor(GcsOutputSensor):
    """Waits for the RL run's end-of-run checkpoint under ``prefix`` (``.../checkpoints/actor/``).

    The final step is resolved, never assumed: a run that dropped long prompts ends early.

    :param train_steps: the planned steps as MaxText computes them (``RunConfig.train_steps``).
    :param checkpoint_period: the run's ``checkpoint_period``.
    :param trainer_completed: whether the trainer printed its success line (templated; "True" when rendered):
        a normal exit, which tells an early end on a multiple of ``checkpoint_period`` from an interrupted run.

    XCom return value: the final step (int), for the export's ``actor/<step>/model_params/``.
    """

    template_fields: Sequence[str] = (
        *GcsOutputSensor.template_fields,
        "train_steps",
        "checkpoint_period",
        "trainer_completed",
    )

    def __init__(
        self,
        *,
        train_steps: int | str,
        checkpoint_period: int | str,
        items: Sequence[str] = ("model_params", "optimizer_state"),
        trainer_completed: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.train_steps = train_steps
        self.checkpoint_period = checkpoint_period
        self.items = list(items)
        self.trainer_completed = trainer_completed

    def output_check(self) -> OutputCheck:
        # Typed: templated fields render as strings.
        return FinalTrainingStep(
            prefix=self.prefix,
            train_steps=int(self.train_steps),
            checkpoint_period=int(self.checkpoint_period),
            items=self.items,
            trainer_completed=str(self.trainer_completed) == "True",
        )

    def result(self, event: dict[str, Any]) -> int:
        return int(event["step"])


class HfExportSensor(GcsOutputSensor):
    """Waits for a Hugging Face export under ``prefix`` (the export attempt's folder).

    :param not_before: ISO 8601 start of the export stage (templated); older objects are stale.
    :param also_required: files the export must hold besides its config, tokenizer and shards.

    XCom return value: the export folder's ``gs://`` URI.
    """

    template_fields: Sequence[str] = (*GcsOutputSensor.template_fields, "not_before")

    def __init__(self, *, not_before: str | None = None, also_required: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.not_before = not_before
        self.also_required = list(also_required)

    def output_check(self) -> OutputCheck:
        try:
            parse_optional_time(self.not_before)
        except ValueError:
            raise ValueError(f"not_before {self.not_before!r} is not an ISO 8601 time") from None
        return HfExport(prefix=self.prefix, not_before=self.not_before or None, also_required=self.also_required)


class _RunOutputSensor(RunScoped):
    """The run's bucket and Google Cloud connection, for a :class:`GcsOutputSensor`."""

    def resolve_scope(self, scope: RunScope, context: Any) -> None:
        self.bucket, self.gcp_conn_id = scope.config.gcs_bucket, scope.config.gcp_conn_id


class RunConvertedCheckpointSensor(_RunOutputSensor, OrbaxCheckpointSensor):
    """The DAG's ``verify_converted``: the shared base checkpoint's step folder of the run's model."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(bucket="", prefix="", **kwargs)

    def resolve_scope(self, scope: RunScope, context: Any) -> None:
        super().resolve_scope(scope, context)
        self.prefix = scope.layout.converted_step_prefix


class RunFinalTrainingCheckpointSensor(_RunOutputSensor, FinalTrainingCheckpointSensor):
    """The DAG's ``verify_training``: the run's actor checkpoints, its planned steps and checkpoint period."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(bucket="", prefix="", train_steps=0, checkpoint_period=0, **kwargs)

    def resolve_scope(self, scope: RunScope, context: Any) -> None:
        super().resolve_scope(scope, context)
        self.prefix = scope.layout.actor_checkpoints_prefix
        self.train_steps, self.checkpoint_period = scope.config.train_steps, scope.config.checkpoint_period


class RunHfExportSensor(_RunOutputSensor, HfExportSensor):
    """The DAG's ``verify_export``: in the run's bucket (the attempt's prefix comes from the export's XCom), with
    the model's ``generation_config.json`` when its repository has one."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(bucket="", **kwargs)

    def resolve_scope(self, scope: RunScope, context: Any) -> None:
        super().resolve_scope(scope, context)
        if files := export_files_beyond_the_converters(scope.config):
            self.also_required = files
