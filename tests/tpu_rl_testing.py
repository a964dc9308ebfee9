"""Constants shared by the test folders (imported by name: each folder has its own conftest.py)."""

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TUTORIAL_CONF = json.loads((REPO / "include/examples/tutorial.json").read_text())
SIM_CONF = json.loads((REPO / "include/examples/simulation.json").read_text())
