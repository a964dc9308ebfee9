"""The JSON objects several runs write at once (leases, the training record, the conversion lock) against the
GCS emulator: a write conditioned on the generation it read, so no run's change is lost to another's."""

import threading

from tpu_rl.hooks.gcs import GcsJsonObject


def test_runs_updating_one_record_at_once_lose_no_change(bucket):
    record = GcsJsonObject(bucket.client, bucket.name, "run/tpu_rl_training_record.json")
    assert record.read_or_create({"preemptions": []}) == (True, None)
    assert record.read_or_create({"preemptions": ["never written"]}) == (False, {"preemptions": []})

    def add(entry: int) -> None:
        record.update(lambda document: {"preemptions": [*document["preemptions"], entry]}, attempts=50)

    writers = [threading.Thread(target=add, args=(n,)) for n in range(6)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert sorted(record.read().document()["preemptions"]) == list(range(6))


def test_a_write_from_a_stale_read_is_refused(bucket):
    lease = GcsJsonObject(bucket.client, bucket.name, "leases/cluster/c.json")
    assert lease.read() is None
    assert lease.write({"holders": ["a"]}, generation=0)
    first = lease.read()
    assert lease.write({"holders": ["a", "b"]}, generation=first.generation)
    assert not lease.write({"holders": []}, generation=first.generation)  # another run wrote since
    assert lease.read().document() == {"holders": ["a", "b"]}
    # (A delete at a stale generation is refused by GCS; fake-gcs-server 1.x ignores ifGenerationMatch on deletes,
    # so that refusal is not tested here.)
    assert lease.delete(lease.read().generation) and lease.read() is None
