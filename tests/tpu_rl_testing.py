"""Constants shared by the test folders (imported by name: each folder has its own conftest.py)."""

import json
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TUTORIAL_CONF = json.loads((REPO / "include/examples/tutorial.json").read_text())
#: The tutorial's path on the simulation: the GKE emulator creates the cluster and the TPU pool (make demo).
SIM_CREATE_CONF = json.loads((REPO / "include/examples/simulation.json").read_text())
#: The simulation's standing cluster through a Kubernetes connection, its slice already there.
SIM_CONF = json.loads((REPO / "include/examples/simulation-existing-cluster.json").read_text())
#: A v6e-16 slice (4 hosts) keeps the simulated clusters small; the tutorial's 8x8 runs in make demo.
SMALL_SLICE = {"tpu_type": "v6e-16", "topology": "4x4", "ici_tensor_parallelism": 2, "ici_expert_parallelism": 2,
               "rollout_tensor_parallelism": 4, "num_batches": 4, "checkpoint_period": 2}
#: Where the simulation's runs create clusters.
GKE_PARENT = f"projects/{SIM_CREATE_CONF['project']}/locations/{SIM_CREATE_CONF['region']}"


def cluster_or_none(gke, name: str):
    """The cluster through a ClusterManagerClient, or None."""
    from google.api_core.exceptions import NotFound

    try:
        return gke.get_cluster(name=f"{GKE_PARENT}/clusters/{name}")
    except NotFound:
        return None


def read_env(path: Path) -> dict[str, str]:
    """The `export NAME=value` lines of the simulation's env file (.sim/airflow.env)."""
    env = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            env[name] = shlex.split(value)[0] if value else ""
    return env
