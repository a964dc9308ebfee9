"""Triggers the DAG on a running local Airflow, waits for the run and prints its stages and outputs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_airflow import LocalAirflow, stage_table  # noqa: E402

DAG_ID = "maxtext_rl_tpu"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--conf", required=True, help="JSON file with the run's params")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    airflow = LocalAirflow(args.url)
    conf = json.loads(Path(args.conf).read_text())

    airflow.wait_for_dag(DAG_ID)
    airflow.unpause(DAG_ID)
    run_id = airflow.trigger(DAG_ID, conf)
    print(f"triggered {DAG_ID} run {run_id} with {args.conf}")
    started, last = time.monotonic(), None

    def progress(_state: str) -> None:
        nonlocal last
        running = sorted(t for t, ti in airflow.task_instances(DAG_ID, run_id).items() if ti["state"] in ("running", "deferred", "up_for_reschedule"))
        if running != last:
            print(f"  {time.monotonic() - started:6.0f} s  {', '.join(running) or '...'}", flush=True)
            last = running

    state = airflow.wait_for_run(DAG_ID, run_id, args.timeout, on_poll=progress)
    instances = airflow.task_instances(DAG_ID, run_id)
    print(f"\nrun {run_id}: {state} in {time.monotonic() - started:.0f} s\n")
    print(stage_table(instances))
    if state != "success":
        for task_id, ti in instances.items():
            if ti["state"] == "failed":
                log = airflow.task_log(DAG_ID, run_id, task_id, ti["try_number"])
                print(f"\n--- {task_id} (try {ti['try_number']}), last lines of its log ---")
                print("\n".join(log.splitlines()[-25:]))
        return 1
    print("\noutputs:")
    print(f"  final training step: {airflow.xcom(DAG_ID, run_id, 'verify_training')}")
    print(f"  Hugging Face model:  {airflow.xcom(DAG_ID, run_id, 'publish_export')}")
    print(f"  base checkpoint:     {airflow.xcom(DAG_ID, run_id, 'verify_converted')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
