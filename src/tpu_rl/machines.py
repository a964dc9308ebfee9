"""Compute Engine machine types the pipeline places pods on: their size, what GKE leaves to pods, and the
boot disk and network they need.

Used to refuse, before anything is created, a conversion pod that could never schedule on the CPU pool.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class MachineShape:
    vcpus: int
    #: Memory as Compute Engine states it, in GB (10^9 bytes).
    memory_gb: float

    @property
    def allocatable_cpu(self) -> float:
        """vCPUs left to pods after GKE's kube-reserved CPU (docs: "Plan GKE Standard node sizes",
        node allocatable: 6% of the first core, 1% of the next, 0.5% of the next 2, 0.25% above 4)."""
        reserved = 0.06 * min(self.vcpus, 1) + 0.01 * min(max(self.vcpus - 1, 0), 1)
        reserved += 0.005 * min(max(self.vcpus - 2, 0), 2) + 0.0025 * max(self.vcpus - 4, 0)
        return self.vcpus - reserved

    @property
    def allocatable_memory_gib(self) -> float:
        """GiB left to pods after GKE's kube-reserved memory (same docs: 25% of the first 4 GiB, 20% of the
        next 4, 10% of the next 8, 6% of the next 112, 2% above 128 GiB) and the 100 MiB eviction threshold."""
        total = self.memory_gb * 1e9 / GIB
        reserved, left = 0.0, total
        for size, share in ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (float("inf"), 0.02)):
            reserved += share * min(left, size)
            left -= min(left, size)
        return total - reserved - 100 / 1024


#: Machine types of the CPU pool and the system pool (Compute Engine machine series docs).
SHAPES = {
    "n2-standard-8": MachineShape(8, 32),
    "e2-standard-8": MachineShape(8, 32),
    "n4-standard-32": MachineShape(32, 128),
    "n4-standard-64": MachineShape(64, 256),
    "n4-standard-80": MachineShape(80, 320),
    "c4-standard-96": MachineShape(96, 360),
    "c4d-standard-96": MachineShape(96, 372),
    "c4d-standard-192": MachineShape(192, 744),
}

#: The share of a node's boot disk GKE leaves to pods as ephemeral storage: about 47% in the example of its "Plan GKE
#: Standard node sizes" (the rest: the OS, images, logs, the eviction threshold); 45% keeps a margin.
POD_SHARE_OF_BOOT_DISK = 0.45


def pod_disk_gib(boot_disk_gb: float) -> float:
    """GiB of a node's boot disk (GB, as GKE states its size) that pods may fill."""
    return boot_disk_gb * 1e9 / GIB * POD_SHARE_OF_BOOT_DISK


#: Series that boot only from Hyperdisk (Compute Engine "Machine series comparison": C4, C4A, C4D, N4, and
#: the TPU v6e hosts ct6e); a pd-* boot disk is refused.
_HYPERDISK_ONLY = ("c4-", "c4a-", "c4d-", "n4-", "ct6e-")


def needs_hyperdisk(machine_type: str) -> bool:
    return machine_type.startswith(_HYPERDISK_ONLY)


def quantity_gib(quantity: str) -> float:
    """A Kubernetes memory quantity (a param such as 256Gi, or a node's allocatable such as 247296420Ki) in GiB."""
    units = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "Pi": 2**50,
        "Ei": 2**60,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "P": 1e15,
        "E": 1e18,
        "m": 1e-3,
    }
    for suffix in sorted(units, key=len, reverse=True):
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * units[suffix] / GIB
    return float(quantity) / GIB


def quantity_cpu(quantity: str) -> float:
    """A Kubernetes CPU quantity (32, 0.5 or 95690m) in CPUs."""
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
