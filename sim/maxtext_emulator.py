"""MaxText stage emulator of the simulated TPU cluster (part of the simulation, never imported by plugins/).

A controller started by sim/up.sh. It watches pods; when a pod that is meant to exit (not restartPolicy
Always, not a Pathways worker) starts Running, it handles the pod once (per pod uid). A pod of a JobSet with
Pathways workers waits until every worker of its attempt runs, as the Pathways head's job waits for its
workers to join: without its TPU slice (a flex-start pool still empty, workers pending) nothing trains.

1. Faults: merges the pod's own sim.tpu-rl.dev/* annotations with the first matching rule of the fault
   ConfigMap (sim/faults.py) and decides whether this attempt fails.
2. MaxText: if the pod's `workload-container` runs `python3 -m maxtext.<stage> ...` (inside
   `/bin/bash -c <script>`) and this pod is the one doing the work (the Pathways head; completion index 0
   of a multi-host job; any single pod), writes to the GCS emulator what that stage writes
   (/work/shared/reference/maxtext.md), with the faults asked for.
3. Releases the pod: annotation sim.tpu-rl.dev/exit-at (RFC 3339). The kwok stages in sim/kwok/ then end
   the pod at that time, Succeeded or Failed with the exit code.

Pod annotations read (on the pod template):
  sim.tpu-rl.dev/run-seconds    run time (default $TPU_RL_SIM_RUN_SECONDS, else 3)
  sim.tpu-rl.dev/exit-code      fail with this exit code
  sim.tpu-rl.dev/fail-attempts  fail only while label jobset.sigs.k8s.io/restart-attempt < N
  sim.tpu-rl.dev/maxtext-fault  comma-separated: skip-commit (last step has no commit_success.txt and a
                                null commit_timestamp_nsecs), drop-leaf (one leaf folder missing),
                                drop-shard (one safetensors shard missing), no-index (no
                                model.safetensors.index.json), stop-at-step=N (training ends early at N,
                                normal exit, end-of-run save at N), crash-at-step=N (training crashes at
                                N: only periodic saves before N, exit code 1 unless exit-code is set),
                                preempt-at-step=N (the host is reclaimed after step N, as a Spot VM is: the saves
                                up to N, the last one cut short with skip-commit; then the kubelet's SIGTERM, exit
                                code 143, and the pod condition DisruptionTarget TerminationByKubelet),
                                preempt-in-evaluation (the same preemption, after the training's final save and
                                its success line, during the evaluation after training),
                                eval-regression (the evaluation after training scores lower than before),
                                flood=M (the workload container logs M MiB of Tunix's per-step rollout lines,
                                "Rollout string metric prompts: [...]" as tunix/rl/rl_cluster.py _log_metrics prints a
                                numpy array of strings, one element a line: a trainer spreads them over its steps,
                                after its evaluation before training)
Annotations written: sim.tpu-rl.dev/exit-at, /emulated (what was done), /fault-rule, /warnings, and
exit-code / fail-attempts / run-seconds when a rule sets them; /disruption (a DisruptionTarget reason) for a
preempted pod, which the kwok stage pod-fail turns into the pod's condition and graceful-shutdown status.

Stage contract (arguments read, `key=value` and `--flag=value`):
  to_maxtext      base_output_directory (required), scan_layers, checkpoint_storage_use_ocdbt/_zarr3,
                  model_name  ->  <base>/0/{items/, _CHECKPOINT_METADATA, commit_success.txt}
  train_rl        base_output_directory, run_name (required), num_batches (4), rl.num_iterations (1) or a
                  flat num_iterations, train_fraction (1.0), num_epoch (1),
                  checkpoint_period (50), max_num_checkpoints_to_keep (10), num_test_batches (5),
                  batch_size (1), load_parameters_path (must exist when given)
                  ->  <base>/<run>/checkpoints/actor/<step>/{model_params/, optimizer_state/, ...}
                      and one event file per attempt in <base>/<run>/tensorboard/ (MaxText's tags, one
                      scalar per trained step: docs/training-metrics.md); resumes after the last
                      committed step like the real trainer; logs the Pre/Post RL Training evaluation
                      lines unless num_test_batches=0
  to_huggingface  base_output_directory (required), load_parameters_path (must exist when given),
                  weight_dtype (float32), --hf_model_path, model_name
                  ->  tokenizer files, config.json, model-0000i-of-00004.safetensors, index last
A missing input (load_parameters_path with no objects) or a missing bucket fails the pod (exit code 1).
Bucket IAM: on the nodes of GKE-emulated clusters (annotated with their service account), a stage pod's
principal (the node's account with hostNetwork or without the GKE metadata server; else its Kubernetes
service account's Workload Identity principal) needs the permissions of its stage in the bucket policy
($TPU_RL_SIM_DIR/bucket-policy.json, principal -> roles, read on each check; default: the nodes' account
with roles/storage.objectAdmin and roles/storage.legacyBucketReader); else the pod fails with the error
the real client prints.
HF_TOKEN: checked to come from a Secret that exists (pod fails otherwise); a literal value or
hf_access_token= on the command line gives a warning. Values are never printed.

Logs: for every running pod it writes what its containers would print (CRI format) to
.sim/podlogs/<ns>/<pod>/<container>.log and creates a kwok Logs object pointing at those files, so
`kubectl logs` (and read_namespaced_pod_log) work; the workload container's log says what was emulated.
"""

import json
import math
import os
import random
import shlex
import struct
import threading
import time
import traceback
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

from . import faults, gke_rules

SIM = Path(os.environ.get("SIM", Path(__file__).resolve().parent.parent / ".sim"))
RUN_SECONDS = float(os.environ.get("TPU_RL_SIM_RUN_SECONDS", "3"))
PREFIX = "sim.tpu-rl.dev/"
STAGES = {
    "maxtext.checkpoint_conversion.to_maxtext": "to_maxtext",
    "maxtext.trainers.post_train.rl.train_rl": "train_rl",
    "maxtext.checkpoint_conversion.to_huggingface": "to_huggingface",
}
HF_IDS = {"qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B-Thinking-2507"}  # MaxText's default tokenizer per model
HEARTBEAT = SIM / "run" / "maxtext-emulator.heartbeat"
#: The buckets' IAM policy (principal -> roles), a file read on each check so a test can change it.
BUCKET_POLICY_FILE = Path(os.environ.get("TPU_RL_SIM_DIR") or SIM) / "bucket-policy.json"
DEFAULT_BUCKET_POLICY = {
    "serviceAccount:tpu-rl-nodes@tpu-rl-sim.iam.gserviceaccount.com": [
        "roles/storage.objectAdmin",
        "roles/storage.legacyBucketReader",
    ]
}
#: The Cloud Storage permissions of the predefined roles the stages' identities get (the storage.* part that
#: matters here). Source: IAM docs, "Cloud Storage roles" (https://cloud.google.com/storage/docs/access-control/iam-roles):
#: objectAdmin and objectUser hold storage.objects.* but no storage.buckets.get; legacyBucketReader holds
#: storage.buckets.get and storage.objects.list; storage.admin holds both.
ROLE_PERMISSIONS = {
    "roles/storage.admin": {
        "storage.buckets.get",
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
    },
    "roles/storage.objectAdmin": {
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
    },
    "roles/storage.objectUser": {
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
    },
    "roles/storage.objectViewer": {"storage.objects.get", "storage.objects.list"},
    "roles/storage.legacyBucketReader": {"storage.buckets.get", "storage.objects.list"},
    "roles/storage.bucketViewer": {"storage.buckets.get"},
}
#: What each stage does in the bucket. MaxText 0.2.4's HF->MaxText conversion calls get_bucket() before it
#: writes (maxtext/utils/gcs_utils.py, reached from checkpoint_conversion/utils/utils.py).
STAGE_PERMISSIONS = {
    "to_maxtext": ["storage.buckets.get", "storage.objects.create", "storage.objects.list"],
    "train_rl": ["storage.objects.get", "storage.objects.list", "storage.objects.create", "storage.objects.delete"],
    "to_huggingface": ["storage.objects.get", "storage.objects.list", "storage.objects.create"],
}
HANDLED = SIM / "run" / "maxtext-emulator-handled.txt"


def log(msg):
    print(f"{datetime.now(UTC).isoformat(timespec='milliseconds')} {msg}", flush=True)


class PodFailure(Exception):
    """The emulated process fails: the pod gets this exit code (and, when its host was taken, a DisruptionTarget
    reason)."""

    def __init__(self, message, exit_code=1, disruption=None, lines=()):
        super().__init__(message)
        self.exit_code = exit_code
        self.disruption = disruption
        #: What the process logged before it failed.
        self.lines = list(lines)


# ---------------------------------------------------------------- command parsing


def parse_invocation(command):
    """Finds `python3 -m maxtext.<module> args...` in a container command. Returns (stage, args, flags)."""
    parts = list(command or [])
    script = parts[2] if parts[:2] == ["/bin/bash", "-c"] and len(parts) > 2 else " ".join(map(shlex.quote, parts))
    lexer = shlex.shlex(script.replace("\\\n", " "), posix=True, punctuation_chars=";&|()\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    tokens = list(lexer)
    for i, tok in enumerate(tokens[:-1]):
        if tok == "-m" and tokens[i + 1] in STAGES:
            args, flags = {}, {}
            for arg in tokens[i + 2 :]:
                if set(arg) <= set(";&|()\n"):
                    break
                if arg.startswith("--"):
                    key, _, value = arg[2:].partition("=")
                    flags[key] = value if _ else True
                elif "=" in arg:
                    key, _, value = arg.partition("=")
                    args[key] = value
            return STAGES[tokens[i + 1]], args, flags
    return None, {}, {}


def truthy(value):
    return str(value).strip().lower() in ("1", "true", "yes")


def split_gs(url):
    if not url.startswith("gs://"):
        raise PodFailure(f"not a gs:// path: {url}")
    bucket, _, path = url[5:].partition("/")
    return bucket, path.strip("/")


# ---------------------------------------------------------------- GCS writer


class Bucket:
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


# ---------------------------------------------------------------- what train_rl reports (docs/training-metrics.md)

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


def tensorboard_event_file(scalars):
    """One event file as MaxText's writer makes it (tensorboardX's SummaryWriter through metrax's
    TensorboardBackend): returns (file name, bytes)."""
    name, data, _ = growing_event_file(scalars)
    return name, data


def growing_event_file(scalars):
    """The event file and, for each step, how many of its bytes hold the steps up to it: a writer that flushed
    after that step had written that prefix (records are appended, never rewritten). Returns (file name, bytes,
    [(step, size)])."""
    import tempfile

    from tensorboardX import SummaryWriter

    points = sorted((s, t, v) for t, values in scalars.items() for s, v in values)
    with tempfile.TemporaryDirectory() as folder:
        writer = SummaryWriter(logdir=folder)
        for step, tag, value in points:
            writer.add_scalar(tag, value, step)
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
    import threading

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


# ---------------------------------------------------------------- the three stages


def to_maxtext(client, args, flags, faults_):
    out = Bucket(client, args["base_output_directory"])
    if out.exists("0/commit_success.txt"):
        return ["finished checkpoint 0/ exists: conversion ran, save skipped"], out
    if out.names("0"):
        out.delete_prefix("0")  # a new save over an unfinished step deletes it first
    keypaths = [("params", "params") + leaf for leaf in LEAVES]
    write_step(out, "0", {"items": keypaths}, {"scan_layers": truthy(args.get("scan_layers", "true"))}, faults_)
    return [f"Conversion complete. Checkpoint saved to {out.url}/0"], out


#: Lines the evaluation after training logs at least (more than a log tail of 100 lines holds).
EVALUATION_LOG_LINES = 150
#: The kubelet's container log rotation on GKE (KubeletConfiguration containerLogMaxSize 10Mi, containerLogMaxFiles 5):
#: past the size the file is renamed <file>.<UTC time> and a new one started; `kubectl logs` reads the current file
#: only, so what a reader had not read before the rotation is gone for it.
LOG_MAX_BYTES = int(os.environ.get("TPU_RL_SIM_LOG_MAX_BYTES", str(10 * 2**20)))
LOG_MAX_FILES = 5
#: A container log bigger than this is written over the pod's run time, in pieces, as a trainer prints it (a reader
#: follows it, and a rotation can come between two of its reads); a smaller one at once.
PACED_LOG_BYTES = 2**20
PACED_LOG_PIECES = 40

#: The Hub datasets' configs this emulator knows (their dataset cards' "Subset" lists): MaxText 0.2.4's
#: train_rl.get_dataset loads a Hub dataset without data files as datasets.load_dataset(dataset_name,
#: name=hf_subset, split=split), hf_subset defaulting to 'main' (configs/post_train/rl.yml), GSM8K's config.
HUB_DATASET_CONFIGS = {"openai/gsm8k": ("main", "socratic"), "nvidia/OpenMathInstruct-2": ("default",)}


def load_hub_dataset(name, subset, data_files):
    """Refuses what datasets.load_dataset would: a config the dataset lacks (its ValueError). With data files
    the split is read as parquet, whatever the name; a dataset this emulator does not know is refused too."""
    if data_files:
        return
    if name not in HUB_DATASET_CONFIGS:
        raise PodFailure(f"the emulator knows the configs of {sorted(HUB_DATASET_CONFIGS)} only, not of {name}")
    if subset not in HUB_DATASET_CONFIGS[name]:
        raise PodFailure(
            f"ValueError: BuilderConfig '{subset}' not found. Available: {list(HUB_DATASET_CONFIGS[name])}"
        )


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


def rollout_lines(faults_, steps) -> list[str]:
    """The ``flood=M`` fault's M MiB of Tunix's rollout lines, spread over ``steps``: each step's prompts, one numpy
    array element a line (tunix/rl/rl_cluster.py ``_log_metrics``: "Rollout string metric %s: %s" at INFO)."""
    mib = next((float(f.split("=", 1)[1]) for f in faults_ if f.startswith("flood=")), 0.0)
    steps = list(steps) or [0]
    element = " 'Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May? Reason step by step.'"  # noqa: E501
    per_step = int(mib * 2**20 / len(steps) / (len(element) + 40)) if mib else 0
    lines = []
    for step in steps if per_step else []:
        lines.append(f"I1204 rl_cluster.py:607] Rollout string metric prompts: [step {step}")
        lines += [f"{element[:-1]} (step {step}, prompt {i})'" for i in range(per_step)]
    return lines


def train_rl(client, args, flags, faults_, duration=0.0):
    if args.get("load_parameters_path"):
        require_input(client, args["load_parameters_path"], "load_parameters_path")
    out = Bucket(client, args["base_output_directory"].rstrip("/") + "/" + args["run_name"])
    # MaxText 0.2.4 configs/types.py (RLConfig): int(num_batches x rl.num_iterations x train_fraction x num_epoch);
    # a flat num_iterations wins over rl.num_iterations (configs/pyconfig.py copies flat keys into the nested model).
    iterations = int(args.get("num_iterations", args.get("rl.num_iterations", 1)))
    train_steps = int(
        int(args.get("num_batches", 4))
        * iterations
        * float(args.get("train_fraction", 1.0))
        * int(args.get("num_epoch", 1))
    )
    subset = args.get("hf_subset", "main")
    load_hub_dataset(args.get("dataset_name", "openai/gsm8k"), subset, args.get("hf_train_files"))
    if (
        int(args.get("num_test_batches", 5)) > 0
    ):  # the test split: eval_dataset_name (rl.yml: GSM8K), else the training set
        eval_name = args.get("eval_dataset_name", "openai/gsm8k") or args.get("dataset_name", "openai/gsm8k")
        load_hub_dataset(eval_name, subset, args.get("hf_eval_files"))
    period = int(args.get("checkpoint_period", 50))
    keep = int(args.get("max_num_checkpoints_to_keep", 10))
    stop = min([train_steps] + [int(f.split("=")[1]) for f in faults_ if f.startswith("stop-at-step=")])
    crash = [int(f.split("=")[1]) for f in faults_ if f.startswith("crash-at-step=")]
    preempt = [int(f.split("=")[1]) for f in faults_ if f.startswith("preempt-at-step=")]
    test_batches = int(args.get("num_test_batches", 5))
    actor = "checkpoints/actor"
    done = committed_steps(out, actor)
    start = max(done, default=0)
    lines = [
        f"train_steps={train_steps} checkpoint_period={period}",
        # train_rl.get_dataset's line (MaxText 0.2.4 logs it with debug=true): what this run trains on.
        f"Loaded Hugging Face dataset {args.get('dataset_name', 'openai/gsm8k')} with split "
        f"{args.get('train_split', 'train')}"
        + (f" from {args['hf_train_files']}" if args.get("hf_train_files") else ""),
    ]
    if start:
        # Tunix's own line (tunix/sft/checkpoint_manager.py:293 at c4ec573), then the data fast-forward
        # (rl_learner.py:400-407).
        lines.append(f"Restored params from step: {start} in 1.234 seconds")
        lines.append(f"Fast forwarded {start} micro-batches.")
    # Evaluation on num_test_batches * batch_size test prompts, before and after training; none with 0.
    seed = out.url
    test_prompts = test_batches * int(args.get("batch_size", 1))
    accuracy_before = random.Random(seed).uniform(0.3, 0.45)
    # A regression beyond chance on the default 20 test prompts (30-45% before, 0-10% after), which
    # require_no_regression refuses; a drop within chance passes it.
    accuracy_after = max(0.0, accuracy_before + (-0.35 if "eval-regression" in faults_ else 0.2))
    if test_batches > 0:
        lines.append(evaluation_line("Pre", seed, test_prompts, accuracy_before))
    end = crash[0] if crash else max(preempt[0], start) if preempt else stop
    lines += rollout_lines(faults_, range(start + 1, end + 1))
    saves = [s for s in range(start + 1, end + (0 if crash else 1)) if s % period == 0]
    if not (crash or preempt) and end > start and end not in saves:
        saves.append(end)  # the end-of-run save, on a normal exit only
    for step in saves:
        if out.names(f"{actor}/{step}"):
            out.delete_prefix(f"{actor}/{step}")  # unfinished folder from a crashed save
        last = step == saves[-1]
        write_step(
            out,
            f"{actor}/{step}",
            {
                "model_params": [("params",) + leaf for leaf in LEAVES],
                "optimizer_state": [("opt_state", "0", m) + leaf for m in ("mu", "nu") for leaf in LEAVES[:2]],
            },
            {"global_step": step},
            faults_ if last else [],
        )
        lines.append(f"saved checkpoint at step {step}")
    for old in sorted(committed_steps(out, actor))[:-keep] if keep > 0 else []:
        out.delete_prefix(f"{actor}/{old}")
        lines.append(f"deleted old checkpoint {old} (keeping {keep})")
    trained = range(start + 1, end + (0 if crash else 1))
    name, events, sizes = growing_event_file(training_scalars(seed, train_steps, trained))
    put_event_file(out, f"tensorboard/{name}", events, sizes, duration)
    if crash:
        raise PodFailure(f"training crashed at step {crash[0]} (simulated)")
    if preempt:
        raise PodFailure(
            f"SIGTERM after step {end}: the host is shutting down (simulated Spot VM preemption)",
            exit_code=143,
            disruption="TerminationByKubelet",
        )
    lines.append("RL Training Completed Successfully!")
    if "preempt-in-evaluation" in faults_:  # the host goes during the evaluation after training
        raise PodFailure(
            "SIGTERM during the evaluation after training: the host is shutting down (simulated Spot VM preemption)",
            exit_code=143,
            disruption="TerminationByKubelet",
            lines=lines,
        )
    if test_batches > 0:
        # MaxText 0.2.4 train_rl.py prints its success line (810) before a whole second evaluation (812-827), whose
        # vLLM engine logs as it goes: the success line is long out of a log's last lines when Post prints.
        lines += [
            f"vLLM engine: processed prompt {i % test_prompts + 1}/{test_prompts} of evaluation pass "
            f"{i // test_prompts + 1}"
            for i in range(max(EVALUATION_LOG_LINES, test_prompts))
        ]
        lines.append(evaluation_line("Post", seed, test_prompts, accuracy_after))
    return lines, out


def to_huggingface(client, args, flags, faults_):
    if args.get("load_parameters_path"):
        require_input(client, args["load_parameters_path"], "load_parameters_path")
    out = Bucket(client, args["base_output_directory"])
    model = args.get("model_name", "qwen3-30b-a3b")
    tokenizer = flags.get("hf_model_path") or HF_IDS.get(model, model)
    dtype = {"bfloat16": "BF16"}.get(args.get("weight_dtype", "float32"), "F32")
    out.put(
        "tokenizer_config.json",
        {"name_or_path": tokenizer, "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 262144},
    )
    out.put("tokenizer.json", {"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}})
    out.put(
        "config.json",
        {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "torch_dtype": "bfloat16" if dtype == "BF16" else "float32",
            "sim_model_name": model,
        },
    )
    shards = 4
    weight_map, total = {}, 0
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensors = [f"model.layers.{i - 1}.self_attn.q_proj.weight", f"model.layers.{i - 1}.mlp.gate.weight"]
        if i == 1:
            tensors.insert(0, "model.embed_tokens.weight")
        if i == shards:
            tensors += ["model.norm.weight", "lm_head.weight"]
        data = safetensors_file(tensors, dtype)
        total += len(data) - 8 - struct.unpack("<Q", data[:8])[0]
        weight_map.update({t: name for t in tensors})
        if "drop-shard" in faults_ and i == 2:
            continue
        out.put(name, data)
    if "no-index" not in faults_:
        out.put("model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return [f"Saved Hugging Face model ({shards} shards, tokenizer {tokenizer}) to {out.url}"], out


# ---------------------------------------------------------------- the controller

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


class Emulator:
    def __init__(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        from kubernetes import client, config

        kubeconfig = os.environ.get("KUBECONFIG", str(SIM / "kubeconfig"))
        api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        # The fault switch: this cluster's own ConfigMap, or the standing cluster's for a cluster the GKE
        # emulator created (sim/control_plane.py), so that one switch serves every cluster.
        faults_kubeconfig = os.environ.get("TPU_RL_SIM_FAULTS_KUBECONFIG")
        self.fault_switch = (
            client.CoreV1Api(config.new_client_from_config(faults_kubeconfig)) if faults_kubeconfig else self.core
        )
        self.logged = set()
        #: Pods of a Pathways JobSet that wait for its TPU workers, by (namespace, JobSet name).
        self.waiting = {}
        self.gcs = storage.Client(project="tpu-rl-sim", credentials=AnonymousCredentials())
        HANDLED.parent.mkdir(parents=True, exist_ok=True)
        self.handled = set(HANDLED.read_text().split()) if HANDLED.exists() else set()

    def run(self):
        from kubernetes import watch

        log(f"watching pods (default run time {RUN_SECONDS:g} s)")
        while True:
            try:
                pods = self.core.list_pod_for_all_namespaces()
                for pod in pods.items:
                    self.consider(pod)
                HEARTBEAT.touch()
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=pods.metadata.resource_version,
                    timeout_seconds=10,
                )
                for event in stream:
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.consider(event["object"])
                HEARTBEAT.touch()
            except Exception:  # the API may be restarting: log, wait, list again
                log("watch error:\n" + traceback.format_exc())
                time.sleep(2)

    def consider(self, pod):
        meta, spec = pod.metadata, pod.spec
        annotations = meta.annotations or {}
        if meta.deletion_timestamp or pod.status.phase != "Running":
            return
        never_ends = spec.restart_policy == "Always" or any(c.name == "pathways-worker" for c in spec.containers)
        try:
            if never_ends:
                if meta.uid not in self.logged:
                    self.publish_logs(pod, None, [])
                waiting = self.waiting.get((meta.namespace, (meta.labels or {}).get(JOBSET_NAME_LABEL)))
                if waiting is not None:  # a worker came up: the head may start now
                    self.consider(waiting)
            elif PREFIX + "exit-at" not in annotations and meta.uid not in self.handled:
                if self.workers_ready(pod):
                    self.handle(pod)
                elif meta.uid not in self.logged:  # a running container has a log while it waits (kubelet)
                    self.publish_logs(pod, None, [])
        except Exception:
            log(f"error handling pod {meta.namespace}/{meta.name}, will retry:\n" + traceback.format_exc())

    def workers_ready(self, pod):
        """Whether every Pathways TPU worker of the pod's JobSet attempt runs. The Pathways head's job (the
        trainer) starts its work only once the workers have joined: without the slice (a flex-start pool
        still empty, a worker pending) nothing trains. Pods of JobSets without workers are always ready."""
        meta, labels = pod.metadata, pod.metadata.labels or {}
        name = labels.get(JOBSET_NAME_LABEL)
        if not name:
            return True
        try:
            jobset = self.custom.get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", meta.namespace, "jobsets", name
            )
        except Exception:  # gone, or not a JobSet of this API: nothing to wait for
            return True
        expected = sum(
            int(job.get("replicas", 1)) * int(job["template"]["spec"].get("parallelism", 1))
            for job in jobset["spec"]["replicatedJobs"]
            if any(c["name"] == "pathways-worker" for c in job["template"]["spec"]["template"]["spec"]["containers"])
        )
        if not expected:
            return True
        attempt = labels.get("jobset.sigs.k8s.io/restart-attempt")
        running = [
            w
            for w in self.core.list_namespaced_pod(meta.namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}").items
            if w.status.phase == "Running"
            and not w.metadata.deletion_timestamp
            and (w.metadata.labels or {}).get("jobset.sigs.k8s.io/restart-attempt") == attempt
            and any(c.name == "pathways-worker" for c in w.spec.containers)
        ]
        key = (meta.namespace, name)
        if len(running) < expected:
            if key not in self.waiting:
                log(
                    f"{meta.namespace}/{meta.name}: waiting for the JobSet's TPU workers "
                    f"({len(running)} of {expected} running)"
                )
            self.waiting[key] = pod
            return False
        self.waiting.pop(key, None)
        return True

    def handle(self, pod):
        meta = pod.metadata
        labels, annotations = meta.labels or {}, dict(meta.annotations or {})
        ref = f"{meta.namespace}/{meta.name}"
        container = next((c for c in pod.spec.containers if c.name == "workload-container"), None)
        stage, args, flags = (
            parse_invocation((container.command or []) + (container.args or [])) if container else (None, {}, {})
        )
        workload = (
            labels.get("jobset.sigs.k8s.io/jobset-name") or labels.get("batch.kubernetes.io/job-name") or meta.name
        )
        attempt = labels.get("jobset.sigs.k8s.io/restart-attempt")
        # A JobSet submitted again under the same name (a resumed training) is a new workload: its uid tells.
        incarnation = labels.get("jobset.sigs.k8s.io/jobset-uid", "")[:8]
        attempt_key = (
            f"{meta.namespace}/{workload}"
            + (f"@{incarnation}" if incarnation else "")
            + (f"/attempt-{attempt}" if attempt is not None else "")
        )

        # 1. faults: pod annotations, overridden by the first matching sim-side rule
        patch, rule_name = {}, None
        for name, rule in faults.list_faults(self.fault_switch).items():
            if self.matches(rule, pod, workload, stage) and faults.record_applied(self.fault_switch, name, attempt_key):
                rule_name = name
                for field in faults.EFFECT_FIELDS:
                    if rule.get(field) is not None:
                        patch[PREFIX + field.replace("_", "-")] = str(rule[field])
                patch[PREFIX + "fault-rule"] = name
                break
        effective = {**annotations, **patch}
        maxtext_faults = [f.strip() for f in effective.get(PREFIX + "maxtext-fault", "").split(",") if f.strip()]
        fails = self.will_fail(effective, int(attempt or 0))

        # 2. the MaxText stage, in the pod that does the work
        warnings, lines = self.check_secrets(pod, container, args), []
        index = labels.get("batch.kubernetes.io/job-completion-index", "0")
        job_index = labels.get("jobset.sigs.k8s.io/job-index", "0")
        try:
            if warnings and warnings[0].startswith("missing-secret"):
                # A real kubelet would not start the container (CreateContainerConfigError).
                raise PodFailure(warnings[0])
            if stage:
                self.check_bucket_access(pod, stage, args, flags)
            if not stage:
                summary = "no MaxText stage in this pod"
                lines = rollout_lines(maxtext_faults, []) if index == "0" and job_index == "0" else []
            elif index != "0" or job_index != "0":
                summary = f"{stage}: skipped (completion index {index}, job index {job_index} does no work)"
            elif fails and not maxtext_faults:
                summary = f"{stage}: nothing written (the pod fails before saving)"
            else:
                # The trainer runs for the pod's run seconds: its event file grows over them.
                timing = (
                    {"duration": float(effective.get(PREFIX + "run-seconds", RUN_SECONDS))}
                    if stage == "train_rl"
                    else {}
                )
                lines, out = globals()[stage](self.gcs, args, flags, maxtext_faults, **timing)
                summary = f"{stage}: wrote {len(out.written)} objects under {out.url}"
        except PodFailure as e:
            lines, summary = [*e.lines, f"ERROR: {e}"], f"{stage or 'pod'}: failed: {e}"
            if not fails:  # fail this attempt whatever the fault annotations say
                patch[PREFIX + "exit-code"] = str(e.exit_code)
            if e.disruption:
                patch[PREFIX + "disruption"] = e.disruption
                if PREFIX + "fail-attempts" in effective:
                    patch[PREFIX + "fail-attempts"] = str(int(attempt or 0) + 1)
        if maxtext_faults:
            summary += f" [faults: {','.join(maxtext_faults)}]"

        # 3. release the pod: kwok's stages end it at exit-at
        effective = {**annotations, **patch}
        run_seconds = float(effective.get(PREFIX + "run-seconds", RUN_SECONDS))
        exit_at = datetime.now(UTC) + timedelta(seconds=run_seconds)
        patch[PREFIX + "exit-at"] = exit_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        patch[PREFIX + "emulated"] = summary[:1000]
        if warnings:
            patch[PREFIX + "warnings"] = ",".join(warnings)
        self.publish_logs(pod, stage, lines, run_seconds)
        with HANDLED.open("a") as f:
            f.write(meta.uid + "\n")
        self.handled.add(meta.uid)
        self.core.patch_namespaced_pod(meta.name, meta.namespace, {"metadata": {"annotations": patch}})
        outcome = (
            f"fails with exit code {effective.get(PREFIX + 'exit-code', '1')}"
            if self.will_fail(effective, int(attempt or 0))
            else "succeeds"
        )
        log(
            f"{ref}: {summary}; {outcome} at {patch[PREFIX + 'exit-at']}"
            + (f"; rule {rule_name}" if rule_name else "")
            + (f"; warnings {warnings}" if warnings else "")
        )
        for line in lines:
            log(f"  {ref}: {line}")

    @staticmethod
    def matches(rule, pod, workload, stage):
        labels = pod.metadata.labels or {}
        checks = {
            "prefix": workload,
            "stage": stage,
            "replicated_job": labels.get("jobset.sigs.k8s.io/replicatedjob-name"),
            "namespace": pod.metadata.namespace,
        }
        for field, actual in checks.items():
            want = rule.get(field)
            if want is None:
                continue
            if actual is None or (not actual.startswith(want) if field == "prefix" else actual != want):
                return False
        return True

    @staticmethod
    def will_fail(annotations, attempt):
        """Same rule as the kwok stages (sim/kwok/pod-fail.yaml)."""
        if annotations.get(PREFIX + "fail-attempts") is not None:
            return attempt < int(annotations[PREFIX + "fail-attempts"])
        return annotations.get(PREFIX + "exit-code", "0") != "0"

    def check_bucket_access(self, pod, stage, args, flags):
        """Cloud Storage answers 403 to a principal without access to the bucket. The principal is decided as
        on GKE: a pod with hostNetwork, or on a node without the GKE metadata server, is the node's service
        account; otherwise the Workload Identity principal of its Kubernetes service account. Nodes that
        carry no service account (the standing cluster's) are not checked."""
        node = self.core.read_node(pod.spec.node_name)
        account = (node.metadata.annotations or {}).get(gke_rules.NODE_SERVICE_ACCOUNT_ANNOTATION)
        if account is None:
            return
        metadata_server = (node.metadata.labels or {}).get("iam.gke.io/gke-metadata-server-enabled") == "true"
        if pod.spec.host_network or not metadata_server:
            principal = f"serviceAccount:{account}"
        else:
            principal = (
                f"principal://iam.googleapis.com/projects/{gke_rules.PROJECT_NUMBER}/locations/global/workloadIdentityPools/"
                f"tpu-rl-sim.svc.id.goog/subject/ns/{pod.metadata.namespace}/sa/"
                f"{pod.spec.service_account_name or 'default'}"
            )
        try:
            policy = json.loads(BUCKET_POLICY_FILE.read_text())
        except (OSError, ValueError):
            policy = DEFAULT_BUCKET_POLICY
        granted = set().union(*(ROLE_PERMISSIONS.get(role, set()) for role in policy.get(principal, [])))
        url = args.get("base_output_directory") or flags.get("base_output_directory") or "the bucket"
        for permission in STAGE_PERMISSIONS.get(stage, []):
            if permission in granted:
                continue
            if permission == "storage.buckets.get":  # what maxtext/utils/gcs_utils.py raises after get_bucket()
                bucket = url.removeprefix("gs://").split("/", 1)[0]
                raise PodFailure(
                    f"ValueError: GCS bucket {bucket} not found or accessible "
                    f"(403 Forbidden: {principal} does not have storage.buckets.get access to the "
                    "Google Cloud Storage bucket)"
                )
            raise PodFailure(f"403 Forbidden: {principal} does not have {permission} access to {url}")

    def check_secrets(self, pod, container, args):
        """HF token hygiene. Never reads or prints a token's value beyond checking the key exists."""
        from kubernetes.client.exceptions import ApiException

        warnings = []
        if container is None:
            return warnings
        if "hf_access_token" in args:
            warnings.append("hf_access_token-on-command-line")
        for env in container.env or []:
            if env.name != "HF_TOKEN":
                continue
            ref = env.value_from.secret_key_ref if env.value_from else None
            if env.value is not None:
                warnings.append("HF_TOKEN-literal-value")
            elif ref is not None:
                try:
                    secret = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace)
                    if ref.key not in (secret.data or {}) and not ref.optional:
                        warnings.insert(0, f"missing-secret-key {ref.name}/{ref.key} for HF_TOKEN")
                except ApiException as e:
                    if e.status != 404:
                        raise
                    if not ref.optional:
                        warnings.insert(0, f"missing-secret {ref.name} for HF_TOKEN")
        return warnings

    def publish_logs(self, pod, stage, lines, seconds=0.0):
        """What the containers would print, for `kubectl logs`: CRI-format files under .sim/podlogs/ and a
        kwok Logs object (owned by the pod, so it goes with it) that points kwok at them. A container's file
        only grows, as a kubelet's log does: what it printed before (its start line, while the Pathways head
        waited for its workers) is neither rewritten nor printed again. A big log is printed over the pod's
        ``seconds`` and rotated as the kubelet rotates it (:data:`LOG_MAX_BYTES`)."""
        from kubernetes.client.exceptions import ApiException

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
        logs = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {
                "name": meta.name,
                "namespace": meta.namespace,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.name, "uid": meta.uid}],
            },
            "spec": {"logs": entries},
        }
        try:
            self.custom.create_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", meta.namespace, "logs", logs)
        except ApiException as e:
            if e.status != 409:
                raise
        self.logged.add(meta.uid)


if __name__ == "__main__":
    Emulator().run()
