import pytest

from tpu_rl.config import RunConfig
from tpu_rl.run import RunIdentity
from tpu_rl_testing import TUTORIAL_CONF


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
