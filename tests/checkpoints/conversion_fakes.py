"""Stand-ins for what the conversion lock tests do not exercise: the Kubernetes API and the task instance
(``tpu_rl_testing.TaskInstanceStandIn``).

Only the cluster is replaced: :class:`InMemoryJobSets` answers the calls ``JobSetOperator`` makes to its hook
(get, create, delete, wait until gone) from a dict, so the operator's own submit/adopt/defer/complete code
runs unchanged. The JobSet operator against a real API server is tested in ``tests/jobset`` (simulated
cluster). The lock, the checkpoint checks and the triggers talk to the real GCS emulator.
"""

from __future__ import annotations

import copy
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from tpu_rl.config import RunConfig
from tpu_rl.layout import GcsLayout
from tpu_rl.run import RunIdentity
from tpu_rl_testing import TaskInstanceStandIn, task_context

DAG_ID = "maxtext_rl_tpu"


def run_conf(bucket_name: str, **changes: Any) -> dict[str, Any]:
    """The simulation's conf (an existing cluster through a Kubernetes connection) on the test's bucket."""
    return {
        "project": "tpu-rl-sim",
        "region": "us-east5",
        "zone": "us-east5-b",
        "cluster_name": "tpu-rl-sim",
        "gcs_bucket": bucket_name,
        "cluster_mode": "existing",
        "kubernetes_conn_id": "tpu_rl_sim",
        "tpu_pool_mode": "existing",
        **changes,
    }


def layout(bucket_name: str, run_id: str = "any", **changes: Any) -> GcsLayout:
    return GcsLayout(RunConfig.from_params(run_conf(bucket_name, **changes)), RunIdentity(DAG_ID, run_id))


def context(bucket_name: str, run_id: str, task_id: str, try_number: int = 1, **changes: Any) -> dict[str, Any]:
    return task_context(TaskInstanceStandIn(DAG_ID, run_id, task_id, try_number), run_conf(bucket_name, **changes))


class InMemoryJobSets:
    """The JobSet API of one cluster as a dict: what ``KubernetesApiHook`` returns, nothing more."""

    target = SimpleNamespace(is_gke=False)

    def __init__(self) -> None:
        self.jobsets: dict[tuple[str, str], dict] = {}
        self.created: list[str] = []

    def get_jobset(self, name: str, namespace: str) -> dict | None:
        found = self.jobsets.get((namespace, name))
        return copy.deepcopy(found) if found else None

    def create_jobset(self, body: dict, namespace: str) -> dict:
        body = copy.deepcopy(body)
        body["metadata"].update(
            uid=str(uuid.uuid4()), creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        )
        body["status"] = {}
        self.jobsets[(namespace, body["metadata"]["name"])] = body
        self.created.append(body["metadata"]["name"])
        return copy.deepcopy(body)

    def finish(self, name: str, namespace: str, condition: str) -> None:
        self.jobsets[(namespace, name)]["status"] = {"conditions": [{"type": condition, "status": "True"}]}

    def delete_jobset(self, name: str, namespace: str, uid: str | None = None) -> bool:
        return self.jobsets.pop((namespace, name), None) is not None

    def wait_until_gone(self, name: str, namespace: str, uid: str, timeout: float, interval: float = 2) -> None:
        assert (namespace, name) not in self.jobsets


def jobset_event(tracked: dict, status: str, message: str = "") -> dict[str, Any]:
    """The event ``JobSetTrigger`` fires when the JobSet ends (``success``, ``failed`` or ``deleted``)."""
    return {
        "name": tracked["name"],
        "namespace": tracked["namespace"],
        "uid": tracked["uid"],
        "status": status,
        "message": message or f"JobSet {tracked['name']} {status}",
        "log_tail": [],
        "restarts": 0,
    }
