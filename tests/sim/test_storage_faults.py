"""Cloud Storage's transient errors (sim/storage_faults.py: the front before the emulator answers 503 and 429 as
Cloud Storage does) and the package's hooks, which make such a request again with backoff: the async reader of
the triggers and sensors (gcloud-aio retries nothing itself) and the bucket hook of the operators."""

from __future__ import annotations

import uuid

import pytest

from sim import storage_faults

pytestmark = pytest.mark.sim


@pytest.fixture
def bucket(sim, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", sim.env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    name = f"faults-{uuid.uuid4().hex[:8]}"
    created = sim.gcs.create_bucket(name)
    created.blob("run/record.json").upload_from_string('{"step": 7}')
    yield name
    storage_faults.clear_faults()
    for blob in created.list_blobs():
        blob.delete()
    created.delete()


def test_a_read_gets_past_503s_and_429s_and_fails_with_the_answer_when_they_never_end(bucket):
    from aiohttp import ClientResponseError

    from tpu_rl.hooks.gcs import GcsReadHook

    storage_faults.set_fault("test-503", "unavailable", bucket=bucket, times=2)
    storage_faults.set_fault("test-429", "throttle", bucket=bucket, times=1)
    hook = GcsReadHook()
    assert hook.run_now(bucket, lambda reader: reader.read_json("run/record.json")) == {"step": 7}
    faults = storage_faults.list_faults()
    assert (faults["test-503"]["applied"], faults["test-429"]["applied"]) == (2, 1)

    storage_faults.set_fault("test-down", "unavailable", bucket=bucket)  # never passes
    with pytest.raises(ClientResponseError) as refused:
        hook.run_now(bucket, lambda reader: reader.list("run/"))
    assert refused.value.status == 503
    assert storage_faults.list_faults()["test-down"]["applied"] == 5  # five tries in all


def test_the_operators_bucket_hook_gets_past_503s_and_a_delete_that_already_happened(bucket):
    from tpu_rl.hooks.gcs import GcsBucketHook

    hook = GcsBucketHook(bucket)
    storage_faults.set_fault("test-503", "unavailable", bucket=bucket, times=2)
    assert hook.object_sizes("run/") == {"record.json": 11}
    assert storage_faults.list_faults()["test-503"]["applied"] == 2
    hook.move_folder("run/", "kept/")
    hook.delete_objects(["kept/record.json", "kept/record.json"])  # the second finds it gone: not an error
    assert hook.object_sizes("") == {}


def test_a_missing_object_is_answered_as_cloud_storage_answers_it(bucket, sim):
    """fake-gcs-server says "Not Found"; Cloud Storage says "No such object: BUCKET/OBJECT", which clients read:
    the google provider's remote task logs take a first upload's failed read for a missing log only with it, and
    refused to write any task log to the emulator before the front said it."""
    from google.api_core.exceptions import NotFound

    blob = sim.gcs.bucket(bucket).blob("logs/dag_id=d/attempt=1.log")
    for read in (blob.download_as_bytes, blob.reload):
        with pytest.raises(NotFound, match=f"No such object: {bucket}/logs/dag_id=d/attempt=1.log"):
            read()
