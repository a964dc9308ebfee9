"""The Training tab's event files between page views: each file parsed only for the bytes its writer added (the same
curves as a whole reading), the api-server's kept folders (a later view reads a listing and the new bytes, a
replaced file is read again, views at the same time each get the whole curves) and their bounds."""

from __future__ import annotations

import asyncio
import random
import struct
from datetime import UTC, datetime, timedelta

import pytest

from sim.maxtext_outputs import tensorboard_event_file, training_scalars
from tpu_rl import training_metrics as tm
from tpu_rl.checkpoints import StoredObject
from tpu_rl.run_view_events import EventFileCache

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

PREFIX = "qwen3-30b-a3b/trained/run/rl/tensorboard/"
NAME = "events.out.tfevents.1764583200.head-0"


def event_file(steps: range, seed: str = "run") -> bytes:
    return tensorboard_event_file(training_scalars(seed, 100, steps), lambda step: 1_764_583_200 + 45 * step)[1]


def record_ends(data: bytes) -> list[int]:
    ends, offset = [], 0
    while offset < len(data):
        offset += 16 + struct.unpack_from("<Q", data, offset)[0]
        ends.append(offset)
    return ends


def read_in_pieces(data: bytes, cuts: list[int]) -> tm.GrowingEventFile:
    growing = tm.GrowingEventFile()
    for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
        growing.feed(data[start:end])
    return growing


# --- one file, read as it grows ---------------------------------------------------------------------------


def test_a_file_read_in_pieces_cut_anywhere_gives_the_curves_of_a_whole_reading():
    data = event_file(range(1, 61))
    ends = record_ends(data)
    rng = random.Random(7)
    inside_a_header, inside_a_record = ends[10] + 5, (ends[20] + ends[21]) // 2
    for attempt in range(20):
        cuts = sorted({inside_a_header, inside_a_record, *rng.sample(range(1, len(data)), 1 + attempt)})
        growing = read_in_pieces(data, cuts)
        assert growing.scalars() == tm.read_scalars([data]), cuts
        assert growing.size == len(data) and growing.stream.kept == 0
    for cut in (inside_a_header, inside_a_record):  # what a reading stopped at the cut shows, and no more
        assert read_in_pieces(data[:cut], [cut // 3]).scalars() == tm.read_scalars([data[:cut]])


def test_steps_logged_again_later_in_the_file_take_the_later_values_read_in_pieces_or_whole():
    """Records of steps 20 to 30 again after step 30 (two writers' records one after the other): the later win."""
    first, again = event_file(range(1, 31)), event_file(range(20, 41), seed="again")
    data = first + again
    whole = tm.read_scalars([data])

    growing = read_in_pieces(data, [len(first) - 50, len(first) + 999, len(first) + len(again) // 2])

    assert growing.scalars() == whole
    assert dict(whole[tm.LOSS_TAG])[25] == dict(tm.read_scalars([again])[tm.LOSS_TAG])[25]


def test_only_a_record_cut_short_is_kept_between_pieces_not_the_bytes_read():
    data = event_file(range(1, 61))
    ends = record_ends(data)
    growing = read_in_pieces(data[: ends[30] + 7], [ends[10], ends[20] + 3])

    assert growing.stream.kept == 7  # the next record's first bytes
    assert growing.scalars()[tm.LOSS_TAG][-1][0] < 60


def test_a_damaged_record_ends_the_reading_of_a_growing_file_as_of_a_whole_one():
    data = bytearray(event_file(range(1, 61)))
    data[len(data) // 2] ^= 0xFF
    data = bytes(data)

    growing = read_in_pieces(data, [len(data) // 4, len(data) // 2 + 1, len(data) * 3 // 4])

    assert growing.scalars() == tm.read_scalars([data])
    assert growing.stream.damaged and growing.stream.kept == 0  # nothing kept of what no byte can mend


# --- the api-server's kept folders --------------------------------------------------------------------------


class Bucket:
    """Event files as Cloud Storage serves them, each write a new generation; counts what a view costs."""

    def __init__(self) -> None:
        self.objects: dict[str, StoredObject] = {}
        self.data: dict[str, bytes] = {}
        self.lists = self.reads = self.bytes_read = 0

    def write(self, name: str, data: bytes) -> None:
        generation = max((o.generation for o in self.objects.values()), default=1000) + 1
        at = datetime(2026, 12, 1, tzinfo=UTC) + timedelta(minutes=generation - 1000)
        self.objects[name], self.data[name] = StoredObject(name, len(data), at, generation), data

    async def list(self, prefix: str, delimiter: str | None = None):
        self.lists += 1
        return {name[len(prefix) :]: obj for name, obj in self.objects.items() if name.startswith(prefix)}, []

    async def read(self, name: str, first: int | None = None, last: int | None = None) -> bytes:
        await asyncio.sleep(0)  # another view's turn, as while a download is under way
        self.reads += 1
        data = self.data[name][first or 0 : None if last is None else last + 1]
        self.bytes_read += len(data)
        return data


@pytest.fixture
def bucket(monkeypatch) -> Bucket:
    """The api-server's reads of the run's bucket go to a :class:`Bucket`; its kept folders start empty."""
    from tpu_rl import run_view_app
    from tpu_rl.hooks.gcs import GcsReadHook

    served = Bucket()

    async def run(hook, bucket_name, check):
        return await check(served)

    monkeypatch.setattr(GcsReadHook, "run", run)
    monkeypatch.setattr(run_view_app, "EVENT_FILES", EventFileCache())
    return served


def view(bucket: Bucket, *prefixes: str) -> list[dict[str, tm.Scalars]]:
    """Page views of the runs under ``prefixes``, at the same time."""
    from tpu_rl.run_view_app import read_event_files

    async def views():
        return await asyncio.gather(*(read_event_files("b", prefix, "google_cloud_default") for prefix in prefixes))

    return asyncio.run(views())


def test_a_later_view_reads_the_listing_and_only_the_bytes_the_trainer_added(bucket):
    data = event_file(range(1, 101))
    ends = record_ends(data)
    bucket.write(PREFIX + NAME, data[: ends[600] + 9])  # flushed in the middle of a record
    (first,) = view(bucket, PREFIX)
    read_first = bucket.bytes_read

    bucket.write(PREFIX + NAME, data)  # the writer's next flush: the whole, longer file
    (later,) = view(bucket, PREFIX)
    (unchanged,) = view(bucket, PREFIX)

    assert first[NAME] == tm.read_scalars([data[: ends[600] + 9]])
    assert later[NAME] == unchanged[NAME] == tm.read_scalars([data])
    assert bucket.bytes_read - read_first == len(data) - (ends[600] + 9)  # each byte read once
    assert (bucket.lists, bucket.reads) == (3, 2)  # the last view: a listing alone


def test_a_file_replaced_by_another_not_longer_is_read_again_from_its_first_byte(bucket):
    bucket.write(PREFIX + NAME, event_file(range(1, 41)))
    view(bucket, PREFIX)
    shorter = event_file(range(1, 11), seed="another")
    bucket.write(PREFIX + NAME, shorter)

    (after,) = view(bucket, PREFIX)

    assert after[NAME] == tm.read_scalars([shorter])


def test_a_file_no_longer_in_the_bucket_leaves_the_page(bucket):
    gone = NAME.replace("head-0", "head-1")
    bucket.write(PREFIX + NAME, event_file(range(1, 11)))
    bucket.write(PREFIX + gone, event_file(range(1, 11), seed="other"))
    view(bucket, PREFIX)
    del bucket.objects[PREFIX + gone]

    (after,) = view(bucket, PREFIX)

    assert list(after) == [NAME]


def test_views_of_one_run_at_the_same_time_each_show_every_step(bucket):
    data = event_file(range(1, 101))
    ends = record_ends(data)
    bucket.write(PREFIX + NAME, data[: ends[300]])
    view(bucket, PREFIX)
    bucket.write(PREFIX + NAME, data)

    results = view(bucket, PREFIX, PREFIX, PREFIX)

    assert all(result[NAME] == tm.read_scalars([data]) for result in results)
    assert bucket.bytes_read == len(data)


def test_the_folders_kept_are_the_most_recently_viewed_within_the_bounds(bucket):
    from tpu_rl import run_view_app

    cache = run_view_app.EVENT_FILES = EventFileCache(max_folders=2, max_points=10_000_000)
    runs = [f"run-{n}/tensorboard/" for n in range(3)]
    for run in runs:
        bucket.write(run + NAME, event_file(range(1, 11), seed=run))
    for run in (runs[0], runs[1], runs[0], runs[2]):
        view(bucket, run)
    assert len(cache) == 2
    reads = bucket.reads
    view(bucket, runs[0])  # kept: the second most recent
    assert bucket.reads == reads
    view(bucket, runs[1])  # dropped when run-2 came: read again
    assert bucket.reads == reads + 1

    small = run_view_app.EVENT_FILES = EventFileCache(max_folders=10, max_points=1)
    view(bucket, runs[0])
    view(bucket, runs[1])
    assert len(small) == 1  # over the points alone, the run just viewed stays


def test_a_listing_gives_each_objects_generation():
    """What tells a file written again from one read before: Cloud Storage's listing item has ``generation``."""
    from tpu_rl.hooks.gcs import GcsReader

    class Storage:
        async def list_objects(self, bucket: str, params: dict) -> dict:
            item = {"name": PREFIX + NAME, "size": "120", "updated": "2026-12-01T10:00:00.000Z"}
            return {"items": [{**item, "generation": "1764583200123456"}]}

    listing, _ = asyncio.run(GcsReader(Storage(), "b").list(PREFIX))

    assert listing[NAME].generation == 1764583200123456 and listing[NAME].size == 120
