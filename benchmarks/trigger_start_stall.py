"""Prints the longest stall of a triggerer's event loop while a GKE operation wait starts in a fresh interpreter
(the trigger's module imported on the loop, as the triggerer imports it, then its first look at GKE), for the
package's ``GkeOperationTrigger`` and for the Google provider's ``GKEOperationTrigger`` it replaced. Airflow warns
from 0.2 s ("Triggerer's async thread was blocked"); every trigger of that triggerer waits meanwhile. Needs the
simulation (make sim-up): the wait asks its GKE emulator.

    python benchmarks/trigger_start_stall.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRIGGERS = {
    "package GkeOperationTrigger": "tpu_rl.triggers.gke:GkeOperationTrigger",
    "provider GKEOperationTrigger": "airflow.providers.google.cloud.triggers.kubernetes_engine:GKEOperationTrigger",
}
#: Runs in the fresh interpreter: a watchdog on the loop measures its longest stall while the trigger's module is
#: imported and the trigger runs to its first event (an operation that does not exist: GKE answers at once).
PROBE = """
import asyncio, importlib, sys
import airflow.triggers.base

async def main():
    loop, worst = asyncio.get_running_loop(), [0.0]

    async def watchdog():
        while True:
            began = loop.time()
            await asyncio.sleep(0.01)
            worst[0] = max(worst[0], loop.time() - began - 0.01)

    watching = asyncio.create_task(watchdog())
    await asyncio.sleep(0.05)
    module, name = sys.argv[1].split(":")
    trigger = getattr(importlib.import_module(module), name)(
        operation_name="operation-none", project_id="tpu-rl-sim", location="us-east5", poll_interval=1
    )
    async for _ in trigger.run():
        break
    watching.cancel()
    print(worst[0])

asyncio.run(main())
"""


def sim_env() -> dict[str, str]:
    out = subprocess.run(
        ["bash", "-c", f"set -a; source {REPO / '.sim/airflow.env'}; env -0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, **sim_env()}
    print(f"{'trigger':<30} {'longest stall (s): min':>24} {'median':>8} {'max':>8}")
    for label, classpath in TRIGGERS.items():
        stalls = [
            float(
                subprocess.run(
                    [sys.executable, "-c", PROBE, classpath], capture_output=True, text=True, check=True, env=env
                ).stdout.split()[-1]
            )
            for _ in range(args.runs)
        ]
        print(f"{label:<30} {min(stalls):>24.3f} {statistics.median(stalls):>8.3f} {max(stalls):>8.3f}")


if __name__ == "__main__":
    main()
