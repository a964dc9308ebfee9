"""The bridge from an Airflow task's context to the run's validated config and identity."""

from __future__ import annotations

from typing import Any

from tpu_rl.config import RunConfig
from tpu_rl.run import GcsLayout, RunIdentity


def run_of(context: Any) -> RunIdentity:
    return RunIdentity(context["dag"].dag_id, context["run_id"])


def config_of(context: Any) -> RunConfig:
    """Rebuilt in every task from the run's params: deterministic, and nothing to pass through XCom."""
    return RunConfig.from_params(dict(context["params"]))


def layout_of(context: Any) -> GcsLayout:
    return GcsLayout(config_of(context), run_of(context))
