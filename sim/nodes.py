"""Creates the simulated GKE nodes (idempotent: existing nodes are left alone, missing ones created).

    nodes.py [--kubeconfig PATH]

Pools, as the GKE TPU v6e blueprint has them:
  default-pool    1 node  (system workloads; TPU pods' affinity excludes it)
  cpu-np          2 nodes c4d-standard-96 (96 vCPU, 360Gi) for the Pathways head
  tpu-v6e-64-np  16 nodes ct6e-standard-4t, one v6e-64 slice (topology 8x8, 4 chips per host)

kwok manages every node annotated kwok.x-k8s.io/node=fake. Re-run after deleting a node (a lost TPU
host) to bring the pool back to full size.
"""

import argparse
import os
from pathlib import Path

CLUSTER = "tpu-rl-sim"
REGION, ZONE = "us-east5", "us-east5-b"
TPU_POOL = os.environ.get("TPU_RL_SIM_TPU_POOL", "tpu-v6e-64-np")
TPU_HOSTS = int(os.environ.get("TPU_RL_SIM_TPU_HOSTS", "16"))


def node(name, pool, machine_type, capacity, labels=None, taints=None):
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": machine_type,
                "topology.kubernetes.io/region": REGION,
                "topology.kubernetes.io/zone": ZONE,
                "cloud.google.com/gke-nodepool": pool,
                "cloud.google.com/machine-family": machine_type.split("-")[0],
                "cloud.google.com/gke-os-distribution": "cos",
                "type": "kwok",
                **(labels or {}),
            },
        },
        "spec": {
            "providerID": f"gce://{CLUSTER}/{ZONE}/{name}",
            "taints": taints or [],
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def all_nodes():
    nodes = [
        node(
            f"gke-{CLUSTER}-default-pool-0",
            "default-pool",
            "e2-standard-8",
            {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"},
        )
    ]
    nodes += [
        node(
            f"gke-{CLUSTER}-cpu-np-{i}",
            "cpu-np",
            "c4d-standard-96",
            {"cpu": "96", "memory": "360Gi", "pods": "110", "ephemeral-storage": "100Gi"},
        )
        for i in range(2)
    ]
    tpu_labels = {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "8x8",
        "cloud.google.com/gke-accelerator-count": "4",
        "cloud.google.com/gke-placement-group": f"{TPU_POOL}-placement",
    }
    tpu_taint = [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]
    nodes += [
        node(
            f"gke-{CLUSTER}-{TPU_POOL}-{i:02d}",
            TPU_POOL,
            "ct6e-standard-4t",
            {"cpu": "180", "memory": "720Gi", "pods": "110", "ephemeral-storage": "100Gi", "google.com/tpu": "4"},
            tpu_labels,
            tpu_taint,
        )
        for i in range(TPU_HOSTS)
    ]
    return nodes


def ensure_nodes(kubeconfig):
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    api = client.CoreV1Api(config.new_client_from_config(kubeconfig))
    existing = {n.metadata.name for n in api.list_node().items}
    created = 0
    for body in all_nodes():
        if body["metadata"]["name"] in existing:
            continue
        try:
            api.create_node(body)
            created += 1
        except ApiException as e:
            if e.status != 409:
                raise
    print(f"nodes: {created} created, {len(existing)} already there")


def main():
    default = os.path.join(os.environ.get("SIM", Path(__file__).resolve().parent.parent / ".sim"), "kubeconfig")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", default=default)
    ensure_nodes(parser.parse_args().kubeconfig)


if __name__ == "__main__":
    main()
