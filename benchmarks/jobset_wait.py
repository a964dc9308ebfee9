"""What waiting for a long JobSet costs: Kubernetes API requests per minute, and worker-slot seconds.

Runs JobSetOperator on the simulated cluster (sim/up.sh; started here if it is not up) for a JobSet
whose pods run for --run-seconds, and prints numbers; it asserts nothing. Requests are counted by
wrapping the Kubernetes clients' ``call_api`` (sync client: the operator on the worker; asyncio
client: the trigger), so only this task's requests are counted, not the cluster's controllers'.

    .venv/bin/python benchmarks/jobset_wait.py [--run-seconds 300] [--hosts 16]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shlex
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIM_DIR = Path(os.environ.get("TPU_RL_SIM_DIR", REPO / ".sim"))


class RequestCounter:
    """Counts API calls per (client, verb, resource); a watch or a followed log counts as one."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str, str]] = []

    def wrap(self, api_client_class, side: str) -> None:
        original = api_client_class.call_api
        counter = self

        def kind(method: str, path: str, query) -> str:
            params = dict(query or [])
            resource = re.sub(r"/namespaces/[^/]+", "", path)
            resource = re.sub(r"/(jobsets|pods|nodes|workloads)/[^/]+", r"/\1/NAME", resource)
            watch = " watch" if str(params.get("watch", "")).lower() == "true" else ""
            follow = " follow" if str(params.get("follow", "")).lower() == "true" else ""
            return f"{side} {method} {resource}{watch}{follow}"

        if asyncio.iscoroutinefunction(original):

            async def call_api(self, resource_path, method, *args, **kwargs):
                counter.calls.append((time.monotonic(), kind(method, resource_path, kwargs.get("query_params")), side))
                return await original(self, resource_path, method, *args, **kwargs)
        else:

            def call_api(self, resource_path, method, *args, **kwargs):
                counter.calls.append((time.monotonic(), kind(method, resource_path, kwargs.get("query_params")), side))
                return original(self, resource_path, method, *args, **kwargs)

        api_client_class.call_api = call_api


class TaskInstanceStandIn:
    """Identity, try number and XCom: what the operator reads from Airflow's task instance."""

    def __init__(self, name: str) -> None:
        self.dag_id, self.run_id, self.task_id, self.try_number, self.map_index = "bench", f"b__{name}", "train", 1, -1
        self.start_date = datetime.now(UTC)
        self.xcoms: dict = {}

    def xcom_push(self, key, value):
        self.xcoms[key] = value

    def xcom_pull(self, task_ids=None, key="return_value"):
        return self.xcoms.get(key)


def manifest(name: str, hosts: int, run_seconds: float) -> dict:
    pod = {
        "metadata": {"annotations": {"sim.tpu-rl.dev/run-seconds": str(run_seconds)}},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"},
            "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "workload-container",
                    "image": "python:3.12",
                    "command": ["/bin/bash", "-c", "true"],
                    "resources": {"limits": {"google.com/tpu": "4"}},
                }
            ],
        },
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [
                {
                    "name": "main-job",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": hosts,
                            "completions": hosts,
                            "backoffLimit": 0,
                            "completionMode": "Indexed",
                            "template": pod,
                        }
                    },
                }
            ],
        },
    }


def ensure_sim() -> None:
    if subprocess.run([REPO / "sim" / "status.sh"], capture_output=True).returncode != 0:
        subprocess.run([REPO / "sim" / "up.sh"], check=True)
    for line in (SIM_DIR / "airflow.env").read_text().splitlines():
        if line.startswith("export AIRFLOW_CONN_"):
            key, _, value = line[len("export ") :].partition("=")
            os.environ[key] = shlex.split(value)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-seconds", type=float, default=300)
    parser.add_argument("--hosts", type=int, default=16)
    args = parser.parse_args()
    ensure_sim()

    import kubernetes.client
    import kubernetes_asyncio.client
    from airflow.sdk.exceptions import TaskDeferred

    from tpu_rl.operators.jobset import JobSetOperator

    counter = RequestCounter()
    counter.wrap(kubernetes.client.ApiClient, "operator")
    counter.wrap(kubernetes_asyncio.client.ApiClient, "trigger")

    name = f"bench-{uuid.uuid4().hex[:6]}"
    op = JobSetOperator(
        task_id="train",
        manifest=manifest(name, args.hosts, args.run_seconds),
        kubernetes_conn_id="tpu_rl_sim",
        progress_interval=60,
    )
    context = {"ti": TaskInstanceStandIn(name)}

    t0 = time.monotonic()
    try:
        op.execute(context)
        raise SystemExit("the operator did not defer")
    except TaskDeferred as deferred:
        trigger = deferred.trigger
        method = deferred.method_name
    t1 = time.monotonic()

    async def first_event():
        async for event in trigger.run():
            return event

    event = asyncio.run(first_event())
    t2 = time.monotonic()
    result = op.resume_execution(method, {"event": event.payload}, context)
    t3 = time.monotonic()

    deferred_calls = [c for c in counter.calls if t1 <= c[0] <= t2]
    minutes = (t2 - t1) / 60
    print(
        f"JobSet {name}: {args.hosts} pods x {args.run_seconds:g} s, state {result['state']}, "
        f"{len(result['log_tail'])} log lines kept"
    )
    print(f"worker slot held: execute {t1 - t0:.2f} s + execute_complete {t3 - t2:.2f} s = {t1 - t0 + t3 - t2:.2f} s")
    print(f"deferred (triggerer, no worker slot): {t2 - t1:.1f} s")
    print(
        f"API requests while deferred: {len(deferred_calls)} in {minutes:.2f} min = "
        f"{len(deferred_calls) / minutes:.2f} per minute (watches and followed logs count once each)"
    )
    print(f"API requests by the operator on the worker: {sum(1 for c in counter.calls if c[2] == 'operator')}")
    print("requests by kind:")
    for kind, n in collections.Counter(c[1] for c in counter.calls).most_common():
        print(f"  {n:4d}  {kind}")


if __name__ == "__main__":
    main()
