"""Fixtures for the cluster operators against the GKE emulator of the simulation (marker ``gke``).

The session fixture starts the simulation with sim/up.sh when sim/status.sh says it is not up (never
skips) and stops it at the end only if it was down before. The operators reach the emulator as they
would reach GKE: the provider's GKEHook with the ``google_cloud_default`` connection of .sim/airflow.env
(a service-account key), gRPC and a cluster's DNS endpoint through the simulation's egress proxy
(``grpc_proxy``, ``HTTPS_PROXY``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tpu_rl_testing import read_env

REPO = Path(__file__).resolve().parents[2]
SIM_DIR = Path(os.environ.get("TPU_RL_SIM_DIR", REPO / ".sim"))
#: What the operators and the clients need from .sim/airflow.env.
ENV_KEYS = (
    "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
    "AIRFLOW_CONN_HUGGINGFACE_DEFAULT",
    "STORAGE_EMULATOR_HOST",
    "grpc_proxy",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "HTTPS_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
)


@pytest.fixture(scope="session")
def gke_sim() -> dict[str, str]:
    status = subprocess.run([REPO / "sim" / "status.sh"], capture_output=True, text=True)
    started = any(line.startswith("kube-apiserver") and "STOPPED" in line for line in status.stdout.splitlines())
    if status.returncode != 0:
        subprocess.run([REPO / "sim" / "up.sh"], check=True)
    env = read_env(SIM_DIR / "airflow.env")
    saved = {key: os.environ.get(key) for key in ENV_KEYS}
    os.environ.update({key: env[key] for key in ENV_KEYS})
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if started:
        subprocess.run([REPO / "sim" / "down.sh"], check=True)
