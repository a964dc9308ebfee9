"""Helpers of the JobSet operator tests: the cluster client for checks, test manifests, and a driver
that runs the operator as Airflow does."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

from tpu_rl_testing import wait_until

REPO = Path(__file__).resolve().parents[2]
SIM_DIR = Path(os.environ.get("TPU_RL_SIM_DIR", REPO / ".sim"))
CONN_ID = "tpu_rl_sim"
SIM = "sim.tpu-rl.dev/"


class Cluster:
    """Direct API access for arranging faults and checking outcomes (not through the code under test)."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        self.kubeconfig = kubeconfig
        api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def jobsets(self, name: str, namespace: str = "default") -> list[dict]:
        items = self.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", field_selector=f"metadata.name={name}"
        )["items"]
        return items

    def delete_jobset(self, name: str, namespace: str = "default") -> None:
        self.custom.delete_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name, body={"propagationPolicy": "Foreground"}
        )

    def pods(self, name: str, namespace: str = "default") -> list:
        return self.core.list_namespaced_pod(namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items

    def wait(self, what: str, predicate, timeout: float = 60, interval: float = 0.5):
        return wait_until(what, predicate, timeout, interval)

    def wait_running(self, name: str, count: int = 2) -> list:
        """The JobSet's running pods, once ``count`` run (the session's hosts take one JobSet at a time)."""

        def running():
            pods = [p for p in self.pods(name) if p.status.phase == "Running"]
            return pods if len(pods) >= count else None

        return self.wait(f"{count} pods of {name} to run", running, timeout=300)


def tpu_jobset(
    name: str,
    *,
    hosts: int = 2,
    run_seconds: float = 3,
    max_restarts: int = 0,
    annotations: dict[str, str] | None = None,
    replicated_job: str = "main-job",
    node_selector: dict[str, str] | None = None,
) -> dict:
    """A small plain multi-host TPU JobSet shaped like the conversions' (workloads.md section 1), on the session's
    own TPU hosts (``SESSION_POOL``, which the ``sim`` fixture creates: the standing slice is the end-to-end
    scenarios' in make test, and a test waiting for it waited up to their trainings' end), or the nodes
    ``node_selector`` names."""
    node_selector = node_selector or (
        {"cloud.google.com/gke-nodepool": os.environ[SESSION_POOL]} if os.environ.get(SESSION_POOL) else None
    )
    pod_annotations = {f"{SIM}run-seconds": str(run_seconds), **(annotations or {})}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"},
        },
        "spec": {
            "ttlSecondsAfterFinished": 3600,
            "failurePolicy": {"maxRestarts": max_restarts},
            "replicatedJobs": [
                {
                    "name": replicated_job,
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": hosts,
                            "completions": hosts,
                            "backoffLimit": 0,
                            "completionMode": "Indexed",
                            "template": {
                                "metadata": {"annotations": pod_annotations},
                                "spec": {
                                    "restartPolicy": "Never",
                                    "terminationGracePeriodSeconds": 30,
                                    "nodeSelector": node_selector
                                    or {
                                        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                        "cloud.google.com/gke-tpu-topology": "8x8",
                                    },
                                    "tolerations": [
                                        {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
                                    ],
                                    "containers": [
                                        {
                                            "name": "workload-container",
                                            "image": "python:3.12",
                                            "command": ["/bin/bash", "-c", "echo step; sleep 1"],
                                            "resources": {"limits": {"google.com/tpu": "4"}},
                                        }
                                    ],
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


#: The environment variable naming the TPU hosts of the session (inherited by the tasks the tests start).
SESSION_POOL = "TPU_RL_JOBSET_TEST_POOL"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def run_operator(op, context: dict) -> Any:
    """execute -> TaskDeferred -> the trigger (rebuilt from its serialized form, as the triggerer does)
    runs to its first event -> resume_execution, as Airflow's task runner and triggerer would.

    A deferral with a timeout is cancelled at that time and the task resumed with ``__fail__`` /
    "Trigger timeout", which is what Airflow's triggerer and scheduler do when a deferral times out.
    """
    from airflow.sdk.exceptions import TaskDeferred

    try:
        return op.execute(context)
    except TaskDeferred as deferred:
        classpath, kwargs = deferred.trigger.serialize()
        module, _, cls = classpath.rpartition(".")
        trigger = getattr(__import__(module, fromlist=[cls]), cls)(**kwargs)
        context["deferred"] = deferred
        timeout = deferred.timeout.total_seconds() if deferred.timeout else None
        try:
            event = asyncio.run(asyncio.wait_for(_first_event(trigger), timeout))
        except TimeoutError:
            return op.resume_execution("__fail__", {"error": "Trigger timeout"}, context)
        return op.resume_execution(deferred.method_name, {"event": event.payload}, context)


async def _first_event(trigger):
    async for event in trigger.run():
        return event
    raise AssertionError("trigger ended without an event")
