"""What the emulated MaxText stages write, in the real stages' layouts (part of the simulation, never imported by
plugins/). sim/maxtext_stages.py decides what each stage writes; this module writes it.

- Cloud Storage: :class:`Bucket`, a gs:// prefix in the GCS emulator. A missing bucket, or a missing input
  (load_parameters_path with no objects), fails the pod (exit code 1).
- Orbax checkpoints (/work/shared/reference/maxtext.md): a step's PyTree items without OCDBT (_METADATA,
  _sharding, one zarr v2 folder per leaf), then _CHECKPOINT_METADATA, then commit_success.txt last.
- What train_rl reports: one TensorBoard event file per attempt, written with MaxText's writer (tensorboardX's
  SummaryWriter) with MaxText's tags, one scalar per trained step (docs/reference/training-metrics.md), uploaded in
  growing versions as its flushes upload it; the evaluation lines before and after training.
- The HF export's weights: real safetensors files.
- Container logs: CRI-format files under .sim/podlogs/<ns>/<pod>/<container>.log, printed over the pod's run time
  when big and rotated as GKE's kubelet rotates them.

:class:`PodFailure` is how the emulated process fails, here and in the stages.
"""

import json
import math
import os
import random
import struct
import threading
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path

SIM = Path(os.environ.get("SIM", Path(__file__).resolve().parent.parent / ".sim"))


class PodFailure(Exception):
    """The emulated process fails: the pod gets this exit code (and, when its host was taken, a DisruptionTarget
    reason)."""

    def __init__(self, message, exit_code=1, disruption=None, lines=()):
        super().__init__(message)
        self.exit_code = exit_code
        self.disruption = disruption
        #: What the process logged before it failed.
        self.lines = list(lines)


class PodHangs(Exception):
    """The emulated process stops making progress and never exits (a trainer hung before its first step or stalled
    after step N): the pod stays Running, its log ends with what it printed until then."""

    def __init__(self, message, lines=()):
        super().__init__(message)
        self.lines = list(lines)


# ---------------------------------------------------------------- GCS writer


def split_gs(url):
    if not url.startswith("gs://"):
        raise PodFailure(f"not a gs:// path: {url}")
    bucket, _, path = url[5:].partition("/")
    return bucket, path.strip("/")


class Bucket:
    """A gs:// prefix in the GCS emulator; ``written`` lists what a stage wrote under it, for the pod's summary."""

    def __init__(self, client, url):
        from google.api_core.exceptions import NotFound

        name, self.root = split_gs(url)
        self.url = url.rstrip("/")
        try:
            self.bucket = client.get_bucket(name)
        except NotFound:
            raise PodFailure(f"bucket gs://{name} does not exist") from None
        self.written = []

    def key(self, rel):
        return f"{self.root}/{rel}" if self.root else rel

    def put(self, rel, data, content_type="application/octet-stream"):
        if isinstance(data, (dict, list)):
            data, content_type = json.dumps(data, indent=1).encode(), "application/json"
        elif isinstance(data, str):
            data, content_type = data.encode(), "text/plain"
        self.bucket.blob(self.key(rel)).upload_from_string(data, content_type=content_type)
        self.written.append(rel)

    def exists(self, rel):
        return self.bucket.blob(self.key(rel)).exists()

    def names(self, rel=""):
        prefix = self.key(rel).rstrip("/") + "/" if (self.root or rel) else ""
        return [b.name[len(prefix) :] for b in self.bucket.list_blobs(prefix=prefix)]

    def delete_prefix(self, rel):
        for blob in list(self.bucket.list_blobs(prefix=self.key(rel).rstrip("/") + "/")):
            blob.delete()


def require_input(client, url, what):
    bucket_name, path = split_gs(url)
    bucket = client.bucket(bucket_name)
    if not any(True for _ in client.list_blobs(bucket, prefix=path.rstrip("/") + "/", max_results=1)):
        raise PodFailure(f"{what} {url} not found")


# ---------------------------------------------------------------- Orbax layout

LEAVES = [
    ("token_embedder", "embedding"),
    ("decoder", "decoder_norm", "scale"),
    ("decoder", "layers", "self_attention", "query", "kernel"),
    ("decoder", "layers", "self_attention", "out", "kernel"),
    ("decoder", "layers", "moe_block", "gate", "kernel"),
    ("decoder", "logits_dense", "kernel"),
]


def write_item(out, item, keypaths, drop_leaf):
    """One Orbax PyTree item without OCDBT: _METADATA, _sharding and one zarr v2 folder per leaf."""
    tree = {}
    for i, keypath in enumerate(keypaths):
        tree[str(tuple(keypath))] = {
            "key_metadata": [{"key": k, "key_type": 2} for k in keypath],
            "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False, "write_shape": [4, 4]},
        }
        if drop_leaf and i == len(keypaths) - 1:
            continue
        leaf = f"{item}/{'.'.join(keypath)}"
        out.put(
            f"{leaf}/.zarray",
            {
                "chunks": [4, 4],
                "compressor": {"id": "zstd", "level": 1},
                "dtype": "bfloat16",
                "fill_value": 0,
                "filters": None,
                "order": "C",
                "shape": [4, 4],
                "zarr_format": 2,
                "dimension_separator": ".",
            },
        )
        out.put(f"{leaf}/0.0", bytes(range(32)))
    out.put(f"{item}/_sharding", {str(tuple(k)): {"sharding_type": "NamedSharding"} for k in keypaths})
    out.put(
        f"{item}/_METADATA",
        {
            "tree_metadata": tree,
            "use_zarr3": False,
            "use_ocdbt": False,
            "store_array_data_equal_to_fill_value": True,
            "custom_metadata": None,
        },
    )


def write_step(out, step_dir, items, custom, faults_):
    """A checkpoint step: items first, then _CHECKPOINT_METADATA, then commit_success.txt (last)."""
    init = time.time_ns()
    for item, keypaths in items.items():
        write_item(out, f"{step_dir}/{item}", keypaths, "drop-leaf" in faults_)
    committed = "skip-commit" not in faults_
    out.put(
        f"{step_dir}/_CHECKPOINT_METADATA",
        {
            "item_handlers": {
                item: "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
                for item in items
            },
            "metrics": {},
            "performance_metrics": {},
            "init_timestamp_nsecs": init,
            "commit_timestamp_nsecs": time.time_ns() if committed else None,
            "custom_metadata": custom,
        },
    )
    if committed:
        out.put(f"{step_dir}/commit_success.txt", f"Checkpoint commit was successful to {out.url}/{step_dir}")


def committed_steps(out, directory):
    steps = set()
    for name in out.names(directory):
        step, _, rest = name.partition("/")
        if step.isdigit() and rest == "commit_success.txt":
            steps.add(int(step))
    return steps


# -------------------------------------------------------- what train_rl reports (docs/reference/training-metrics.md)

#: MaxText 0.2.4's default reward functions and what each pays for a completion (configs/post_train/rl.yml:
#: reward_exact_format_match 0.1, reward_partial_format_match 0.0, reward_exact_answer 1.0).
REWARDS = {"match_format_exactly": 0.1, "match_format_approximately": 0.0, "check_numbers": 1.0}
#: Completions scored per emulated step (a real batch has batch_size x rl.num_generations).
COMPLETIONS_PER_STEP = 16


def _skill(progress, start, end):
    """A rate that rises from ``start`` to ``end`` as training progresses (0..1), fast at first."""
    return start + (end - start) * (1 - math.exp(-3 * progress)) / (1 - math.exp(-3))


def training_scalars(seed, train_steps, steps):
    """What the trainer logs for the policy updates ``steps`` (1-based), as {tag: [(step, value)]}.

    Each step scores a batch of completions drawn with an answer accuracy and a format rate that rise
    with training, and derives every tag from that batch as Tunix does; so the reward rises noisily and
    the loss falls. The same seed gives the same curves: a resumed attempt continues the crashed one's."""
    import numpy as np

    scalars = {}

    def put(tag, step, value):
        scalars.setdefault(tag, []).append((step, float(value)))

    for step in steps:
        progress = step / train_steps
        rng = np.random.default_rng([zlib.crc32(seed.encode()), step])
        correct = rng.random(COMPLETIONS_PER_STEP) < _skill(progress, 0.3, 0.7)
        formatted = rng.random(COMPLETIONS_PER_STEP) < _skill(progress, 0.5, 0.95)
        paid = {"match_format_exactly": formatted, "match_format_approximately": formatted, "check_numbers": correct}
        rewards = np.stack([REWARDS[name] * paid[name] for name in REWARDS], axis=1)  # completions x functions
        per_completion = rewards.sum(axis=1)
        scored_at = step - 1  # the learner's global step of the batch (0-based)
        for name, value in (
            ("sum", per_completion.mean()),
            ("mean", rewards.mean(axis=1).mean()),
            ("min", rewards.min()),
            ("max", rewards.max()),
        ):
            put(f"rewards/train/{name}", scored_at, value)
        for i, name in enumerate(REWARDS):
            put(f"rewards/train/{name}", scored_at, rewards[:, i].mean())
        for name, value in (
            ("mean", per_completion.mean()),
            ("max", per_completion.max()),
            ("min", per_completion.min()),
        ):
            put(f"rewards/train/score/{name}", scored_at, value)
        lengths = rng.normal(420 - 120 * progress, 60, COMPLETIONS_PER_STEP).clip(16, 768).round()
        for name, value in (
            ("mean_length", lengths.mean()),
            ("max_length", lengths.max()),
            ("min_length", lengths.min()),
        ):
            put(f"completions/train/{name}", scored_at, value)
        loss = 0.02 + 0.3 * math.exp(-2.5 * progress) * (1 + 0.2 * rng.normal())
        put("actor/train/loss", step, loss)
        put("actor/train/perplexity", step, math.exp(loss))
        put("actor/train/learning_rate", step, 3e-6 * min(1.0, step / max(1, train_steps // 10)))
        put("actor/train/grad_norm", step, abs(rng.normal(0.6 - 0.3 * progress, 0.1)))
        put("actor/train/kl", step, 0.004 * progress * (1 + 0.3 * abs(rng.normal())))
        put("actor/train/pg_clipfrac", step, abs(rng.normal(0.01, 0.004)))
    return scalars


def tensorboard_event_file(scalars, wall_time=None):
    """One event file as MaxText's writer makes it (tensorboardX's SummaryWriter through metrax's
    TensorboardBackend): returns (file name, bytes). ``wall_time``: as for :func:`growing_event_file`."""
    name, data, _ = growing_event_file(scalars, wall_time)
    return name, data


def growing_event_file(scalars, wall_time=None):
    """The event file and, for each step, how many of its bytes hold the steps up to it: a writer that flushed
    after that step had written that prefix (records are appended, never rewritten). Returns (file name, bytes,
    [(step, size)]).

    ``wall_time(step)``: the POSIX time to stamp on a step's records (a trainer's pace); by default the time of
    writing, as the real writer stamps them, which here puts every step within a moment."""
    import tempfile

    from tensorboardX import SummaryWriter

    points = sorted((s, t, v) for t, values in scalars.items() for s, v in values)
    with tempfile.TemporaryDirectory() as folder:
        writer = SummaryWriter(logdir=folder)
        for step, tag, value in points:
            writer.add_scalar(tag, value, step, walltime=None if wall_time is None else wall_time(step))
        writer.close()
        (path,) = Path(folder).iterdir()
        data = path.read_bytes()
    ends, offset = [], 0
    while offset + 12 <= len(data):  # TFRecord: uint64 length, uint32 crc, data, uint32 crc
        offset += 16 + struct.unpack_from("<Q", data, offset)[0]
        ends.append(offset)
    sizes = {step: ends[i + 1] for i, (step, _, _) in enumerate(points)}  # ends[0]: the file_version record
    return path.name, data, sorted(sizes.items())


#: Below this many seconds of emulated training the event file is uploaded once, whole (the tests' trainings).
GROWING_MIN_SECONDS = 20.0
#: Flushes over an emulated training: tensorboardX flushes every 120 s (flush_secs) and metrax every log_period
#: steps after 30 s, re-uploading the whole, longer file to GCS each time (tensorboardX's GCS record writer).
GROWING_FLUSHES = 6


def put_event_file(out, rel, data, sizes, duration):
    """The event file in the bucket as a training of ``duration`` seconds writes it: nothing before its first
    flush, then longer versions at each flush, whole just before the trainer exits."""
    if duration < GROWING_MIN_SECONDS or not sizes:
        out.put(rel, data)
        return

    def flush():
        for n in range(1, GROWING_FLUSHES + 1):
            time.sleep(duration * 0.9 / GROWING_FLUSHES)
            reached = sizes[max(0, round(len(sizes) * n / GROWING_FLUSHES) - 1)][1]
            out.bucket.blob(out.key(rel)).upload_from_string(data if n == GROWING_FLUSHES else data[:reached])

    out.written.append(rel)
    threading.Thread(target=flush, name=f"flush {rel}", daemon=True).start()


def evaluation_line(when, seed, total, accuracy):
    """The line train_rl logs before ("Pre") or after ("Post") training, in its format (train_rl.py:785-788)."""
    rng = random.Random(f"{seed}/{when}")
    corr = round(total * accuracy)
    partially = min(total, corr + rng.randint(0, max(1, total // 10)))
    formatted = min(total, max(partially, round(total * rng.uniform(0.85, 1.0))))
    accuracy, partial_accuracy, format_accuracy = (
        n / total * 100 if total > 0 else 0 for n in (corr, partially, formatted)
    )
    mean_reward = (
        (REWARDS["check_numbers"] * corr + REWARDS["match_format_exactly"] * formatted) / total if total else 0.0
    )
    return (
        f"{when} RL Training: {corr=}, {total=}, {accuracy=}%, {partial_accuracy=}%,"
        f" {format_accuracy=}%, {mean_reward=:.4f}"
    )


# ---------------------------------------------------------------- safetensors


def safetensors_file(tensors, dtype):
    """A real safetensors file: 8-byte LE header length, JSON header with data_offsets, data."""
    size = {"BF16": 2, "F32": 4}[dtype] * 16
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in tensors:
        header[name] = {"dtype": dtype, "shape": [4, 4], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(i % 251 for i in range(offset))


# ---------------------------------------------------------------- container logs

#: The kubelet's container log rotation on GKE (KubeletConfiguration containerLogMaxSize 10Mi, containerLogMaxFiles 5):
#: past the size the file is renamed <file>.<UTC time> and a new one started; `kubectl logs` reads the current file
#: only, so what a reader had not read before the rotation is gone for it.
LOG_MAX_BYTES = int(os.environ.get("TPU_RL_SIM_LOG_MAX_BYTES", str(10 * 2**20)))
LOG_MAX_FILES = 5
#: A container log bigger than this is written over the pod's run time, in pieces, as a trainer prints it (a reader
#: follows it, and a rotation can come between two of its reads); a smaller one at once.
PACED_LOG_BYTES = 2**20
PACED_LOG_PIECES = 40


def append_log(path: Path, lines: list[str]) -> None:
    """Appends CRI-format lines (``<time> stdout F <text>``) to a container log, rotating it first when it would
    pass :data:`LOG_MAX_BYTES`, keeping :data:`LOG_MAX_FILES` files in all, as the kubelet does."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    text = "".join(f"{now} stdout F {line}\n" for line in lines)
    size = path.stat().st_size if path.exists() else 0
    if size and size + len(text) > LOG_MAX_BYTES:
        path.rename(path.with_name(f"{path.name}.{datetime.now(UTC):%Y%m%d-%H%M%S.%f}"))
        for old in sorted(path.parent.glob(f"{path.name}.*"))[: -(LOG_MAX_FILES - 1)]:
            old.unlink()
    with path.open("a") as out:
        out.write(text)


def print_paced(path: Path, lines: list[str], seconds: float) -> None:
    """``lines`` into the log in :data:`PACED_LOG_PIECES` pieces over ``seconds``, as a program prints them."""
    size = max(1, math.ceil(len(lines) / PACED_LOG_PIECES))
    for start in range(0, len(lines), size):
        append_log(path, lines[start : start + size])
        time.sleep(seconds / PACED_LOG_PIECES)


def write_container_logs(pod, stage, lines, seconds=0.0):
    """Writes what each container of the pod prints to .sim/podlogs/<ns>/<pod>/<container>.log (the workload
    container's ``lines`` after its start lines) and returns kwok's Logs entries for the files. A container's file
    only grows, as a kubelet's log does: what it printed before (its start line, while the Pathways head waited for
    its workers) is neither rewritten nor printed again. A big log is printed over the pod's ``seconds`` and rotated
    as the kubelet rotates it (:data:`LOG_MAX_BYTES`)."""
    meta = pod.metadata
    folder = SIM / "podlogs" / meta.namespace / meta.name
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for c in list(pod.spec.init_containers or []) + list(pod.spec.containers):
        body = [f"[simulated] {c.name} started on {pod.spec.node_name}"]
        if c.name == "workload-container":
            body += ([f"[simulated] python3 -m maxtext ... ({stage})"] if stage else []) + lines
        path = folder / f"{c.name}.log"
        body = body[1 if path.exists() and path.stat().st_size else 0 :]
        if seconds > 0 and sum(len(line) for line in body) > PACED_LOG_BYTES:
            threading.Thread(target=print_paced, args=(path, body, 0.8 * seconds), daemon=True).start()
        else:
            append_log(path, body)
        entries.append({"containers": [c.name], "logsFile": str(path), "follow": True})
    return entries
