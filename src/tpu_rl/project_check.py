"""A run's preflight, read and judged: what ``preflight`` (the stage) and ``python -m tpu_rl.project_check`` (the
command, with your Application Default Credentials) both run. Reads through ``tpu_rl.hooks.compute``; decides
with ``tpu_rl.preflight``.

    python -m tpu_rl.project_check --conf FILE.json     # or: make preflight CONF=FILE.json

prints each capacity candidate's verdict and every warning, and exits 1 when the run would fail its preflight
(2 for a conf that fails validation), before anything is created."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from tpu_rl import gke
from tpu_rl.config import ConfigError, RunConfig
from tpu_rl.hooks.compute import ComputeApiHook
from tpu_rl.preflight import Preflight, assess, creates_tpu_pools, report_lines, reservations_to_read
from tpu_rl.run import DAG_ID, RunIdentity

#: The zones a regional cluster created without ``locations`` puts a pool's nodes in: three of its region (GKE
#: "Regional clusters": "By default, GKE replicates each node pool across three zones of the control plane's
#: region"; the GKE emulator does the same, sim/gke_rules.py ``pool_zones``).
REGIONAL_CLUSTER_ZONES = 3


def check_project(config: RunConfig, run: RunIdentity, hook: ComputeApiHook) -> Preflight | None:
    """The run's preflight (None: the run creates no cluster and no TPU pool, so there is nothing to check). Only a
    cluster the run creates draws new CPU quota: a shared one may exist already."""
    pools: list[dict[str, Any]] = []
    if config.cluster_mode == "create":
        pools = gke.cluster_body(config, run, datetime.now(UTC))["node_pools"]
    if not creates_tpu_pools(config) and not pools:
        return None
    readings = {(zone, path): hook.reservation(zone, path) for zone, path in reservations_to_read(config)}
    quotas = hook.quotas(config.project, config.region)
    return assess(config, readings, quotas, pools, cluster_zones=REGIONAL_CLUSTER_ZONES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_rl.project_check", description=__doc__)
    parser.add_argument("--conf", required=True, help="JSON file with the run's params (the trigger conf)")
    parser.add_argument("--run-id", default="preflight", help="run id the names are derived from")
    args = parser.parse_args(argv)
    with open(args.conf) as f:
        params = json.load(f)
    try:
        config = RunConfig.from_params(params)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    import google.auth

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    result = check_project(config, RunIdentity(DAG_ID, args.run_id), ComputeApiHook(credentials=credentials))
    if result is None:
        print("The run creates no cluster and no TPU pool: nothing to check")
        return 0
    for line in report_lines(result):
        print(line)
    if not result.passed:
        print(result.failure(), file=sys.stderr)
        return 1
    print("preflight passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
