"""Fixtures for the JobSet operator against the simulated cluster (marker ``jobset``).

The session fixture starts the simulation with sim/up.sh when sim/status.sh says it is not up (never
skips) and stops it at the end only if it was down before. Airflow reaches the cluster through the
connection ``tpu_rl_sim`` (``AIRFLOW_CONN_TPU_RL_SIM`` from .sim/airflow.env).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from jobset_helpers import REPO, SESSION_POOL, SIM_DIR, Cluster

from tpu_rl_testing import read_env, spare_tpu_pool


@pytest.fixture(scope="session")
def sim() -> Cluster:
    status = subprocess.run([REPO / "sim" / "status.sh"], capture_output=True, text=True)
    # Stop it at the end only if it was down: an unhealthy component of a running sim (e.g. a stale
    # heartbeat under load) is restarted by up.sh but the sim is someone else's to stop.
    started = any(line.startswith("kube-apiserver") and "STOPPED" in line for line in status.stdout.splitlines())
    if status.returncode != 0:
        subprocess.run([REPO / "sim" / "up.sh"], check=True)
    env = read_env(SIM_DIR / "airflow.env")
    os.environ.update({k: v for k, v in env.items() if k.startswith("AIRFLOW_CONN_")})
    cluster = Cluster(env["KUBECONFIG"])
    with spare_tpu_pool(cluster.core) as (pool, _):  # the session's own TPU hosts (jobset_helpers.tpu_jobset)
        os.environ[SESSION_POOL] = pool
        try:
            yield cluster
        finally:
            os.environ.pop(SESSION_POOL, None)
    if started:
        subprocess.run([REPO / "sim" / "down.sh"], check=True)
