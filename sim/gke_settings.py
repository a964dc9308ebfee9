"""Where the GKE emulator keeps its files and listens, who it is, and how long its operations take: read
from the environment once, by every part of it (sim/gke_emulator.py and the modules it is split into)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import gke_machines

SRC = Path(__file__).resolve().parent
SIM = Path(os.environ.get("SIM") or os.environ.get("TPU_RL_SIM_DIR") or SRC.parent / ".sim")
os.environ.setdefault("TPU_RL_SIM_DIR", str(SIM))  # sim/control_plane.py reads it
GKE_DIR = SIM / "gke"
PKI = SIM / "pki"
HOST = "container.googleapis.com"
PROXY_PORT = int(os.environ.get("TPU_RL_SIM_GKE_PROXY_PORT", "14480"))
GRPC_PORT = int(os.environ.get("TPU_RL_SIM_GKE_GRPC_PORT", "14481"))
TOKEN_PORT = int(os.environ.get("TPU_RL_SIM_GKE_TOKEN_PORT", "14482"))
DNS_PORT = int(os.environ.get("TPU_RL_SIM_GKE_DNS_PORT", "14483"))
#: Compute Engine's REST API as the preflight reads it (sim/compute_api.py), reached as compute.googleapis.com:443.
COMPUTE_PORT = int(os.environ.get("TPU_RL_SIM_GKE_COMPUTE_PORT", "14484"))
COMPUTE_HOST = "compute.googleapis.com"
PROJECT = "tpu-rl-sim"
SA_EMAIL = f"tpu-rl-sim@{PROJECT}.iam.gserviceaccount.com"
SERVICE = "google.container.v1.ClusterManager"
TOKEN_SECONDS = 3600
MAX_SLOTS = 50


def seconds(name, default):
    return float(os.environ.get(f"TPU_RL_SIM_GKE_{name}_SECONDS", default))


PENDING_S = seconds("PENDING", "0.3")
CLUSTER_CREATE_S = seconds("CLUSTER_CREATE", "3")
POOL_CREATE_S = seconds("POOL_CREATE", "3")
DELETE_S = seconds("DELETE", "2")
#: How long a create GKE cannot get capacity for stays RUNNING while GKE retries, before it fails: about 35
#: minutes on GKE (observed: "Not all instances running in IGM after 35m ... [GCE_STOCKOUT]", Cluster Toolkit PR
#: 6278; retries about every 4 minutes, NVIDIA/aicr issue 2764), time-scaled here.
STOCKOUT_S = seconds("STOCKOUT", "10")
DEFAULT_BOOT_DISK = os.environ.get("TPU_RL_SIM_GKE_DEFAULT_BOOT_DISK", gke_machines.DEFAULT_BOOT_DISK)


def read_json(path, default):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default
