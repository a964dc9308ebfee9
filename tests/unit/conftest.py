import json
from pathlib import Path

import pytest

from tpu_rl.config import RunConfig
from tpu_rl.run import RunIdentity

REPO = Path(__file__).resolve().parents[2]
TUTORIAL_CONF = json.loads((REPO / "include/examples/tutorial.json").read_text())


@pytest.fixture
def tutorial_conf() -> dict:
    """The required fields; everything else keeps the tutorial's defaults."""
    return dict(TUTORIAL_CONF)


@pytest.fixture
def tutorial_config(tutorial_conf) -> RunConfig:
    return RunConfig.from_params(tutorial_conf)


@pytest.fixture
def run() -> RunIdentity:
    return RunIdentity("maxtext_rl_tpu", "manual__2026-11-29T10:00:00+00:00")
