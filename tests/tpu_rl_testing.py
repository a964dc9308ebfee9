"""Constants shared by the test folders (imported by name: each folder has its own conftest.py)."""

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TUTORIAL_CONF = json.loads((REPO / "include/examples/tutorial.json").read_text())
#: The tutorial's path on the simulation: the GKE emulator creates the cluster and the TPU pool (make demo).
SIM_CREATE_CONF = json.loads((REPO / "include/examples/simulation.json").read_text())
#: The simulation's standing cluster through a Kubernetes connection, its slice already there.
SIM_CONF = json.loads((REPO / "include/examples/simulation-existing-cluster.json").read_text())
