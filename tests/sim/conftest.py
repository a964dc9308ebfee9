"""Fixtures for the simulated cluster's own tests (marker `sim`, registered in pyproject.toml).

The session fixture starts the simulation with sim/up.sh when sim/status.sh says it is not up (never
skips), and stops it at the end only if it started it.
"""

import os
import subprocess
import time
from pathlib import Path

import pytest

from tpu_rl_testing import read_env, wait_until

REPO = Path(__file__).resolve().parents[2]
SIM_DIR = Path(os.environ.get("TPU_RL_SIM_DIR", REPO / ".sim"))


class Sim:
    """Clients for the running simulation."""

    def __init__(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        from kubernetes import client, config

        self.env = read_env(SIM_DIR / "airflow.env")
        self.kubeconfig = self.env["KUBECONFIG"]
        os.environ["STORAGE_EMULATOR_HOST"] = self.env["STORAGE_EMULATOR_HOST"]
        api = config.new_client_from_config(self.kubeconfig)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.gcs = storage.Client(project="tpu-rl-sim", credentials=AnonymousCredentials())

    # JobSets
    def create_jobset(self, body):
        ns = body["metadata"].get("namespace", "default")
        return self.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", body)

    def get_jobset(self, name, ns="default"):
        return self.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name)

    def delete_jobset(self, name, ns="default"):
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name, propagation_policy="Foreground"
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def wait_jobset(self, name, ns="default", timeout=120):
        """Waits for a terminal condition (Completed or Failed); returns the JobSet."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            js = self.get_jobset(name, ns)
            for cond in js.get("status", {}).get("conditions", []):
                if cond["type"] in ("Completed", "Failed") and cond["status"] == "True":
                    return js
            time.sleep(0.5)
        raise AssertionError(f"JobSet {ns}/{name} not finished after {timeout} s: {js.get('status')}")

    def pods(self, jobset, ns="default"):
        return self.core.list_namespaced_pod(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={jobset}").items

    def wait(self, what, predicate, timeout=60, interval=0.5):
        return wait_until(what, predicate, timeout, interval)

    # GCS
    def names(self, gs_prefix):
        bucket, _, prefix = gs_prefix.removeprefix("gs://").partition("/")
        return {b.name[len(prefix) :].lstrip("/") for b in self.gcs.list_blobs(bucket, prefix=prefix)}

    def read(self, gs_path):
        bucket, _, name = gs_path.removeprefix("gs://").partition("/")
        return self.gcs.bucket(bucket).blob(name).download_as_bytes()


@pytest.fixture(scope="session")
def sim():
    started = False
    if subprocess.run([REPO / "sim" / "status.sh"], capture_output=True).returncode != 0:
        subprocess.run([REPO / "sim" / "up.sh"], check=True)
        started = True
    yield Sim()
    if started:
        subprocess.run([REPO / "sim" / "down.sh"], check=True)


@pytest.fixture
def faults_api(sim):
    """The sim-side fault switch (sim/faults.py). The rules its test added are removed after it; the
    others stay, because e2e scenarios that set their own rules may still be running on the same sim."""
    from sim import faults

    with faults.rules_removed_after(sim.core):
        yield faults
