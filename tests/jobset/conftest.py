"""Fixtures for the JobSet operator against the simulated cluster (marker ``jobset``).

The session fixture starts the simulation with sim/up.sh when sim/status.sh says it is not up (never
skips) and stops it at the end only if it started it. Airflow reaches the cluster through the
connection ``tpu_rl_sim`` (``AIRFLOW_CONN_TPU_RL_SIM`` from .sim/airflow.env).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from jobset_helpers import REPO, SIM_DIR, Cluster, read_env


@pytest.fixture(scope="session")
def sim() -> Cluster:
    started = False
    if subprocess.run([REPO / "sim" / "status.sh"], capture_output=True).returncode != 0:
        subprocess.run([REPO / "sim" / "up.sh"], check=True)
        started = True
    env = read_env(SIM_DIR / "airflow.env")
    os.environ.update({k: v for k, v in env.items() if k.startswith("AIRFLOW_CONN_")})
    yield Cluster(env["KUBECONFIG"])
    if started:
        subprocess.run([REPO / "sim" / "down.sh"], check=True)


