"""Decisions about stage outputs in Cloud Storage: check finished work, refuse bad resumes, publish.
(The lock on shared work and the reads of the output checks are in :mod:`tpu_rl.hooks.gcs`.)

Google provider imports stay inside methods: the DAG file imports this module at parse time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from tpu_rl.checkpoints import Verdict, training_record_changes
from tpu_rl.compat import AirflowException, AirflowFailException
from tpu_rl.hooks import gcs
from tpu_rl.hooks.gcs import GcsReadHook
from tpu_rl.run_scope import RunScope, RunScoped

if TYPE_CHECKING:
    from airflow.sdk import Asset, Context


def orbax_step_verdict(
    bucket: str,
    prefix: str,
    items: Sequence[str] = ("items",),
    gcp_conn_id: str = "google_cloud_default",
    impersonation_chain: str | Sequence[str] | None = None,
) -> tuple[str, Verdict]:
    """One check, now, of an Orbax step folder (``prefix``, e.g. ``.../0/``): its URI and the verdict."""
    verdict, _ = GcsReadHook(gcp_conn_id, impersonation_chain).run_now(
        bucket, lambda reader: gcs.orbax_step(reader, prefix, list(items))
    )
    return f"gs://{bucket}/{prefix}", verdict


def check_training_record(
    bucket: str,
    record_object: str,
    parameters: Mapping[str, Any],
    log: Any,
    gcp_conn_id: str = "google_cloud_default",
    impersonation_chain: str | Sequence[str] | None = None,
) -> str:
    """Records a run's training parameters next to its checkpoints on the first attempt, and refuses
    (AirflowFailException) any later attempt whose parameters differ. Returns the record's URI."""
    uri = f"gs://{bucket}/{record_object}"
    current = json.loads(json.dumps(dict(parameters)))  # As it reads back from JSON.
    client = gcs.storage_client(gcp_conn_id, impersonation_chain)
    created, stored = gcs.read_or_create_json(client, bucket, record_object, {"parameters": current})
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
        impersonation_chain: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.bucket = bucket
        self.record_object = record_object
        self.parameters = parameters
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain

    def execute(self, context: Context) -> str:
        return check_training_record(
            self.bucket, self.record_object, self.parameters, self.log, self.gcp_conn_id, self.impersonation_chain
        )


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

    XCom return value: the published ``gs://`` URI. Asset event extra: ``uri``, ``final_step``, ``source_run``.
    """

    template_fields: Sequence[str] = (
        "bucket", "source_prefix", "destination_prefix", "final_step", "source_run", "gcp_conn_id"
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
        impersonation_chain: str | Sequence[str] | None = None,
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
        self.impersonation_chain = impersonation_chain

    def execute(self, context: Context) -> str:
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        source, destination = self.source_prefix, self.destination_prefix
        if not (source.endswith("/") and destination.endswith("/")):
            raise ValueError("source_prefix and destination_prefix must be folders ending in '/'")
        if source.startswith(destination) or destination.startswith(source):
            raise ValueError(f"{source} and {destination} overlap")
        hook = GCSHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)
        client = hook.get_conn()

        def sizes(prefix: str) -> dict[str, int]:
            return {b.name[len(prefix) :]: b.size for b in client.list_blobs(self.bucket, prefix=prefix)}

        expected = sizes(source)
        if not expected:
            raise AirflowException(f"Nothing to publish under gs://{self.bucket}/{source}")
        stale = sizes(destination)
        for name in stale:
            hook.delete(self.bucket, destination + name)
        self.log.info("Cleared %d objects at gs://%s/%s", len(stale), self.bucket, destination)
        for name in expected:
            hook.rewrite(self.bucket, source + name, self.bucket, destination + name)
        published = sizes(destination)
        if published != expected:
            differ = sorted(n for n in expected.keys() | published.keys() if expected.get(n) != published.get(n))
            raise AirflowException(f"Published copy differs from the verified export in: {differ[:10]}")

        uri = f"gs://{self.bucket}/{destination}"
        context["outlet_events"][self.asset].extra = {
            "uri": uri,
            "final_step": int(self.final_step),
            "source_run": self.source_run,
        }
        self.log.info("Published %d objects to %s", len(published), uri)
        return uri


class RunPublishHfExportOperator(RunScoped, PublishHfExportOperator):
    """The DAG's ``publish_export``: into the run's bucket and export prefix, naming the run's training folder
    as the source (the verified attempt and the final step come from XCom)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(bucket="", destination_prefix="", source_run="", **kwargs)

    def resolve_scope(self, scope: RunScope, context: Any) -> None:
        layout = scope.layout
        self.bucket, self.gcp_conn_id = scope.config.gcs_bucket, scope.config.gcp_conn_id
        self.destination_prefix, self.source_run = layout.export_prefix, layout.uri(layout.training_prefix)
