"""The provider metadata Airflow reads through the entry point ``apache_airflow_provider``: the UI's Providers
page lists the distribution with its version, and ``airflow providers links`` lists the JobSet task's extra links.

Airflow 3 needs no registration to show those links: the serialised DAG keeps each link's name and XCom key
(``_serialize_operator_extra_links``), the worker calls ``get_link`` whenever a try of the task ends there (a
deferral too) and pushes the URL to that key (``airflow/sdk/execution_time/task_runner.py``, ``finalize``), and
the API server answers with an ``XComOperatorLink`` built from the name and key, which reads that XCom and never
imports ``tpu_rl.links`` (``airflow/serialization/serialized_objects.py``, ``_deserialize_operator_extra_links``;
Airflow 3.1.7 and 3.3.2). The providers manager's list of extra links feeds that CLI command only.

The Training tab is registered through the entry point ``airflow.plugins`` only: the providers manager
would load a plugin it declares a second time. No connection types: the hooks reach GKE and Cloud Storage through
the Google provider's ``google_cloud_platform`` connection and a cluster through GKE or the cncf-kubernetes
provider's ``kubernetes`` connection, both declared by those providers.
"""

from __future__ import annotations

from typing import Any

from tpu_rl import __version__

DISTRIBUTION = "tpu-rl"
INTEGRATION = "MaxText RL on GKE TPU slices"


def _modules(*names: str) -> list[dict[str, Any]]:
    return [{"integration-name": INTEGRATION, "python-modules": [f"tpu_rl.{name}" for name in names]}]


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": DISTRIBUTION,
        "name": "TPU RL",
        "description": "Runs MaxText reinforcement-learning post-training on GKE TPU slices: the cluster, the "
        "TPU node pools, the Pathways training as a JobSet, the checkpoints' checks, the export.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": INTEGRATION, "tags": ["gcp"], "external-doc-url": "https://maxtext.readthedocs.io/"}
        ],
        "hooks": _modules("hooks.gke", "hooks.kubernetes", "hooks.gcs"),
        "operators": _modules(
            "operators.setup",
            "operators.cluster",
            "operators.tpu_pools",
            "operators.leases",
            "operators.jobset",
            "operators.workloads",
            "operators.training_record",
            "operators.run_report",
            "operators.publish",
            "operators.reaper",
        ),
        "sensors": _modules("sensors.checkpoints"),
        "triggers": _modules("triggers.triggerer", "triggers.gke", "triggers.jobset", "triggers.checkpoints"),
        "extra-links": ["tpu_rl.links.JobSetWorkloadLink", "tpu_rl.links.JobSetLogsLink"],
    }
