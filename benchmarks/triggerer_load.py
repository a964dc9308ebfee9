"""What one Airflow triggerer holds while N trainings wait: CPU, memory and requests per training.

For each N of ``--trainings`` it submits N small training-like JobSets to the simulated cluster (sim/status.sh
must exit 0; this never starts or stops the simulation) in a namespace of its own: a Pathways head (the
``workload-container`` the trigger follows) and one worker each, as ``manifests.training_jobset`` lays them out,
on the CPU pool. Beside them a helper process (not measured) plays the trainers: it appends a log line to each
head's container log every ``--log-interval`` seconds (the files the MaxText emulator writes and kwok serves
as the kubelet would) and writes each training's TensorBoard event file into the GCS emulator, longer every
``--flush-interval`` seconds (each trainer on its own phase), with tensorboardX as sim/maxtext_emulator.py does
(its curves and its writer).

The N waits run as in the triggerer's trigger-runner subprocess: one process, one asyncio loop, the package's
``JobSetTrigger`` with the keywords the operator gives it (``training=`` as ``TrainRlOperator.trigger_kwargs``
builds it), each created from its encrypted kwargs and run by Airflow's own ``TriggerRunner.create_triggers`` /
``run_trigger`` (the runner's blocking watchdog runs too), with Airflow's logging configured as in that
subprocess: JSON over a socket to a second process that does what the triggerer's supervisor does with it
(``TriggerRunnerSupervisor._process_log_messages_from_subprocess``: one formatted log file per trigger).

After ``--warmup`` seconds the measured window (``--window``) starts. Measured from /proc: the CPU of the
runner and of the log sink (fraction of one core), their resident memory (VmRSS sampled every 5 s, the peak
VmHWM) and the runner's memory before any trigger started. Counted inside the runner: Kubernetes API
requests (``kubernetes_asyncio`` ``ApiClient.call_api``; a watch or a followed log counts as one) and Cloud
Storage requests (``aiohttp.ClientSession._request`` to the storage host), per minute per training. The
triggers start together, so their watches reconnect together (every 300 s: one each in the default window);
the followed log is reopened every 600 s, which the table adds as a note when the window is shorter.

Once, a real ``airflow triggerer`` with no triggers (scripts/airflow-env.sh, an Airflow home of its own in a
temporary folder, its own database ``bench_triggerer`` on the PostgreSQL of scripts/postgres.sh at port
``TPU_RL_PG_PORT`` 55433, started and stopped only if it was not running) gives the baseline: CPU and memory
(PSS summed over its processes, as they share pages). Total = baseline + runner and sink growth over their
idle state. It prints a table; it asserts nothing. Everything it created in the cluster and the bucket is
deleted at the end, also after an error or Ctrl-C.

    nice -n 5 .venv/bin/python -m benchmarks.triggerer_load [--trainings 10 25 50] [--warmup 90] [--window 300]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib
import json
import logging
import os
import random
import re
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.jobset_wait import RequestCounter

REPO = Path(__file__).resolve().parents[1]
SIM_DIR = Path(os.environ.get("TPU_RL_SIM_DIR", REPO / ".sim"))
BUCKET = "tpu-rl-sim"
KUBERNETES_CONN_ID = "tpu_rl_sim"
GCP_CONN_ID = "google_cloud_default"
PG_PORT = "55433"
PG_DATABASE = "bench_triggerer"
PART_OF = "triggerer-load-benchmark"
#: Goals: the triggerer of docs/getting-started/composer.md (--triggerer-cpu 0.5 --triggerer-memory 1) and the
#: per-training rates.
GOAL_CPU, GOAL_MEMORY_MIB, GOAL_REQUESTS_PER_MINUTE = 0.5, 1024, 1.5
#: Airflow's [triggerer] threshold for its 'blocked' warning, the goal for any stall
STALL_GOAL_SECONDS = 0.2
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024


# -- /proc ---------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (/proc/<pid>/status) and Pss (smaps_rollup), in bytes."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            found["Pss"] = int(line.split()[1]) * 1024
    return found


def process_tree(pid: int) -> list[int]:
    """The process and its descendants."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(child) for child in (task / "children").read_text().split()]
    return found


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    return "?"


class Window:
    """CPU and memory of some processes over a window: CPU read at its start and end, memory every few seconds."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start = time.monotonic()
        self.cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        self.samples: dict[str, list[dict[str, int]]] = {name: [] for name in pids}

    def sample(self) -> None:
        for name, pid in self.pids.items():
            self.samples[name].append(memory(pid))

    def run(self, seconds: float, every: float = 5) -> None:
        end = self.start + seconds
        while (now := time.monotonic()) < end:
            self.sample()
            time.sleep(min(every, end - now))
        self.sample()

    def result(self) -> dict[str, dict[str, float]]:
        wall = time.monotonic() - self.start
        out = {}
        for name, pid in self.pids.items():
            samples = self.samples[name]
            out[name] = {
                "cpu": (cpu_seconds(pid) - self.cpu0[name]) / wall,
                "rss_mean": sum(s["VmRSS"] for s in samples) / len(samples),
                "rss_max": max(s["VmRSS"] for s in samples),
                "pss_mean": sum(s["Pss"] for s in samples) / len(samples),
                "hwm": samples[-1]["VmHWM"],
                "wall": wall,
            }
        return out


# -- environments ------------------------------------------------------------------------------------


def sim_env() -> dict[str, str]:
    """The simulation's variables (.sim/airflow.env); refuses to go on if it is not healthy."""
    if subprocess.run([REPO / "sim" / "status.sh"], capture_output=True).returncode != 0:
        raise SystemExit("The simulated cluster is not healthy (sim/status.sh); this benchmark does not start it.")
    env = {}
    for line in (SIM_DIR / "airflow.env").read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


def airflow_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """scripts/airflow-env.sh with an Airflow home of our own and the database ``bench_triggerer``."""
    url = subprocess.run(
        [REPO / "scripts" / "postgres.sh", "url", PG_DATABASE],
        env={**os.environ, "TPU_RL_PG_PORT": PG_PORT},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    base = {**os.environ, **extra, "AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url}
    out = subprocess.run(
        ["bash", "-c", f"source {REPO}/scripts/airflow-env.sh && env -0"],
        env=base,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


class Children:
    """The processes this benchmark started: each stopped by its pid (or its own session's group) at the end."""

    def __init__(self) -> None:
        self.running: list[subprocess.Popen] = []

    def start(self, argv: list, **kwargs) -> subprocess.Popen:
        process = subprocess.Popen([str(a) for a in argv], start_new_session=True, **kwargs)
        self.running.append(process)
        return process

    def stop(self, process: subprocess.Popen, timeout: float = 30, group: bool = False) -> None:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM) if group else process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL) if group else process.kill()
                process.wait()
        if process in self.running:
            self.running.remove(process)

    def stop_all(self) -> None:
        for process in reversed(list(self.running)):
            self.stop(process, timeout=10, group=True)


def self_argv(role: str, *args) -> list:
    return [sys.executable, "-m", "benchmarks.triggerer_load", "--role", role, *args]


# -- the cluster and the bucket ----------------------------------------------------------------------------


def training_manifest(name: str, run_seconds: float) -> dict:
    """A small Pathways training: the head (the trainer's ``workload-container``, what the trigger follows) and
    one worker (``pathways-worker``: Running until deleted), both on the CPU pool, as training_jobset lays out."""

    def pod(container: str, restart: str, annotations: dict) -> dict:
        return {
            "metadata": {"annotations": annotations},
            "spec": {
                "restartPolicy": restart,
                "nodeSelector": {"cloud.google.com/gke-nodepool": "cpu-np"},
                "containers": [
                    {
                        "name": container,
                        "image": "python:3.12",
                        "command": ["/bin/bash", "-c", "sleep infinity"],
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    }
                ],
            },
        }

    def job(job_name: str, template: dict) -> dict:
        return {
            "name": job_name,
            "replicas": 1,
            "template": {"spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": template}},
        }

    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": PART_OF}},
        "spec": {
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["pathways-head"]},
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [
                job(
                    "pathways-head",
                    pod("workload-container", "Never", {"sim.tpu-rl.dev/run-seconds": str(int(run_seconds))}),
                ),
                job("worker", pod("pathways-worker", "OnFailure", {})),
            ],
        },
    }


class Cluster:
    """The benchmark's namespace on the simulated cluster, and what it created there and in the bucket."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        from kubernetes import client, config

        api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.created_namespace = False
        self.pods: set[str] = set()
        self.bucket = storage.Client(project="tpu-rl-sim", credentials=AnonymousCredentials()).bucket(BUCKET)
        self.prefix = f"bench/{namespace}/{uuid.uuid4().hex[:6]}/"

    def ensure_namespace(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.create_namespace({"metadata": {"name": self.namespace}})
            self.created_namespace = True
        except ApiException as e:
            if e.status != 409:
                raise

    def submit(self, names: list[str], run_seconds: float) -> dict[str, dict]:
        created = {}
        for name in names:
            created[name] = self.custom.create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", self.namespace, "jobsets", training_manifest(name, run_seconds)
            )
        return created

    def wait_heads(self, names: list[str], timeout: float = 300) -> dict[str, str]:
        """JobSet name -> its head pod, once every head runs and the MaxText emulator has handled it (so its
        container log exists)."""
        deadline, heads = time.monotonic() + timeout, {}
        while True:
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector="jobset.sigs.k8s.io/replicatedjob-name"
            ).items
            self.pods.update(p.metadata.name for p in pods)
            for p in pods:
                labels, annotations = p.metadata.labels or {}, p.metadata.annotations or {}
                name = labels.get("jobset.sigs.k8s.io/jobset-name")
                if (
                    name in names
                    and labels.get("jobset.sigs.k8s.io/replicatedjob-name") == "pathways-head"
                    and p.status.phase == "Running"
                    and "sim.tpu-rl.dev/exit-at" in annotations
                    and self.log_file(p.metadata.name).exists()
                ):
                    heads[name] = p.metadata.name
            if len(heads) == len(names):
                return heads
            if time.monotonic() > deadline:
                raise SystemExit(f"Only {len(heads)} of {len(names)} heads run after {timeout:.0f} s")
            time.sleep(2)

    def log_file(self, pod: str) -> Path:
        return SIM_DIR / "podlogs" / self.namespace / pod / "workload-container.log"

    def delete_jobsets(self, timeout: float = 180) -> None:
        """Every JobSet of the benchmark in the namespace, foreground (pods first), and waits until they are gone."""
        from kubernetes.client.exceptions import ApiException

        selector = f"app.kubernetes.io/part-of={PART_OF}"
        listing = self.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", self.namespace, "jobsets", label_selector=selector
        )
        for item in listing["items"]:
            with contextlib.suppress(ApiException):
                self.custom.delete_namespaced_custom_object(
                    "jobset.x-k8s.io",
                    "v1alpha2",
                    self.namespace,
                    "jobsets",
                    item["metadata"]["name"],
                    body={"propagationPolicy": "Foreground"},
                )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.custom.list_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", self.namespace, "jobsets", label_selector=selector
            )["items"]
            if not left:
                return
            time.sleep(2)
        print(f"warning: {len(left)} JobSets still being deleted after {timeout:.0f} s", file=sys.stderr)

    def delete_objects(self) -> None:
        for blob in list(self.bucket.list_blobs(prefix=self.prefix)):
            blob.delete()

    def cleanup(self) -> None:
        """JobSets, objects, the container logs of our pods, and the namespace if this benchmark created it."""
        for step in (self.delete_jobsets, self.delete_objects, self._delete_namespace):
            try:
                step()
            except Exception as e:  # go on with the rest
                print(f"warning: cleanup {step.__name__}: {type(e).__name__}: {e}", file=sys.stderr)
        for pod in self.pods:
            shutil.rmtree(SIM_DIR / "podlogs" / self.namespace / pod, ignore_errors=True)
        with contextlib.suppress(OSError):
            (SIM_DIR / "podlogs" / self.namespace).rmdir()

    def _delete_namespace(self) -> None:
        if self.created_namespace:
            self.core.delete_namespace(self.namespace)


# -- the trainers (helper process, not measured) -----------------------------------------------------------


def run_workload(spec_path: str) -> None:
    """Appends a log line to each head's container log every log_interval seconds (CRI format, as the MaxText
    emulator writes them) and uploads each training's event file, longer at each flush: nothing measured here."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from sim import maxtext_outputs as emulator

    spec = json.loads(Path(spec_path).read_text())
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    bucket = storage.Client(project="tpu-rl-sim", credentials=AnonymousCredentials()).bucket(BUCKET)
    trainings, per_flush = spec["trainings"], spec["steps_per_flush"]
    files = []
    for t in trainings:
        scalars = emulator.training_scalars(t["name"], spec["train_steps"], range(1, spec["train_steps"] + 1))
        name, data, sizes = emulator.growing_event_file(scalars)
        files.append((t["prefix"] + name, data, dict(sizes)))

    def flush(i: int) -> None:  # tensorboardX's GCS writer uploads the whole, longer file
        flushes[i] += 1
        rel, data, sizes = files[i]
        bucket.blob(rel).upload_from_string(data[: sizes[min(flushes[i] * per_flush, len(sizes) - 1)]])

    # Every file exists before the triggers start; then each trainer flushes on its own phase, as trainings
    # started at different times do (so a window holds its share of flushes, whatever its length).
    start, interval, count = time.monotonic(), spec["flush_interval"], len(trainings)
    flushes, line_no = [0] * count, 0
    for i in range(count):
        flush(i)
    print("flushed", flush=True)
    next_flush = [start + interval * (i + 1) / count for i in range(count)]
    next_line = [start + i * spec["log_interval"] / count for i in range(count)]
    while not stop:
        now = time.monotonic()
        for i, t in enumerate(trainings):
            if now >= next_flush[i]:
                flush(i)
                next_flush[i] += interval
            if now >= next_line[i]:
                line_no += 1
                stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                text = (
                    f"I1202 {stamp[11:23]} 1 train_rl.py:612] step {flushes[i] * per_flush} ({line_no}): rollout 16 "
                    f"completions, reward {random.random():.3f}, loss {random.random() / 10:.4f}, "
                    f"{random.randint(300, 500)} tokens"
                )
                with open(t["log_file"], "a") as f:
                    f.write(f"{stamp} stdout F {text}\n")
                next_line[i] += spec["log_interval"]
        time.sleep(max(0.05, min(next_flush + next_line) - time.monotonic()))


# -- the trigger runner (the measured process) -------------------------------------------------------------


#: What the triggerer's trigger runner has imported before its first trigger.
RUNNER_MODULES = ("airflow.executors.workloads.trigger", "airflow.jobs.triggerer_job_runner", "airflow.models.trigger")


def run_runner(spec_path: str, log_fd: int, out_path: str) -> None:
    """The triggerer's trigger-runner subprocess, as far as the triggers see it."""
    send_logs_to_supervisor(log_fd)
    for module in RUNNER_MODULES:
        importlib.import_module(module)
    spec = json.loads(Path(spec_path).read_text())
    print(json.dumps({"stage": "ready"}), flush=True)
    # The parent reads the memory of a runner with no trigger: what the triggerer's runner has imported.
    sys.stdin.readline()

    kube = count_kubernetes_requests()
    storage_calls = count_storage_requests()
    result = run_loop(run_triggers(spec), f"{out_path}.prof" if spec["profile"] else None)
    calls = [(t, kind) for t, kind, _ in kube.calls]
    from tpu_rl.hooks.kubernetes import LOG_STREAM_SECONDS

    Path(out_path).write_text(
        json.dumps({**result, "kube": calls, "storage": storage_calls, "log_stream_seconds": LOG_STREAM_SECONDS})
    )


def send_logs_to_supervisor(log_fd: int) -> None:
    """Airflow's logging as in the runner subprocess (supervisor._configure_logs_over_json_channel): JSON lines
    to the supervisor over a socket."""
    os.environ["_AIRFLOW_PROCESS_CONTEXT"] = "client"  # what TriggerRunner.run sets
    from airflow.sdk.log import configure_logging, reset_logging

    reset_logging()
    configure_logging(json_output=True, output=os.fdopen(log_fd, "wb", buffering=0), sending_to_supervisor=True)


def count_kubernetes_requests() -> RequestCounter:
    """Counts each Kubernetes API request of the triggers (a watch or a followed log counts as one)."""
    import kubernetes_asyncio.client

    from benchmarks.jobset_wait import RequestCounter

    kube = RequestCounter()
    kube.wrap(kubernetes_asyncio.client.ApiClient, "trigger")
    return kube


def count_storage_requests() -> list[tuple[float, str]]:
    """Records each Cloud Storage request of the triggers (and each token request) as (time, what): the list
    grows as they run."""
    import aiohttp
    from yarl import URL

    storage_calls: list[tuple[float, str]] = []
    storage_host = os.environ.get("STORAGE_EMULATOR_HOST", "https://storage.googleapis.com").split("://")[-1]
    original = aiohttp.ClientSession._request

    async def counted(self, method, str_or_url, *args, **kwargs):
        url = URL(str_or_url)
        if url.raw_authority == storage_host or url.host == "storage.googleapis.com":
            ranged = " ranged" if "Range" in (kwargs.get("headers") or {}) else ""
            what = "list" if url.path.endswith("/o") else f"read{ranged}"
            storage_calls.append((time.monotonic(), f"{method} {what}"))
        elif url.host and "oauth2" in url.host:
            storage_calls.append((time.monotonic(), f"{method} token"))
        return await original(self, method, str_or_url, *args, **kwargs)

    aiohttp.ClientSession._request = counted
    return storage_calls


def run_loop(main: Coroutine[Any, Any, dict], profile_path: str | None) -> dict:
    """asyncio.run, with cProfile's statistics written to ``profile_path`` when given: the event loop's thread
    only, what the triggers do on the loop, not in threads."""
    if profile_path is None:
        return asyncio.run(main)
    import cProfile

    profiler = cProfile.Profile()
    result = profiler.runcall(asyncio.run, main)
    profiler.dump_stats(profile_path)
    return result


async def run_triggers(spec: dict) -> dict:
    """The spec's triggers run by Airflow's TriggerRunner, with its blocking watchdog, until SIGTERM: which
    triggers ended before, how late the loop woke and (``attribute``) which callbacks held it over 0.1 s."""
    from airflow.executors.workloads.trigger import RunTrigger
    from airflow.jobs.triggerer_job_runner import TriggerRunner
    from airflow.models.trigger import Trigger

    from tpu_rl.triggers.jobset import JobSetTrigger  # the runner imports it for the first trigger anyway

    runner = TriggerRunner()
    for i, kwargs in enumerate(spec["triggers"], start=1):
        classpath, serialized = JobSetTrigger(**kwargs).serialize()  # what BaseOperator.defer stores
        runner.to_create.append(
            RunTrigger(id=i, classpath=classpath, encrypted_kwargs=Trigger.encrypt_kwargs(serialized))
        )
    watchdog = asyncio.create_task(runner.block_watchdog())
    lags: list[tuple[float, float]] = []
    slow: list[tuple[float, str]] = []
    if spec["attribute"]:
        record_slow_callbacks(slow)
    prober = asyncio.create_task(probe_lags(lags))
    await runner.create_triggers()
    print(json.dumps({"stage": "started", "t": time.monotonic(), "triggers": len(runner.triggers)}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    ended_early = await stop_triggers(runner, prober, watchdog)
    return {"ended_early": ended_early, "lags": lags, "slow": [(t, m) for t, m in slow if "Executing" in m]}


def record_slow_callbacks(slow: list[tuple[float, str]]) -> None:
    """asyncio's debug mode on the running loop: each callback that held it over 0.1 s, named, into ``slow``."""
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.1
    handler = logging.Handler()
    handler.emit = lambda record: slow.append((time.monotonic(), record.getMessage()[:300]))
    logging.getLogger("asyncio").addHandler(handler)


async def probe_lags(lags: list[tuple[float, float]]) -> None:
    """How late the loop wakes a 0.1 s sleep, as (when, how late), until cancelled."""
    while True:
        before = time.monotonic()
        await asyncio.sleep(0.1)
        lags.append((before, time.monotonic() - before - 0.1))


async def stop_triggers(runner, prober: asyncio.Task, watchdog: asyncio.Task) -> dict[str, str]:
    """Cancels the triggers and the probe and waits for them and the watchdog; returns the triggers that had
    ended before (their id -> their exception, or "done")."""
    ended_early = {
        str(i): repr(d["task"].exception()) if d["task"].done() and not d["task"].cancelled() else "done"
        for i, d in runner.triggers.items()
        if d["task"].done()
    }
    runner.stop = True
    tasks = [d["task"] for d in runner.triggers.values()]
    for task in [*tasks, prober]:
        task.cancel()
    await asyncio.gather(*tasks, prober, watchdog, return_exceptions=True)
    return ended_early


# -- the supervisor's side of the trigger logs -------------------------------------------------------------


def run_sink(log_fd: int, log_folder: str) -> None:
    """TriggerRunnerSupervisor's handling of the runner's log channel: decode each JSON line and write it,
    formatted, to the trigger's own log file (TriggerLoggingFactory, relative to [logging] base_log_folder)."""
    from airflow.jobs.triggerer_job_runner import TriggerLoggingFactory, TriggerRunnerSupervisor
    from airflow.sdk.execution_time.supervisor import make_buffered_socket_reader

    class Factories(dict):
        def get(self, trigger_id, default=None):
            if trigger_id not in self:
                self[trigger_id] = TriggerLoggingFactory(log_path=f"{log_folder}/trigger-{trigger_id}.log", ti=None)
            return self[trigger_id]

    supervisor = type("Supervisor", (), {"logger_cache": Factories()})()
    sock = socket.socket(fileno=log_fd)
    done = []
    reader, _ = make_buffered_socket_reader(
        TriggerRunnerSupervisor._process_log_messages_from_subprocess(supervisor), on_close=lambda s: done.append(1)
    )
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    while not done:
        for _ in selector.select(timeout=1):
            if reader(sock) is False:
                done.append(1)
    for factory in supervisor.logger_cache.values():
        factory.close()


# -- the real triggerer, idle -------------------------------------------------------------------------------


def measure_triggerer(children: Children, env: dict[str, str], settle: float, seconds: float, out: Path) -> dict:
    """``airflow triggerer`` with no triggers: CPU and memory of all its processes."""
    print(f"baseline: airflow triggerer, idle ({settle:.0f} s settle + {seconds:.0f} s measured)", flush=True)
    # Its log server on a free port: other Airflow components on this machine may hold the default 8794.
    env = {**env, "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())}
    subprocess.run(["airflow", "db", "migrate"], env=env, check=True, capture_output=True)
    with open(out, "w") as log:
        triggerer = children.start(["airflow", "triggerer"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(settle)
        if triggerer.poll() is not None:
            raise SystemExit(f"airflow triggerer exited ({triggerer.returncode}); see {out}")
        pids = {}
        for pid in process_tree(triggerer.pid):
            role = "supervisor" if pid == triggerer.pid else "trigger runner"
            if "serve-logs" in command_line(pid):
                role = "log server"
            pids[f"{role} (pid {pid})"] = pid
        window = Window(pids)
        window.run(seconds)
        return window.result()
    finally:
        children.stop(triggerer, group=True)


@contextlib.contextmanager
def postgres():
    """scripts/postgres.sh on port 55433 with the database bench_triggerer; stopped after only if started here."""
    env = {**os.environ, "TPU_RL_PG_PORT": PG_PORT}
    script = REPO / "scripts" / "postgres.sh"
    said = subprocess.run([script, "start"], env=env, capture_output=True, text=True, check=True).stdout
    started = said.startswith("started")
    try:
        try:
            socket.create_connection(("127.0.0.1", int(PG_PORT)), timeout=5).close()
        except OSError as e:  # its data folder is the checkout's, whatever the port: another port may hold it
            raise SystemExit(f"PostgreSQL said {said.strip()!r} but does not answer on port {PG_PORT}: {e}") from e
        subprocess.run([script, "ensure-db", PG_DATABASE], env=env, check=True, capture_output=True)
        yield
    finally:
        if started:
            subprocess.run([script, "stop"], env=env, check=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- one load ----------------------------------------------------------------------------------------------


def trigger_kwargs(jobset: dict, prefix: str, train_steps: int) -> dict:
    """What JobSetOperator._trigger gives JobSetTrigger for a training (TrainRlOperator.trigger_kwargs: training=
    and the log cursor, kept on the JobSet)."""
    from tpu_rl import jobset_status as st

    meta = jobset["metadata"]
    replicated_job, container = st.log_source(jobset)
    return {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "uid": meta["uid"],
        "log_replicated_job": replicated_job,
        "log_container": container,
        "cluster": {"kubernetes_conn_id": KUBERNETES_CONN_ID, "gcp_conn_id": GCP_CONN_ID},
        "progress_interval": 300,  # JobSetOperator's default
        "log_tail_lines": 100,
        "delete_on_kill": True,
        "training": {"bucket": BUCKET, "prefix": prefix, "train_steps": train_steps, "gcp_conn_id": GCP_CONN_ID},
        "log_cursor": True,
    }


def run_load(n: int, args, cluster: Cluster, children: Children, env: dict[str, str], tmp: Path) -> dict:
    """One load: N trainings, their trainers' helper, the trigger runner and its log sink, measured over the
    window; its row of the report. The JobSets and objects are deleted after, also after an error."""
    spec_path = submit_trainings(n, args, cluster, tmp)
    out_path = tmp / f"runner-{n}.json"
    workload = start_trainers(children, env, spec_path)
    runner, sink = start_runner_and_sink(n, children, env, spec_path, out_path, tmp)
    try:
        measured = measure_load(n, args, children, runner, sink)
    finally:
        children.stop(workload)
        for process in (runner, sink):
            children.stop(process)
        print(f"N={n}: deleting the JobSets and objects", flush=True)
        cluster.delete_jobsets()
        cluster.delete_objects()
    log_folder = Path(env["AIRFLOW_HOME"]) / "logs" / f"bench-n{n}"
    return load_row(n, measured, json.loads(out_path.read_text()), tmp / f"sink-{n}.out", log_folder)


def submit_trainings(n: int, args, cluster: Cluster, tmp: Path) -> Path:
    """Submits N JobSets, waits until their heads run, and writes the spec the trainers' helper and the runner
    read (the trainings, and the triggers' keywords); returns its path."""
    tag = uuid.uuid4().hex[:4]
    names = [f"tl{n}-{tag}-{i:03d}" for i in range(n)]
    run_seconds = args.warmup + args.window + 900
    print(f"N={n}: submitting {n} JobSets in {cluster.namespace}", flush=True)
    jobsets = cluster.submit(names, run_seconds)
    heads = cluster.wait_heads(names)
    prefixes = {name: f"{cluster.prefix}{name}/trained/run/{name}/tensorboard/" for name in names}
    spec = {
        "trainings": [
            {"name": name, "prefix": prefixes[name], "log_file": str(cluster.log_file(heads[name]))} for name in names
        ],
        "train_steps": args.train_steps,
        "steps_per_flush": args.steps_per_flush,
        "log_interval": args.log_interval,
        "flush_interval": args.flush_interval,
        "triggers": [trigger_kwargs(jobsets[name], prefixes[name], args.train_steps) for name in names],
        "attribute": args.attribute,
        "profile": args.profile,
    }
    spec_path = tmp / f"spec-{n}.json"
    spec_path.write_text(json.dumps(spec))
    return spec_path


def start_trainers(children: Children, env: dict[str, str], spec_path: Path) -> subprocess.Popen:
    """The trainers' helper, once the first version of each event file is up."""
    workload = children.start(self_argv("workload", spec_path), env=env, stdout=subprocess.PIPE, text=True)
    if workload.stdout.readline().strip() != "flushed":
        raise SystemExit("the trainers' helper did not write the event files")
    return workload


def start_runner_and_sink(
    n: int, children: Children, env: dict[str, str], spec_path: Path, out_path: Path, tmp: Path
) -> tuple[subprocess.Popen, subprocess.Popen]:
    """The trigger runner and the log sink, joined by a socket (the runner's log channel); the sink's own output
    goes to sink-N.out."""
    runner_end, sink_end = socket.socketpair()
    with open(tmp / f"sink-{n}.out", "w") as sink_out:
        sink = children.start(
            self_argv("sink", "--log-fd", sink_end.fileno(), "--log-folder", f"bench-n{n}"),
            env=env,
            pass_fds=[sink_end.fileno()],
            stdout=sink_out,
            stderr=subprocess.STDOUT,
        )
    runner = children.start(
        self_argv("runner", spec_path, "--log-fd", runner_end.fileno(), "--out", out_path),
        env=env,
        pass_fds=[runner_end.fileno()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    runner_end.close()
    sink_end.close()
    return runner, sink


@dataclass
class Measured:
    """One load's measurements, and when they were taken: monotonic times for the runner's records, wall-clock
    times for the sink's log lines."""

    #: The runner's and the sink's memory and CPU seconds before any trigger started.
    idle: dict[str, dict[str, int]]
    idle_cpu: dict[str, float]
    #: Window.result() of the runner and the sink.
    window: dict[str, dict[str, float]]
    go: float
    go_wall: datetime
    start: float
    end: float
    start_wall: datetime
    end_wall: datetime


def measure_load(n: int, args, children: Children, runner: subprocess.Popen, sink: subprocess.Popen) -> Measured:
    """Reads the idle runner, starts its triggers, waits out the warm-up, measures the window, then stops the
    runner (SIGTERM: it writes its records) and the sink (which ends with the runner's log channel)."""
    if json.loads(runner.stdout.readline() or "{}").get("stage") != "ready":
        raise SystemExit("the trigger runner did not start")
    time.sleep(2)
    idle = {"runner": memory(runner.pid), "sink": memory(sink.pid)}
    idle_cpu = {"runner": cpu_seconds(runner.pid), "sink": cpu_seconds(sink.pid)}
    go, go_wall = time.monotonic(), datetime.now(UTC)
    runner.stdin.write("go\n")
    runner.stdin.flush()
    started = json.loads(runner.stdout.readline() or "{}")
    if started.get("stage") != "started":
        raise SystemExit("the trigger runner did not start its triggers")
    print(f"N={n}: {started['triggers']} triggers running; warm-up {args.warmup:g} s", flush=True)
    time.sleep(max(0.0, started["t"] + args.warmup - time.monotonic()))
    print(f"N={n}: measuring {args.window:g} s", flush=True)
    start_wall = datetime.now(UTC)
    window = Window({"runner": runner.pid, "sink": sink.pid})
    window.run(args.window)
    measured = window.result()
    start, end = window.start, window.start + measured["runner"]["wall"]
    end_wall = datetime.now(UTC)
    runner.send_signal(signal.SIGTERM)
    runner.wait(60)
    children.stop(runner)
    sink.wait(30)
    children.stop(sink)
    return Measured(idle, idle_cpu, measured, go, go_wall, start, end, start_wall, end_wall)


def load_row(n: int, measured: Measured, result: dict, sink_output: Path, log_folder: Path) -> dict:
    """The report's row of one load: the runner's records (``result``) counted over the window, per minute per
    training, beside the measured CPU and memory."""
    t0, t1 = measured.start, measured.end
    minutes = (t1 - t0) / 60
    kube = collections.Counter(kind for t, kind in result["kube"] if t0 <= t <= t1)
    storage = collections.Counter(kind for t, kind in result["storage"] if t0 <= t <= t1)
    lags = [lag for t, lag in result["lags"] if t0 <= t <= t1]
    start_lags = [lag for t, lag in result["lags"] if measured.go <= t < t0]
    return {
        "n": n,
        "measured": measured.window,
        "idle": measured.idle,
        "idle_cpu": measured.idle_cpu,
        "kube": kube,
        "storage": storage,
        "kube_rate": sum(kube.values()) / minutes / n,
        "storage_rate": sum(storage.values()) / minutes / n,
        "lag_max": max(lags, default=0.0),
        "lag_p99": sorted(lags)[int(len(lags) * 0.99)] if lags else 0.0,
        "blocked": blocked_warnings(sink_output, measured),
        "start_lag_max": max(start_lags, default=0.0),
        "slow": collections.Counter(_callback(message) for t, message in result["slow"] if t >= measured.go),
        "ended_early": result["ended_early"],
        "log_bytes": sum(f.stat().st_size for f in log_folder.glob("*")),
        "minutes": minutes,
        "log_stream_seconds": result["log_stream_seconds"],
    }


def blocked_warnings(sink_output: Path, measured: Measured) -> dict[str, list[float]]:
    """The runner's watchdog warnings (the sink prints them with their time), as how long the loop was blocked:
    while the triggers started (and the warm-up), and in the window."""
    blocked = {"start": [], "window": []}
    for line in sink_output.read_text().splitlines():
        with contextlib.suppress(ValueError, IndexError):
            if "was blocked for" in line:
                at, seconds = datetime.fromisoformat(line.split()[0]), float(line.split("blocked for ")[1].split()[0])
                if measured.go_wall <= at < measured.start_wall:
                    blocked["start"].append(seconds)
                elif measured.start_wall <= at <= measured.end_wall:
                    blocked["window"].append(seconds)
    return blocked


def _callback(message: str) -> str:
    """What asyncio's debug mode names as slow: the coroutine and where it was, without the task's other details
    ("Executing <Task ... coro=<JobSetTrigger.run() running at .../jobset.py:120> ...> took 0.3 seconds")."""
    coroutine = re.search(r"coro=<(\S+) running at (\S+?)>", message)
    if coroutine:
        return f"{coroutine[1]} at {'/'.join(Path(coroutine[2]).parts[-2:])}"
    return message.split(" took ")[0][:160]


# -- the report ----------------------------------------------------------------------------------------------


def report(baseline: dict | None, rows: list[dict]) -> None:
    """The table: one row per N. CPU in cores (of one); memory in MiB (1024 * 1024 bytes)."""
    print()
    base_cpu, base_mem = print_baseline(baseline)
    growths = print_loads(rows, base_cpu, base_mem)
    for (n0, g0), (n1, g1) in zip(growths, growths[1:], strict=False):
        print(f"Memory per further training, N={n0} -> {n1}: {(g1 - g0) / (n1 - n0):.2f} MiB")
    if rows:
        print_goal(rows[-1], with_baseline=bool(baseline))
    stalls(rows)
    print_requests(rows)


def print_baseline(baseline: dict | None) -> tuple[float, float]:
    """The idle triggerer's processes; returns its CPU (cores) and memory (MiB PSS), 0 without a baseline."""
    if not baseline:
        print("No baseline measured (--no-baseline): totals are the trainings' share only.")
        return 0.0, 0.0
    base_cpu = sum(p["cpu"] for p in baseline.values())
    base_mem = sum(p["pss_mean"] for p in baseline.values()) / MIB
    rss = sum(p["rss_mean"] for p in baseline.values()) / MIB
    print(
        f"Triggerer baseline (airflow triggerer, no triggers, {len(baseline)} processes): "
        f"CPU {base_cpu:.3f} core, memory {base_mem:.0f} MiB PSS ({rss:.0f} MiB RSS summed)"
    )
    for name, p in baseline.items():
        pss, rss = p["pss_mean"] / MIB, p["rss_mean"] / MIB
        print(f"  {name:<28} CPU {p['cpu']:.3f}  PSS {pss:4.0f} MiB  RSS {rss:4.0f} MiB")
    return base_cpu, base_mem


def print_loads(rows: list[dict], base_cpu: float, base_mem: float) -> list[tuple[int, float]]:
    """One line per N, with the totals (also kept in each row, for the goal); returns each N's memory growth (runner
    and sink, MiB)."""
    header = (
        "   N | runner CPU | sink CPU | runner RSS idle  mean   max   HWM | +MiB | sink +MiB "
        "| k8s/min/trg | gcs/min/trg | lag p99   max s | total CPU | total MiB"
    )
    print()
    print(header)
    print("-" * len(header))
    growths = []
    for r in rows:
        run, sink = r["measured"]["runner"], r["measured"]["sink"]
        idle = r["idle"]["runner"]["VmRSS"] / MIB
        growth = run["rss_mean"] / MIB - idle
        sink_growth = sink["rss_mean"] / MIB - r["idle"]["sink"]["VmRSS"] / MIB
        growths.append((r["n"], growth + sink_growth))
        r["total_cpu"] = base_cpu + run["cpu"] + sink["cpu"]
        r["total_mem"] = base_mem + max(0.0, growth) + max(0.0, sink_growth)
        print(
            f"{r['n']:4d} | {run['cpu']:10.3f} | {sink['cpu']:8.3f} | "
            f"          {idle:5.0f} {run['rss_mean'] / MIB:5.0f} {run['rss_max'] / MIB:5.0f} {run['hwm'] / MIB:5.0f} | "
            f"{growth:4.0f} | {sink_growth:9.1f} | {r['kube_rate']:11.2f} | {r['storage_rate']:11.2f} | "
            f"{r['lag_p99']:7.3f} {r['lag_max']:5.3f} | {r['total_cpu']:9.3f} | {r['total_mem']:9.0f}"
        )
    print()
    print("runner: the process running the N triggers; sink: the supervisor's handling of their log lines.")
    print("+MiB: runner RSS mean over the window less its RSS before the first trigger (imports made on first use")
    print("included). Total = baseline + runner + sink CPU; memory = baseline PSS + runner and sink growth.")
    return growths


def print_goal(last: dict, with_baseline: bool) -> None:
    """Whether the largest load meets the goals for CPU, memory and requests per training."""
    meets = (
        last["total_cpu"] <= GOAL_CPU,
        last["total_mem"] <= GOAL_MEMORY_MIB,
        last["kube_rate"] <= GOAL_REQUESTS_PER_MINUTE,
        last["storage_rate"] <= GOAL_REQUESTS_PER_MINUTE,
    )
    print(
        f"Goal at N={last['n']}: CPU {last['total_cpu']:.3f} <= {GOAL_CPU} {'yes' if meets[0] else 'NO'}; "
        f"memory {last['total_mem']:.0f} <= {GOAL_MEMORY_MIB} MiB {'yes' if meets[1] else 'NO'}; "
        f"Kubernetes {last['kube_rate']:.2f}/min/training <= {GOAL_REQUESTS_PER_MINUTE} "
        f"{'yes' if meets[2] else 'NO'}; storage {last['storage_rate']:.2f}/min/training <= "
        f"{GOAL_REQUESTS_PER_MINUTE} {'yes' if meets[3] else 'NO'}"
        + ("" if with_baseline else " (without the baseline)")
    )


def print_requests(rows: list[dict]) -> None:
    """Per N: the window, the trigger logs' size, the triggers that ended early, and each kind of request."""
    for r in rows:
        print(
            f"\nN={r['n']}: window {r['minutes']:.2f} min; trigger log files {r['log_bytes'] / 1024:.0f} KiB; "
            f"triggers ended before the end: "
            f"{len(r['ended_early'])}" + (f" {dict(list(r['ended_early'].items())[:3])}" if r["ended_early"] else "")
        )
        for kind, count in r["kube"].most_common():
            print(f"  {count / r['minutes'] / r['n']:6.3f}/min/trg  {count:5d}  {kind}")
        reopen = r["log_stream_seconds"]
        if r["minutes"] * 60 < reopen and not any("follow" in kind for kind in r["kube"]):
            print(
                f"  (+{60 / reopen:.3f}/min/trg        trigger GET /api/v1/pods/NAME/log follow: reopened every "
                f"{reopen} s, LOG_STREAM_SECONDS; none falls in a shorter window)"
            )
        for kind, count in r["storage"].most_common():
            print(f"  {count / r['minutes'] / r['n']:6.3f}/min/trg  {count:5d}  storage {kind}")


def stalls(rows: list[dict]) -> None:
    """The event loop's stalls: while the N triggers start (and the warm-up), and in the window."""
    print()
    header = "   N | start: longest stall s  'blocked' warnings (longest s) | window: longest stall s  'blocked'"
    print(header)
    print("-" * len(header))
    for r in rows:
        start, window = r["blocked"]["start"], r["blocked"]["window"]
        print(
            f"{r['n']:4d} | {r['start_lag_max']:22.3f}  {len(start):8d} ({max(start, default=0):.2f})"
            f"{'':17} | {r['lag_max']:23.3f}  {len(window):8d}"
        )
    print(
        "A stall: how late the loop woke a 0.1 s sleep. Airflow's watchdog warns when its own 0.1 s sleep took over "
        f"{STALL_GOAL_SECONDS} s (the 'blocked for' figure includes the sleep)."
    )
    worst = max((max(r["start_lag_max"], r["lag_max"]) for r in rows), default=0.0)
    meets = "yes" if worst <= STALL_GOAL_SECONDS else "NO"
    print(f"Goal: no stall over {STALL_GOAL_SECONDS} s: {meets} (longest {worst:.3f} s)")
    for r in rows:
        for where, count in r["slow"].most_common(8):
            print(f"  N={r['n']}: {count:4d} x over 0.1 s  {where}")


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main() -> None:
    args = argument_parser().parse_args()
    if args.role == "runner":
        return run_runner(args.spec, args.log_fd, args.out)
    if args.role == "sink":
        return run_sink(args.log_fd, args.log_folder)
    if args.role == "workload":
        return run_workload(args.spec)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    signal.signal(signal.SIGTERM, _interrupt)
    baseline, rows = run_benchmark(args)
    report(baseline, rows)


def argument_parser() -> argparse.ArgumentParser:
    """The benchmark's options, and the hidden ones of the roles it starts copies of itself in (``self_argv``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainings", type=int, nargs="+", default=[10, 25, 50], help="N, one load each")
    parser.add_argument("--warmup", type=float, default=90, help="seconds after the triggers started")
    parser.add_argument("--window", type=float, default=300, help="seconds measured")
    parser.add_argument("--log-interval", type=float, default=5, help="seconds between a trainer's log lines")
    parser.add_argument("--flush-interval", type=float, default=120, help="seconds between event file flushes")
    parser.add_argument("--steps-per-flush", type=int, default=8, help="training steps each flush adds")
    parser.add_argument("--train-steps", type=int, default=400)
    parser.add_argument("--namespace", default="bench-triggerer")
    parser.add_argument("--baseline-settle", type=float, default=30)
    parser.add_argument("--baseline-seconds", type=float, default=60)
    parser.add_argument("--no-baseline", action="store_true", help="skip the idle airflow triggerer")
    parser.add_argument(
        "--attribute", action="store_true", help="asyncio debug mode in the runner: name each callback over 0.1 s"
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the runner's loop; the statistics in --workdir"
    )
    parser.add_argument("--workdir", help="keep the Airflow home (trigger logs) and the runner's data here")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--log-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--log-folder", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser


def run_benchmark(args) -> tuple[dict | None, list[dict]]:
    """The baseline (unless --no-baseline) and one load per N; the processes it started and what it created in
    the cluster and the bucket are gone after, also after an error or Ctrl-C."""
    simulation = sim_env()
    os.environ.update(simulation)  # this process's own Kubernetes and storage clients reach the simulation
    children = Children()
    cluster = Cluster(simulation["KUBECONFIG"], args.namespace)
    rows, baseline = [], None
    with contextlib.ExitStack() as stack:
        if args.workdir:
            tmp = Path(args.workdir).resolve()
            tmp.mkdir(parents=True, exist_ok=True)
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-triggerer-")))
        env = airflow_env(tmp / "airflow-home", simulation)
        try:
            if not args.no_baseline:
                with postgres():
                    baseline = measure_triggerer(
                        children, env, args.baseline_settle, args.baseline_seconds, tmp / "triggerer.log"
                    )
            cluster.ensure_namespace()
            for n in args.trainings:
                rows.append(run_load(n, args, cluster, children, env, tmp))
        finally:
            children.stop_all()
            print("cleaning up", flush=True)
            cluster.cleanup()
    return baseline, rows


if __name__ == "__main__":
    main()
