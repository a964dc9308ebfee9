"""Every test runs against the same local Airflow as `make test`: scripts/airflow-env.sh is the one
definition of it (Airflow home, the dags folder, an empty plugins folder, the PostgreSQL metadata database). The package
itself is the installed wheel (make venv), never the source tree."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _airflow_env() -> dict[str, str]:
    out = subprocess.run(
        ["bash", "-c", f"source {REPO}/scripts/airflow-env.sh && env -0"], capture_output=True, text=True, check=True
    ).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


for _key, _value in _airflow_env().items():
    if _key.startswith("AIRFLOW") and _key not in os.environ:
        os.environ[_key] = _value


@pytest.fixture(scope="session")
def metadata_db():
    """The metadata database with this checkout's DAG bundles registered: the DAG rows that dag.test()
    writes reference them, and a fresh database has none until a dag-processor has run."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    DagBundlesManager().sync_bundles_to_db()
