"""The package's reader of TensorBoard event files (tpu_rl.event_files) against TensorBoard's own loader, on
files written by tensorboardX as MaxText's writer writes them and in the other forms a scalar takes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tpu_rl import event_files

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

# TensorBoard is a test dependency only: the package does not need it (requirements.txt).
EventFileLoader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader").EventFileLoader
tensor_util = pytest.importorskip("tensorboard.util.tensor_util")

#: The wall time of the first record written by TensorBoard's own writer here, and the seconds between records.
STAMP, SECONDS = 1_764_583_200.123456, 30.5


def _write(tmp_path: Path, form: str = "simple_value") -> bytes:
    """An event file of 10 scalars and a text summary: written by tensorboardX's ``add_scalar`` (what MaxText's
    writer does: ``simple_value``, stamped with the time of writing), or by TensorBoard's own scalar summary (a
    rank-0 tensor of the dtype, stamped every :data:`SECONDS` from :data:`STAMP`)."""
    import numpy as np

    folder = tmp_path / form
    points = [
        (tag, value, step)
        for step in range(1, 6)
        for tag, value, step in (
            ("actor/train/loss", 1.0 / step, step),
            ("rewards/train/sum", step * 0.25 - 3, step - 1),
        )
    ]
    if form == "simple_value":
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(logdir=str(folder))
        for tag, value, step in points:
            writer.add_scalar(tag, value, step)
        writer.add_text("notes", "not a scalar", 0)
        writer.close()
    else:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
        writer = EventFileWriter(str(folder))
        for index, (tag, value, step) in enumerate(points):
            if form == "tensor_content":  # the packed bytes of the value, as a tensor of any size is written
                tensor = tensor_util.make_tensor_proto(np.array(value, dtype="float32"))
                tensor.ClearField("float_val")
                tensor.tensor_content = np.array(value, dtype="float32").tobytes()
            else:
                tensor = tensor_util.make_tensor_proto(np.array(value, dtype=form))
            summary = Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])
            writer.add_event(Event(step=step, wall_time=STAMP + SECONDS * index, summary=summary))
        writer.close()
    (path,) = folder.iterdir()
    return path.read_bytes()


def _tensorboard_scalars(data: bytes, tmp_path: Path) -> list[tuple[int, str, float, float]]:
    path = tmp_path / "events.out.tfevents.copy"
    path.write_bytes(data)
    return [
        (event.step, value.tag, float(tensor_util.make_ndarray(value.tensor).item()), event.wall_time)
        for event in EventFileLoader(str(path)).Load()
        for value in event.summary.value
        if value.metadata.plugin_data.plugin_name == "scalars"
    ]


def _ours(data: bytes) -> list[tuple[int, str, float, float]]:
    return [(s.step, s.tag, s.value, s.wall_time) for s in event_files.scalars(data)]


@pytest.mark.parametrize("form", ["simple_value", "float32", "float64", "float16", "int64", "tensor_content"])
def test_reads_the_scalars_tensorboard_reads(tmp_path, form):
    data = _write(tmp_path, form)

    ours = _ours(data)

    assert ours == _tensorboard_scalars(data, tmp_path)
    assert len(ours) == 10 and ("actor/train/loss", 5) in {(tag, step) for step, tag, _, _ in ours}
    wall_times = [wall_time for *_, wall_time in ours]
    assert wall_times == sorted(wall_times) and wall_times[0] > 1_700_000_000  # POSIX seconds, as written


def test_the_wall_time_is_the_writers_to_the_microsecond(tmp_path):
    """The ETA's pace comes from these times: the double is read whole (a float32 would round it to 128 s)."""
    data = _write(tmp_path, "float32")

    assert [wall_time for *_, wall_time in _ours(data)] == [STAMP + SECONDS * index for index in range(10)]


def test_a_file_cut_while_its_writer_flushes_yields_the_whole_records_before_the_cut(tmp_path):
    data = _write(tmp_path)
    whole = _ours(data)

    for cut in (len(data) - 1, len(data) * 2 // 3, len(data) // 2, 20):
        read = _ours(data[:cut])
        assert read == whole[: len(read)] == _tensorboard_scalars(data[:cut], tmp_path)
        if cut < len(data) * 2 // 3 + 1:
            assert len(read) < len(whole)


def test_a_damaged_record_ends_the_reading_instead_of_yielding_a_wrong_value(tmp_path):
    data = bytearray(_write(tmp_path))
    whole = _ours(bytes(data))
    data[len(data) // 2] ^= 0xFF  # inside some record: its CRC no longer matches

    damaged = _ours(bytes(data))

    assert len(damaged) < len(whole) and damaged == whole[: len(damaged)]


def test_the_package_reads_event_files_without_tensorboard():
    """Cloud Composer's images do not all satisfy TensorBoard's protobuf and grpcio requirements: the package
    must read (not only import) without it."""
    probe = (
        "import sys, tpu_rl.training_metrics as tm, sim_writer; "
        "print(len(tm.read_scalars([sim_writer.data()])[tm.LOSS_TAG]), "
        "sorted(m for m in sys.modules if m.startswith('tensorboard')))"
    )
    writer = "import base64\ndef data():\n    return base64.b64decode(%r)\n"
    import base64
    import tempfile

    from tensorboardX import SummaryWriter

    with tempfile.TemporaryDirectory() as folder:
        w = SummaryWriter(logdir=folder)
        w.add_scalar("actor/train/loss", 0.5, 1)
        w.close()
        (path,) = Path(folder).iterdir()
        encoded = base64.b64encode(path.read_bytes()).decode()
        module = Path(folder) / "sim_writer.py"
        module.write_text(writer % encoded)
        out = subprocess.run(
            [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {folder!r}); {probe}"],
            capture_output=True,
            text=True,
            check=True,
            cwd="/",
        )
    assert out.stdout.split() == ["1", "[]"]
