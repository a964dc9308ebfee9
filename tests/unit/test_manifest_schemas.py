"""Every object the plan prints is valid for the API that receives it: Kubernetes core objects against the
Kubernetes OpenAPI schema, JobSets against the CRD of the JobSet release GKE installs, GKE bodies against
``google.cloud.container_v1``. Unknown fields fail: an API server prunes or rejects them silently."""

import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from google.cloud.container_v1 import Cluster, NodePool

from tpu_rl.config import RunConfig
from tpu_rl.plan import plan_documents
from tpu_rl_testing import REPO

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

KUBERNETES_VERSION = "1.34.0"
VARIANTS = {
    "tutorial": {},
    "conversion on the slice, Kueue, 2 slices of v6e-16": {
        "conversion_on_tpu": True,
        "kueue_queue_name": "user-queue",
        "tpu_type": "v6e-16",
        "topology": "4x4",
        "cluster_nodepool_count": 2,
        "ici_tensor_parallelism": 2,
        "ici_expert_parallelism": 1,
        "capacity_type": "reservation",
        "reservation": "my-reservation",
        "tpu_pool_mode": "cluster",
    },
    "Spot": {"capacity_type": "spot"},
    "flex-start, pools with the cluster": {"capacity_type": "flex_start", "tpu_pool_mode": "cluster"},
}


def _versions() -> dict[str, str]:
    lines = (REPO / "sim/versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


@lru_cache
def jobset_schema() -> dict:
    """The JobSet CRD from the module source of the release the simulated cluster and GKE run."""
    version = _versions()["JOBSET_VERSION"]
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/jobset@{version}"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    crd_path = Path(json.loads(result.stdout)["Dir"]) / "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
    crd = yaml.safe_load(crd_path.read_text())
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    return served["schema"]["openAPIV3Schema"]


def unknown_fields(obj, schema: dict, path: str = "") -> list[str]:
    """Fields the structural schema does not declare (the API server would drop them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, dict):
        properties = schema.get("properties")
        if properties is None:
            extra = schema.get("additionalProperties")
            return (
                [p for k, v in obj.items() for p in unknown_fields(v, extra, f"{path}.{k}")]
                if isinstance(extra, dict)
                else []
            )
        found = []
        for key, value in obj.items():
            if key not in properties:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(value, properties[key], f"{path}.{key}")
        return found
    if isinstance(obj, list) and "items" in schema:
        return [p for i, item in enumerate(obj) for p in unknown_fields(item, schema["items"], f"{path}[{i}]")]
    return []


def plan_for(conf: dict, run) -> list[dict]:
    return [doc for _, doc in plan_documents(RunConfig.from_params(conf), run)]


@pytest.fixture(params=list(VARIANTS))
def plan(request, tutorial_conf, run) -> list[dict]:
    return plan_for({**tutorial_conf, **VARIANTS[request.param]}, run)


def test_jobsets_match_the_jobset_crd(plan):
    schema = jobset_schema()
    jobsets = [d for d in plan if d.get("kind") == "JobSet"]
    assert len(jobsets) == 3
    for jobset in jobsets:
        jsonschema.validate(jobset, schema)
        assert unknown_fields(jobset, schema) == [], jobset["metadata"]["name"]


def test_pod_templates_secret_and_service_account_match_the_kubernetes_schema(plan):
    objects = [d for d in plan if d.get("kind") in ("Secret", "ServiceAccount")]
    assert len(objects) == 2
    for jobset in (d for d in plan if d.get("kind") == "JobSet"):
        for job in jobset["spec"]["replicatedJobs"]:
            objects.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": job["name"]},
                    "spec": job["template"]["spec"],
                }
            )
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_unknown_fields_are_caught():
    """The checker itself: a misspelt field in a pod template is reported."""
    schema = jobset_schema()
    bad = {
        "spec": {"replicatedJobs": [{"name": "x", "template": {"spec": {"template": {"spec": {"nodeSelecter": {}}}}}}]}
    }
    assert unknown_fields(bad, schema) == [".spec.replicatedJobs[0].template.spec.template.spec.nodeSelecter"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "strngData": {}},
            KUBERNETES_VERSION,
            strict=True,
        )


def test_gke_bodies_parse_as_container_v1_types(plan):
    requests = [d for d in plan if "gkeRequest" in d]
    assert requests
    for request in requests:
        if request["gkeRequest"] == "CreateCluster":
            cluster = Cluster.from_json(json.dumps(request["cluster"]))
            assert {p.name for p in cluster.node_pools} >= {"system", "cpu-np"}
            assert cluster.resource_labels["tpu-rl-run-key"]
            for pool in cluster.node_pools:
                if pool.placement_policy.tpu_topology:
                    assert pool.placement_policy.type_ == NodePool.PlacementPolicy.Type.COMPACT
        else:
            pool = NodePool.from_json(json.dumps(request["nodePool"]))
            assert pool.placement_policy.type_ == NodePool.PlacementPolicy.Type.COMPACT
            assert [t.key for t in pool.config.taints] == ["google.com/tpu"]


def test_reservation_affinity_names_the_reservation(tutorial_conf, run):
    conf = {**tutorial_conf, "capacity_type": "reservation", "reservation": "my-reservation"}
    [pool] = [d["nodePool"] for d in plan_for(conf, run) if d.get("gkeRequest") == "CreateNodePool"]
    affinity = NodePool.from_json(json.dumps(pool)).config.reservation_affinity
    assert affinity.consume_reservation_type.name == "SPECIFIC_RESERVATION"
    assert list(affinity.values) == ["projects/my-project/reservations/my-reservation"]
