"""Triggers the DAG on a running local Airflow, waits for the run and prints its stages and outputs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from scripts.local_airflow import LocalAirflow, _time, stage_table

DAG_ID = "maxtext_rl_tpu"
#: How long the emulated trainer trains in the demo: long enough for train_rl's progress lines (one a minute)
#: to show the training on its way, with an ETA, as the trainer's growing event file reaches the bucket.
TRAINING_SECONDS = 150


def main() -> int:
    args = parse_args()
    airflow = LocalAirflow(args.url)
    conf = json.loads(Path(args.conf).read_text())

    airflow.wait_for_dag(DAG_ID)
    airflow.unpause(DAG_ID)
    run_id = airflow.trigger(DAG_ID, conf)
    print(f"triggered {DAG_ID} run {run_id} with {args.conf}")
    train_for(run_id, conf, TRAINING_SECONDS)
    started = time.monotonic()
    progress = progress_printer(airflow, run_id, started)
    try:
        state = airflow.wait_for_run(DAG_ID, run_id, args.timeout, on_poll=progress)
    finally:
        train_for(run_id, conf, None)
    instances = airflow.task_instances(DAG_ID, run_id)
    print(f"\nrun {run_id}: {state} in {time.monotonic() - started:.0f} s\n")
    print(stage_table(instances, airflow.upstream(DAG_ID)))
    if conf.get("tpu_pool_mode", "per_run") == "per_run" and not conf.get("kubernetes_conn_id"):
        print()
        print(tpu_time(conf, run_id, instances))
    if state != "success":
        print_failed_logs(airflow, run_id, instances)
        return 1
    print_outputs(airflow, run_id, instances)
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--conf", required=True, help="JSON file with the run's params")
    parser.add_argument("--timeout", type=float, default=1800)
    return parser.parse_args()


def progress_printer(airflow: LocalAirflow, run_id: str, started: float) -> Callable[[str], None]:
    """What to call at each poll of the run: prints the stages that run, when they change; while train_rl waits
    for the training, its new progress lines as the triggerer logs them (its log read every 15 s)."""
    last, shown, read_at = None, set(), 0.0

    def progress(_state: str) -> None:
        nonlocal last, read_at
        instances = airflow.task_instances(DAG_ID, run_id)
        running = sorted(
            t for t, ti in instances.items() if ti["state"] in ("running", "deferred", "up_for_reschedule")
        )
        if running != last:
            print(f"  {time.monotonic() - started:6.0f} s  {', '.join(running) or '...'}", flush=True)
            last = running
        if "train_rl" in running and time.monotonic() - read_at >= 15:
            read_at = time.monotonic()
            log = airflow.task_log(DAG_ID, run_id, "train_rl", instances["train_rl"]["try_number"])
            for line in progress_lines(log):
                if line not in shown:
                    shown.add(line)
                    print(f"  {time.monotonic() - started:6.0f} s    {line}", flush=True)

    return progress


def print_failed_logs(airflow: LocalAirflow, run_id: str, instances: dict) -> None:
    """The last lines of each failed task's log: why the run failed."""
    for task_id, ti in instances.items():
        if ti["state"] == "failed":
            log = airflow.task_log(DAG_ID, run_id, task_id, ti["try_number"])
            print(f"\n--- {task_id} (try {ti['try_number']}), last lines of its log ---")
            print("\n".join(log.splitlines()[-25:]))


def print_outputs(airflow: LocalAirflow, run_id: str, instances: dict) -> None:
    """A successful run's last progress lines and what it produced (its tasks' XComs)."""
    train_log = airflow.task_log(DAG_ID, run_id, "train_rl", instances["train_rl"]["try_number"])
    print("\ntraining progress (train_rl's log, at most one line a minute):")
    print("\n".join(f"  {line}" for line in progress_lines(train_log)[-5:]) or "  (none logged)")
    print(f"\n{airflow.xcom(DAG_ID, run_id, 'pipeline_done')}")
    print("\noutputs:")
    print(f"  final training step: {airflow.xcom(DAG_ID, run_id, 'verify_training')}")
    print(f"  Hugging Face model:  {airflow.xcom(DAG_ID, run_id, 'publish_export')}")
    print(f"  base checkpoint:     {airflow.xcom(DAG_ID, run_id, 'verify_converted')}")


def progress_lines(log: str) -> list[str]:
    """train_rl's progress lines, from ``Training progress:`` on."""
    return [
        line[line.index("Training progress:") :].strip() for line in log.splitlines() if "Training progress:" in line
    ]


def train_for(run_id: str, conf: dict, seconds: float | None) -> None:
    """Makes the simulation's trainer of this run train for ``seconds`` (a rule of sim/faults.py on its JobSet);
    None removes the rule."""
    from sim import faults
    from tpu_rl.config import RunConfig
    from tpu_rl.run import RunIdentity

    api, rule = faults.core_api(), f"demo-training-{RunIdentity(DAG_ID, run_id).key}"
    if seconds is None:
        faults.clear_faults(api, rule)
        return
    jobset = RunIdentity(DAG_ID, run_id).jobset_name(RunConfig.from_params(conf).workload_prefix, "train")
    faults.set_fault(api, rule, prefix=jobset, stage="train_rl", run_seconds=seconds)


def tpu_time(conf: dict, run_id: str, instances: dict) -> str:
    """When the run's TPU slice existed (its node pools' create and delete operations, from the GKE API)
    against when it trained (train_rl in Airflow): what the slice cost beyond the training itself."""
    import os

    from sim import clients
    from tpu_rl.run import RunIdentity

    client = clients.gke_client(os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    operations = client.list_operations(parent=f"projects/{conf['project']}/locations/{conf['region']}").operations
    run = RunIdentity(DAG_ID, run_id)
    pools = {run.tpu_pool_name(i) for i in range(int(conf.get("cluster_nodepool_count", 1)))}
    mine = [op for op in operations if op.target_link.rsplit("/", 1)[-1] in pools]
    created = [_time(op.start_time) for op in mine if op.operation_type.name == "CREATE_NODE_POOL"]
    deleted = [_time(op.end_time) for op in mine if op.operation_type.name == "DELETE_NODE_POOL" and op.end_time]
    train = instances.get("train_rl", {})
    if not created or not deleted or not train.get("end_date"):
        return "TPU time: the slice or the training did not complete; nothing to compare"
    slice_start, slice_end = min(created), max(deleted)
    train_start, train_end = _time(train["start_date"]), _time(train["end_date"])
    slice_s, train_s = (slice_end - slice_start).total_seconds(), (train_end - train_start).total_seconds()
    return "\n".join(
        [
            "TPU time (slice: its node pools' GKE operations; training: train_rl)",
            (
                f"  slice nodes  {slice_start:%H:%M:%S} -> {slice_end:%H:%M:%S}  {slice_s:7.1f} s  "
                "(pool create requested -> pool deleted)"
            ),
            f"  training     {train_start:%H:%M:%S} -> {train_end:%H:%M:%S}  {train_s:7.1f} s",
            f"  ratio        {slice_s / train_s:.2f} (TPU-slice time / training time)",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
