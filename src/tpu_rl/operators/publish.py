"""Publishing the verified Hugging Face export: copied to the model's final location, checked, and announced
with an Asset event. :class:`RunPublishHfExportOperator` is the DAG's task, on the run's bucket and prefixes.

Its Cloud Storage calls are in :mod:`tpu_rl.hooks.gcs`, imported where they are used: the DAG file imports
this module at parse time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from tpu_rl.compat import AirflowException
from tpu_rl.run_scope import RunScope, RunScoped

if TYPE_CHECKING:
    from airflow.sdk import Asset, Context


class PublishHfExportOperator(BaseOperator):
    """Copies a verified export attempt to the model's final location and emits its Asset event.

    Stale objects at the destination (an earlier, larger export) are deleted first; objects are copied
    server-side (rewrite), and the destination is compared with the source by names and sizes before
    the event tells downstream DAGs the model is there.

    :param bucket: bucket name, without ``gs://``.
    :param source_prefix: the verified attempt, ``GcsLayout.export_attempt_prefix(n)``.
    :param destination_prefix: ``GcsLayout.export_prefix``.
    :param asset: the Asset downstream DAGs schedule on; also declared as this task's outlet.
    :param final_step: the training step exported (the final checkpoint sensor's XCom).
    :param source_run: ``gs://`` URI of the training run the model comes from.
    :param event_extra: more keys for the Asset event's extra (a program's run adds its data interval).

    XCom return value: the published ``gs://`` URI. Asset event extra: ``uri``, ``final_step``, ``source_run``
    and ``event_extra``.
    """

    template_fields: Sequence[str] = (
        "bucket",
        "source_prefix",
        "destination_prefix",
        "final_step",
        "source_run",
        "gcp_conn_id",
    )

    def __init__(
        self,
        *,
        bucket: str,
        source_prefix: str,
        destination_prefix: str,
        asset: Asset,
        final_step: int | str,
        source_run: str,
        gcp_conn_id: str = "google_cloud_default",
        event_extra: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(outlets=[asset], **kwargs)
        self.bucket = bucket
        self.source_prefix = source_prefix
        self.destination_prefix = destination_prefix
        self.asset = asset
        self.final_step = final_step
        self.source_run = source_run
        self.gcp_conn_id = gcp_conn_id
        self.event_extra = event_extra or {}

    def execute(self, context: Context) -> str:
        from tpu_rl.hooks import gcs

        source, destination = self.source_prefix, self.destination_prefix
        if not (source.endswith("/") and destination.endswith("/")):
            raise ValueError("source_prefix and destination_prefix must be folders ending in '/'")
        if source.startswith(destination) or destination.startswith(source):
            raise ValueError(f"{source} and {destination} overlap")
        bucket = gcs.GcsBucketHook(self.bucket, self.gcp_conn_id)

        expected = bucket.object_sizes(source)
        if not expected:
            raise AirflowException(f"Nothing to publish under gs://{self.bucket}/{source}")
        stale = bucket.object_sizes(destination)
        bucket.delete_objects([destination + name for name in stale])
        self.log.info("Cleared %d objects at gs://%s/%s", len(stale), self.bucket, destination)
        for name in expected:
            bucket.rewrite_object(source + name, destination + name)
        published = bucket.object_sizes(destination)
        if published != expected:
            differ = sorted(n for n in expected.keys() | published.keys() if expected.get(n) != published.get(n))
            raise AirflowException(f"Published copy differs from the verified export in: {differ[:10]}")

        uri = f"gs://{self.bucket}/{destination}"
        context["outlet_events"][self.asset].extra = {
            "uri": uri,
            "final_step": int(self.final_step),
            "source_run": self.source_run,
            **self.event_extra,
        }
        self.log.info("Published %d objects to %s", len(published), uri)
        return uri


class RunPublishHfExportOperator(RunScoped, PublishHfExportOperator):
    """The DAG's ``publish_export``: into the run's bucket and export prefix, naming the run's training folder
    as the source (the verified attempt and the final step come from XCom). Its event's extra adds the
    training's evaluation and TPU cost (:meth:`~tpu_rl.operators.run_report.TrainingFigures.event_extra`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(bucket="", destination_prefix="", source_run="", **kwargs)

    def resolve_scope(self, scope: RunScope, context: Any) -> None:
        from tpu_rl.operators.run_report import TrainingFigures

        layout = scope.layout
        self.bucket, self.gcp_conn_id = scope.config.gcs_bucket, scope.config.gcp_conn_id
        self.destination_prefix, self.source_run = layout.export_prefix, layout.uri(layout.training_prefix)
        self.event_extra = TrainingFigures.of(context, scope).event_extra(scope)
        if scope.interval:
            self.event_extra.update(
                data_interval_start=scope.interval.start.isoformat(), data_interval_end=scope.interval.end.isoformat()
            )
