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


def read_env(path: Path) -> dict[str, str]:
    """The `export NAME=value` lines of the simulation's env file (.sim/airflow.env)."""
    env = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            env[name] = shlex.split(value)[0] if value else ""
    return env
