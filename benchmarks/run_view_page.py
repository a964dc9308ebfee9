"""What the Training tab costs the api-server on a long run: the page's time, the bytes it reads, the memory.

A trainer's event file of ``--hours`` of training (a step every ``--step-seconds``, the tags MaxText logs, written
with its writer, tensorboardX's SummaryWriter, by ``sim.maxtext_outputs``, each step stamped at the trainer's pace)
is served by an in-memory bucket that answers as Cloud Storage does: a listing with sizes and generations, ranged
reads, and each flush of the writer a new generation of the whole, longer file. The page is viewed once, then
``--views`` more times, the trainer appending ``--steps-between`` steps before each (a page that reloads itself
every minute while a step takes 45 s). A view is what the api-server does for ``GET /runs/...`` once the run is
read from the database: the event files read (``run_view_app.read_event_files``, its Cloud Storage hook replaced by
the in-memory bucket), the page built and rendered (``run_view.run_page``, ``run_view.render``).

Two ways, each in a fresh interpreter (twice: once timed, once under tracemalloc, which slows allocation):
``kept``, the api-server's kept folders (``tpu_rl.run_view_events``), and ``fresh``, a new ``EventFileFolder`` per
view, as before them (every event file listed, downloaded whole and parsed at each view). Printed: the first
view's time, the later views' median and longest, the bytes read per view, the peak resident memory (VmHWM) and
its growth over the process before its first view (the bucket's bytes are in it from the start), tracemalloc's
peak of the views and what stays allocated after them. It asserts nothing.

    python -m benchmarks.run_view_page [--hours 72] [--step-seconds 45] [--views 30] [--steps-between 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PREFIX = "qwen3-30b-a3b/trained/run/rl/tensorboard/"
STARTED = 1_764_583_200


class MemoryBucket:
    """One growing event file as Cloud Storage serves it: each flush a new generation; counts what is read."""

    def __init__(self, name: str, data: bytes, size: int) -> None:
        self.name, self.data, self.size, self.generation = name, data, size, 1
        self.requests = self.bytes_read = 0

    def flush_to(self, size: int) -> None:
        self.size, self.generation = size, self.generation + 1

    async def list(self, prefix: str, delimiter: str | None = None) -> tuple[dict[str, Any], list[str]]:
        from datetime import UTC, datetime

        from tpu_rl.checkpoints import StoredObject

        self.requests += 1
        updated = datetime.fromtimestamp(STARTED + self.generation, UTC)
        return {self.name: StoredObject(self.name, self.size, updated, self.generation)}, []

    async def read(self, name: str, first: int | None = None, last: int | None = None) -> bytes:
        self.requests += 1
        piece = self.data[: self.size][first or 0 : None if last is None else last + 1]
        self.bytes_read += len(piece)
        return piece


def write_event_file(hours: float, step_seconds: float, more_steps: int) -> dict[str, Any]:
    """The trainer's event file up to ``hours`` of training and ``more_steps`` further, and each step's size."""
    from sim.maxtext_outputs import growing_event_file, training_scalars

    steps = int(hours * 3600 / step_seconds)
    total = steps + more_steps
    scalars = training_scalars("long-run", total, range(1, total + 1))
    name, data, sizes = growing_event_file(scalars, lambda step: STARTED + 600 + step_seconds * step)
    return {"name": name, "data": data, "sizes": dict(sizes), "steps": steps, "train_steps": total}


def page_view(bucket: MemoryBucket, config: Any, layout: Any, read_events: Any) -> str:
    from tpu_rl import run_view

    files = asyncio.run(read_events(layout.bucket, layout.tensorboard_prefix, config.gcp_conn_id))
    page = run_view.run_page(
        dag_id="maxtext_rl_tpu",
        run_id="manual__long",
        state="running",
        config=config,
        layout=layout,
        files=files,
        xcoms=run_view.RunXComs(),
        now=STARTED + 80 * 3600,
    )
    return run_view.render(page)


def measure(mode: str, source: Path, views: int, steps_between: int, traced: bool) -> dict[str, Any]:
    """In this interpreter: the first view and ``views`` later ones, ``mode`` ``kept`` or ``fresh``."""
    from tpu_rl import run_view_app
    from tpu_rl.hooks.gcs import EventFileFolder, GcsReadHook
    from tpu_rl.run import RunIdentity
    from tpu_rl.run_scope import RunScope

    written = pickle.loads(source.read_bytes())
    conf = json.loads((REPO / "include/examples/tutorial.json").read_text())
    # As many GRPO iterations of each batch as the long run's steps need (the tutorial's prompts are too few).
    iterations = -(-written["train_steps"] // 100)
    conf |= {"num_batches": 100, "extra_train_args": {**conf.get("extra_train_args", {}), "num_iterations": iterations}}
    scope = RunScope(conf, RunIdentity("maxtext_rl_tpu", "manual__long"))
    config, layout = scope.config, scope.layout
    step = written["steps"]
    bucket = MemoryBucket(PREFIX + written["name"], written["data"], written["sizes"][step])

    async def run(hook: Any, bucket_name: str, check: Any) -> Any:
        return await check(bucket)

    GcsReadHook.run = run  # the api-server's reads go to the in-memory bucket

    async def fresh_folder(bucket_name: str, prefix: str, gcp_conn_id: str) -> Any:
        folder = EventFileFolder(prefix)
        await folder.refresh(bucket)
        return folder.scalars()

    read_events = run_view_app.read_event_files if mode == "kept" else fresh_folder
    before = _rss_kib()
    if traced:
        tracemalloc.start()
    times, reads = [], []
    for view in range(views + 1):
        if view:
            step += steps_between
            bucket.flush_to(written["sizes"][step])
        read_before, started = bucket.bytes_read, time.perf_counter()
        html = page_view(bucket, config, layout, read_events)
        times.append(time.perf_counter() - started)
        reads.append(bucket.bytes_read - read_before)
    assert f'data-step="{step}"' in html, "the page shows the last step"
    figures = {"file_bytes": bucket.size, "steps": step, "times": times, "reads": reads, "requests": bucket.requests}
    if traced:
        kept, peak = tracemalloc.get_traced_memory()
        figures |= {"traced_peak": peak, "traced_kept": kept}
    return figures | {"rss_before_kib": before, "rss_peak_kib": _status_kib("VmHWM"), "rss_after_kib": _rss_kib()}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _rss_kib() -> int:
    return _status_kib("VmRSS")


def in_fresh_interpreter(mode: str, source: Path, args: argparse.Namespace, traced: bool) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.run_view_page",
        "--measure",
        mode,
        "--source",
        str(source),
        "--views",
        str(args.views),
    ]
    command += ["--steps-between", str(args.steps_between)] + (["--traced"] if traced else [])
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True, cwd=REPO)
    return json.loads(done.stdout.splitlines()[-1])


def report(mode: str, timed: dict[str, Any], traced: dict[str, Any]) -> None:
    later, reads = timed["times"][1:], timed["reads"]
    rss = {key: timed[f"rss_{key}_kib"] / 1024 for key in ("before", "peak", "after")}
    print(
        f"{mode:6}  first view {timed['times'][0]:6.3f} s, later views median {statistics.median(later):6.3f} s "
        f"(longest {max(later):.3f} s)\n"
        f"        read: first view {reads[0] / 1e6:.2f} MB, later views {statistics.median(reads[1:]):,.0f} bytes "
        f"each; {timed['requests'] / len(timed['times']):.1f} requests a view\n"
        f"        RSS before the views {rss['before']:.0f} MiB, peak {rss['peak']:.0f} MiB "
        f"(+{rss['peak'] - rss['before']:.0f}), after {rss['after']:.0f} MiB; tracemalloc: peak "
        f"{traced['traced_peak'] / 2**20:.1f} MiB, kept {traced['traced_kept'] / 2**20:.1f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=72)
    parser.add_argument("--step-seconds", type=float, default=45)
    parser.add_argument("--views", type=int, default=30)
    parser.add_argument("--steps-between", type=int, default=2)
    parser.add_argument("--measure", choices=("kept", "fresh"), help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.source, args.views, args.steps_between, args.traced)))
        return
    started = time.perf_counter()
    written = write_event_file(args.hours, args.step_seconds, args.views * args.steps_between)
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "event-file.pickle"
        source.write_bytes(pickle.dumps(written))
        print(
            f"{args.hours:g} hours at a step every {args.step_seconds:g} s: {written['steps']} steps, an event file of "
            f"{written['sizes'][written['steps']] / 1e6:.1f} MB (written in {time.perf_counter() - started:.0f} s); "
            f"then {args.views} views, {args.steps_between} steps added before each"
        )
        for mode in ("fresh", "kept"):
            report(mode, *(in_fresh_interpreter(mode, source, args, traced) for traced in (False, True)))


if __name__ == "__main__":
    main()
