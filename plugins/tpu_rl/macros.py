"""Template macros: the run's config and GCS layout inside templated fields, so the Rendered Template
view shows the concrete buckets and prefixes of a run."""

from __future__ import annotations

from typing import Any

from tpu_rl.config import RunConfig
from tpu_rl.run import GcsLayout, RunIdentity


def run_config(params: Any) -> RunConfig:
    return RunConfig.from_params(dict(params))


def run_layout(params: Any, dag_id: str, run_id: str) -> GcsLayout:
    return GcsLayout(run_config(params), RunIdentity(dag_id, run_id))


MACROS = {"run_config": run_config, "run_layout": run_layout}
