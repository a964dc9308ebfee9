"""The provider metadata Airflow reads through the entry point ``apache_airflow_provider``: the UI's Providers
page lists the distribution with its version, and every component's providers manager registers its extra
links (so a serialised DAG's links resolve on the scheduler and the API server as on the worker).

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
