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
    _store_the_checkouts_dags(DagBundlesManager())


def _store_the_checkouts_dags(manager) -> None:
    """Stores this checkout's DAGs in the metadata database. Airflow 3.1.7's dag.test() stores a DAG only when the
    database has no version of it (airflow/sdk/definitions/dag.py, test(): ``if not version``), and then runs the
    version stored: a database kept from an earlier commit of the checkout would run an older DAG (one task short,
    say). Airflow 3.3 stores the DAG again on each dag.test()."""
    try:
        from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import BundleDagBag, sync_bag_to_db

    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        sync_bag_to_db(BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path), bundle.name, bundle.version)
