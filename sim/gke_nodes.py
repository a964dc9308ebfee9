"""The nodes of a GKE node pool as the emulator registers them in the cluster's control plane (kwok manages
them): their names, zones, labels, taints, capacity and service account, as GKE's nodes show them."""

from __future__ import annotations

import hashlib

from . import gke_machines, gke_rules
from .gke_settings import DEFAULT_BOOT_DISK


class PoolNodes:
    """The nodes of node pool ``pool`` (its JSON body) of cluster ``key`` ("project/location/name"), whose
    default zones are ``cluster_locations``."""

    def __init__(self, key: str, cluster_locations: list[str], pool: dict) -> None:
        self.key, self.pool = key, pool
        location = key.split("/")[1]
        self.zones = list(pool.get("locations") or cluster_locations or gke_rules.zones_of(location)[:3])

    @property
    def per_zone(self) -> int:
        """A pool's nodes in each of its zones. A flex-start pool starts empty and GKE's autoscaler adds its
        slice when a workload asks for it; with no autoscaler here, it gets its maximum (the whole slice)."""
        if (self.pool.get("config") or {}).get("flex_start"):
            return int((self.pool.get("autoscaling") or {}).get("max_node_count") or 0)
        return int(self.pool.get("initial_node_count") or 0)

    @property
    def count(self) -> int:
        return self.per_zone * len(self.zones)

    def names(self) -> list[str]:
        cname, pool_name = self.key.split("/")[2], self.pool["name"]
        names = []
        for zone in self.zones:
            group = hashlib.sha256(f"{self.key}/{pool_name}/{zone}".encode()).hexdigest()[:8]
            for i in range(self.per_zone):
                suffix = hashlib.sha256(f"{group}/{i}".encode()).hexdigest()[:4]
                names.append(f"gke-{cname[:20]}-{pool_name[:16]}-{group}-{suffix}")
        return names

    def bodies(self) -> list[dict]:
        """Node objects as GKE's nodes register them (labels and taints of the pool), managed by kwok."""
        config = self.pool.get("config") or {}
        mt = self._machine_type()
        capacity, allocatable = gke_machines.node_resources(
            mt, int(config.get("disk_size_gb") or gke_machines.DEFAULT_DISK_GB)
        )
        labels, taints = self._labels(mt), self._taints(mt)
        # A pool without a service account runs as the Compute Engine default account.
        account = config.get("service_account") or f"{gke_rules.PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
        names = iter(self.names())
        return [
            self._node(next(names), zone, labels, taints, account, {"capacity": capacity, "allocatable": allocatable})
            for zone in self.zones
            for _ in range(self.per_zone)
        ]

    def _machine_type(self) -> gke_machines.MachineType:
        """The pool's machine type; one the table lacks (GKE's default e2-medium among them) is sized as an
        e2-standard-8."""
        name = (self.pool.get("config") or {}).get("machine_type") or "e2-medium"
        return gke_machines.MACHINE_TYPES.get(name, gke_machines.MACHINE_TYPES["e2-standard-8"])

    def _labels(self, mt: gke_machines.MachineType) -> dict[str, str]:
        """The labels GKE gives every node of the pool, with the pool's own."""
        pool, config = self.pool, self.pool.get("config") or {}
        location = self.key.split("/")[1]
        labels = {
            "cloud.google.com/gke-nodepool": pool["name"],
            "cloud.google.com/machine-family": mt.family,
            "cloud.google.com/gke-os-distribution": "cos",
            "cloud.google.com/gke-boot-disk": config.get("disk_type") or DEFAULT_BOOT_DISK,
            "node.kubernetes.io/instance-type": mt.name,
            "topology.kubernetes.io/region": location if location.count("-") == 1 else location.rsplit("-", 1)[0],
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
            "type": "kwok",
            **(config.get("labels") or {}),
        }
        if (config.get("workload_metadata_config") or {}).get("mode") == "GKE_METADATA":
            labels["iam.gke.io/gke-metadata-server-enabled"] = "true"
        if config.get("spot"):
            labels["cloud.google.com/gke-spot"] = "true"
        if config.get("preemptible"):
            labels["cloud.google.com/gke-preemptible"] = "true"
        placement = pool.get("placement_policy") or {}
        if mt.tpu_chips:
            labels["cloud.google.com/gke-tpu-accelerator"] = mt.tpu_accelerator
            labels["cloud.google.com/gke-accelerator-count"] = str(mt.tpu_chips)
            if placement.get("tpu_topology"):
                labels["cloud.google.com/gke-tpu-topology"] = placement["tpu_topology"]
        if placement.get("type") == "COMPACT":
            labels["cloud.google.com/gke-placement-group"] = placement.get("policy_name") or f"{pool['name']}-placement"
        return labels

    def _taints(self, mt: gke_machines.MachineType) -> list[dict]:
        """GKE's TPU taint on a TPU node, then the pool's own taints (each once)."""
        taints = []
        if mt.tpu_chips:
            taints.append({"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"})
        effects = {"NO_SCHEDULE": "NoSchedule", "PREFER_NO_SCHEDULE": "PreferNoSchedule", "NO_EXECUTE": "NoExecute"}
        for t in (self.pool.get("config") or {}).get("taints") or []:
            taint = {"key": t["key"], "value": t.get("value", ""), "effect": effects.get(t.get("effect"), "NoSchedule")}
            if taint not in taints:
                taints.append(taint)
        return taints

    def _node(self, name: str, zone: str, labels: dict, taints: list, account: str, status: dict) -> dict:
        """One Node object: the pool's labels with its own hostname and zone."""
        project = self.key.split("/")[0]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {
                    "kwok.x-k8s.io/node": "fake",
                    "node.alpha.kubernetes.io/ttl": "0",
                    # Who the node is to Google APIs (GKE: the metadata server);
                    # the MaxText emulator checks bucket access with it.
                    gke_rules.NODE_SERVICE_ACCOUNT_ANNOTATION: account,
                    "container.googleapis.com/instance_id": str(
                        int(hashlib.sha256(name.encode()).hexdigest()[:15], 16)
                    ),
                },
                "labels": {**labels, "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone},
            },
            "spec": {"providerID": f"gce://{project}/{zone}/{name}", "taints": taints},
            "status": status,
        }
