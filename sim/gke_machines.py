"""Compute Engine machine types as GKE builds nodes from them: the machine table (vCPUs, memory, TPU chips, with
sources), what GKE refuses of a pool's machine (an unknown type, a TPU slice it cannot build, a boot disk or network
interface the machine series does not take), and what a node of each type reports to Kubernetes (capacity, and
allocatable after GKE's reservations).

Pure functions over request bodies, as in sim/gke_rules.py (which runs these checks with the others); nothing but
the standard library.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .gke_errors import invalid_argument

GIB = 1024**3
MIB = 1024**2


# --------------------------------------------------------------------------------------------------------------
# Machine types. Sources (vCPU, memory, chips):
#   TPU v6e: Cloud TPU docs "TPU v6e" https://cloud.google.com/tpu/docs/v6e  (ct6e-standard-1t 44 vCPU 448 GB,
#            -4t 180 vCPU 720 GB, -8t 180 vCPU 1440 GB)
#   TPU v5e: "TPU v5e" https://cloud.google.com/tpu/docs/v5e  (ct5lp-hightpu-1t 24/48 GB, -4t 112/192 GB,
#            -8t 224/384 GB)
#   TPU v5p: "TPU v5p" https://cloud.google.com/tpu/docs/v5p  (ct5p-hightpu-4t 208 vCPU 448 GB, 4 chips)
#   TPU v4:  "TPU v4" https://cloud.google.com/tpu/docs/v4  (ct4p-hightpu-4t 240 vCPU 407 GB, 4 chips)
#   CPU:     Compute Engine "General-purpose machine family" https://cloud.google.com/compute/docs/general-purpose-machines
#            (e2/n2-standard: 4 GB per vCPU; n4-standard: 4 GB per vCPU; c4d-standard: 3.875 GB per vCPU)
# GB here is Compute Engine's GB (GiB in practice: GCE reports memoryMb = GB * 1024).
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineType:
    name: str
    vcpus: int
    memory_gb: float
    tpu_chips: int = 0
    #: GKE node label cloud.google.com/gke-tpu-accelerator
    tpu_accelerator: str = ""
    #: "v6e", "v5e", "v5p", "v4"
    tpu_generation: str = ""

    @property
    def family(self) -> str:
        return self.name.split("-")[0]


MACHINE_TYPES = {
    m.name: m
    for m in (
        MachineType("ct6e-standard-1t", 44, 448, 1, "tpu-v6e-slice", "v6e"),
        MachineType("ct6e-standard-4t", 180, 720, 4, "tpu-v6e-slice", "v6e"),
        MachineType("ct6e-standard-8t", 180, 1440, 8, "tpu-v6e-slice", "v6e"),
        MachineType("ct5lp-hightpu-1t", 24, 48, 1, "tpu-v5-lite-podslice", "v5e"),
        MachineType("ct5lp-hightpu-4t", 112, 192, 4, "tpu-v5-lite-podslice", "v5e"),
        MachineType("ct5lp-hightpu-8t", 224, 384, 8, "tpu-v5-lite-podslice", "v5e"),
        MachineType("ct5p-hightpu-4t", 208, 448, 4, "tpu-v5p-slice", "v5p"),
        MachineType("ct4p-hightpu-4t", 240, 407, 4, "tpu-v4-podslice", "v4"),
        MachineType("e2-standard-8", 8, 32),
        MachineType("e2-standard-16", 16, 64),
        MachineType("n2-standard-8", 8, 32),
        MachineType("n2-standard-16", 16, 64),
        MachineType("n2-standard-32", 32, 128),
        MachineType("n4-standard-8", 8, 32),
        MachineType("n4-standard-32", 32, 128),
        MachineType("n4-standard-64", 64, 256),
        # Compute Engine "General-purpose machine family": the N4 standard table ends at n4-standard-80 (80 vCPUs,
        # 320 GB); the C4D standard table has c4d-standard-192 (192 vCPUs, 744 GB). Both are offered by the
        # package (tpu_rl.machines.SHAPES, tests/unit/test_gke_rules.py checks every one is known here).
        MachineType("n4-standard-80", 80, 320),
        MachineType("c4-standard-8", 8, 30),
        MachineType("c4-standard-96", 96, 360),
        MachineType("c4d-standard-32", 32, 124),
        MachineType("c4d-standard-96", 96, 372),
        MachineType("c4d-standard-192", 192, 744),
    )
}

# Machine series that take only Hyperdisk (no Persistent Disk) boot disks. Source: Compute Engine "Machine
# series comparison" / "Supported disk types" tables https://cloud.google.com/compute/docs/machine-resource
# (C4, C4D, N4: Hyperdisk only; TPU v6e VMs: Hyperdisk Balanced, see https://cloud.google.com/tpu/docs/v6e).
HYPERDISK_ONLY_FAMILIES = {"c4", "c4d", "c4a", "n4", "n4d", "c3", "ct6e"}

# Topologies per generation. Sources: the TPU docs pages above ("Supported configurations" tables).
TPU_2D_TOPOLOGIES = {
    "v6e": {"1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"},
    "v5e": {"1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"},
}

# The zones that offer each TPU generation. Source: Cloud TPU "TPU regions and zones"
# https://cloud.google.com/tpu/docs/regions-zones (US: v6e us-central1-b, us-east1-d, us-east5-a, us-east5-b; v5p
# us-central1-a, us-east5-a; v5e us-central1-a, us-south1-a, us-west1-c, us-west4-a; v4 us-central2-b. Europe: v6e
# europe-west4-a; v5p and v5e europe-west4-b. Asia Pacific: v6e asia-northeast1-b), as listed in 2026-12; zones
# the page names single-tenant only are left out. Compute Engine offers a TPU machine type only in these zones, and
# GKE refuses a pool of one elsewhere (check_machine_zones in sim/gke_rules.py). The package keeps its own table
# (tpu_rl.tpu.GENERATIONS); tests/unit/test_gke_rules.py checks that the two agree.
TPU_ZONES = {
    "v6e": frozenset(
        {"us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a", "asia-northeast1-b"}
    ),
    "v5p": frozenset({"us-central1-a", "us-east5-a", "europe-west4-b"}),
    "v5e": frozenset({"us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a", "europe-west4-b"}),
    "v4": frozenset({"us-central2-b"}),
}

# Flex-start TPU node pools: the zones and the GKE version. Source: GKE "About flex-start"
# https://cloud.google.com/kubernetes-engine/docs/concepts/dws ("To run TPUs, use GKE version 1.33.0-gke.1712000 or
# later. Flex-start supports the following version and zones": TPU Trillium (v6e) asia-northeast1-b, us-east5-a and
# us-east5-b; TPU v5e us-west4-a; TPU v5p us-east5-a; "TPU v3 and v4 are not supported"), and its run limit ("for
# up to seven days"; maxRunDurationSeconds "If you don't specify a value ... the default is seven days").
FLEX_START_TPU_ZONES = {
    "v6e": frozenset({"asia-northeast1-b", "us-east5-a", "us-east5-b"}),
    "v5e": frozenset({"us-west4-a"}),
    "v5p": frozenset({"us-east5-a"}),
}
FLEX_START_TPU_MIN_VERSION = "1.33.0-gke.1712000"
FLEX_START_MAX_RUN_SECONDS = 7 * 24 * 3600

# The default boot disk GKE uses when node_config.disk_type is empty. Source: GKE docs "Configuring a custom
# boot disk" https://cloud.google.com/kubernetes-engine/docs/how-to/custom-boot-disks: "By default, GKE uses
# balanced Persistent Disks in version 1.24 or later" (pd-balanced). Overridable by the emulator
# (TPU_RL_SIM_GKE_DEFAULT_BOOT_DISK) because whether GKE now picks hyperdisk-balanced by itself for
# Hyperdisk-only machine types is not documented there.
DEFAULT_BOOT_DISK = "pd-balanced"


# --------------------------------------------------------------------------------------------------------------
# What GKE refuses of a pool's machine
# --------------------------------------------------------------------------------------------------------------


def machine(name: str) -> MachineType:
    """The machine type named so, or GKE's refusal of a name it does not know."""
    if name not in MACHINE_TYPES:
        # Source: GKE's answer for an unknown machine type, quoted in kubernetes/kubernetes PR #12985:
        # 'code=400, message=machine type "ns-standard-1" does not exist.'
        raise invalid_argument(f'Machine type "{name}" does not exist.')
    return MACHINE_TYPES[name]


def check_tpu_slice(pool: dict) -> None:
    """A TPU machine type and placement_policy.tpu_topology must describe a slice GKE can build:
    - the topology is valid for the generation (2D lists for v5e/v6e, AxBxC for v4/v5p);
    - chips of the topology == nodes per zone x chips per host of the machine type;
    - a multi-host slice (more chips than one host has) needs placement_policy.type COMPACT, a topology, the
      4-chip machine type and exactly one zone.
    Source: GKE docs "Plan TPUs in GKE" / "Deploy TPU workloads in GKE Standard"
    https://cloud.google.com/kubernetes-engine/docs/how-to/tpus (multi-host slice: node count = chips of the
    topology / chips per VM; --tpu-topology with --placement-type=COMPACT); TPU docs for v6e/v5e/v5p/v4
    (topologies and chips per VM); error wording after GKE's "Maximum node count 0 is not a valid size of
    TPU pod slice with topology 2x2x2" quoted in vllm-project/ci-infra PR 545.
    """
    config = pool.get("config") or {}
    mt = MACHINE_TYPES.get(config.get("machine_type") or "")
    topology = (pool.get("placement_policy") or {}).get("tpu_topology") or ""
    if mt is None or not mt.tpu_chips:
        if topology:
            raise invalid_argument(
                f'TPU topology {topology} requires a TPU machine type, got "{config.get("machine_type")}".'
            )  # (wording ours)
        return
    if not topology:
        return  # single-host slices, one per node
    expected = _topology_chips(mt, topology) // mt.tpu_chips
    counted, nodes = _slice_node_count(pool)
    if nodes != expected:
        raise invalid_argument(
            f"{counted} {nodes} is not a valid size of TPU pod slice with topology {topology}; "
            f"a {topology} slice of {mt.name} has {expected} nodes."
        )
    if expected > 1:
        _check_multi_host_slice(pool, mt, topology)


def _topology_chips(mt: MachineType, topology: str) -> int:
    """The chips of ``topology``, once it is one of the generation's and whole hosts of ``mt`` make it up."""
    if not re.fullmatch(r"\d+x\d+(x\d+)?", topology):
        raise invalid_argument(f'Invalid TPU topology "{topology}".')  # (wording ours)
    dims = [int(d) for d in topology.split("x")]
    if mt.tpu_generation in TPU_2D_TOPOLOGIES:
        valid = topology in TPU_2D_TOPOLOGIES[mt.tpu_generation]
    else:
        # v4/v5p: AxBxC with every dimension 1, 2 or 4 (2x2x1 ... 4x4x4), or every dimension a multiple of 4
        # (4x4x12, 8x8x16): TPU docs "TPU v5p" / "TPU v4", topologies.
        valid = (
            len(dims) == 3 and min(dims) >= 1 and (all(d in (1, 2, 4) for d in dims) or all(d % 4 == 0 for d in dims))
        )
    if not valid:
        raise invalid_argument(
            f'TPU topology "{topology}" is not supported for machine type "{mt.name}".'
        )  # (wording ours)
    chips = math.prod(dims)
    if chips % mt.tpu_chips or chips < mt.tpu_chips:
        raise invalid_argument(
            f'TPU topology "{topology}" ({chips} chips) cannot be built from "{mt.name}" ({mt.tpu_chips} chips per VM).'
        )  # (wording ours)
    return chips


def _slice_node_count(pool: dict) -> tuple[str, int]:
    """The node count GKE holds a slice pool's topology against, and its name in GKE's refusal. An autoscaled slice
    pool grows to its maximum at once, so GKE checks the maximum ("Maximum node count 0 is not a valid size ...",
    quoted at check_tpu_slice); a fixed one its initial count."""
    autoscaling = pool.get("autoscaling") or {}
    if autoscaling.get("enabled"):
        return "Maximum node count", int(autoscaling.get("max_node_count") or 0)
    return "Node count", int(pool.get("initial_node_count") or 0)


def _check_multi_host_slice(pool: dict, mt: MachineType, topology: str) -> None:
    """A slice of more than one host: COMPACT placement, the 4-chip machine type, one zone."""
    if (pool.get("placement_policy") or {}).get("type") != "COMPACT":
        raise invalid_argument(
            f"A multi-host TPU slice (topology {topology}) requires placement_policy.type COMPACT."
        )  # (wording ours)
    if mt.tpu_chips != 4:
        raise invalid_argument(
            f'Machine type "{mt.name}" cannot form a multi-host TPU slice; use the 4-chip machine type.'
        )  # (wording ours)
    if len(pool.get("locations") or []) > 1:
        raise invalid_argument("A multi-host TPU slice node pool must be in exactly one zone.")  # (wording ours)


def check_disk_type(pool: dict, default_disk: str = DEFAULT_BOOT_DISK) -> None:
    """Hyperdisk-only machine series (C4, C4D, N4, C3, ct6e ...) refuse a Persistent Disk (pd-*) boot disk,
    including GKE's default pd-balanced when disk_type is empty.
    Source: Compute Engine "Machine series comparison" https://cloud.google.com/compute/docs/machine-resource
    (supported disk types per series); GKE "Configuring a custom boot disk" (default pd-balanced);
    error text of Compute Engine quoted in astronomer/astronomer issue 2463: "[pd-balanced, c4-standard-16]
    features are not compatible for creating instance."
    """
    config = pool.get("config") or {}
    name = config.get("machine_type") or ""
    if name.split("-")[0] not in HYPERDISK_ONLY_FAMILIES:
        return
    disk = config.get("disk_type") or default_disk
    if disk.startswith("pd-"):
        raise invalid_argument(
            f"Google Compute Engine: [{disk}, {name}] features are not compatible for creating instance. "
            f'Machine type "{name}" supports only Hyperdisk boot disks; set disk_type to '
            "hyperdisk-balanced."
        )


def check_gvnic(pool: dict) -> None:
    """C4D VMs support only the gVNIC network interface: a pool that turns gVNIC off explicitly is refused.
    Source: Compute Engine "C4D machine series" https://cloud.google.com/compute/docs/general-purpose-machines#c4d_series
    ("C4D ... supports only the gVNIC network interface") and GKE "Using Google Virtual NIC"
    https://cloud.google.com/kubernetes-engine/docs/how-to/using-gvnic. A pool that does not set gvnic is
    accepted (what GKE enables by itself for such machine types is not documented there).
    """
    config = pool.get("config") or {}
    name = config.get("machine_type") or ""
    if (
        name.split("-")[0] == "c4d"
        and "gvnic" in config
        and config["gvnic"] is not None
        and not (config["gvnic"] or {}).get("enabled")
    ):
        raise invalid_argument(f'Machine type "{name}" requires gVNIC; set gvnic.enabled to true.')  # (wording ours)


# --------------------------------------------------------------------------------------------------------------
# Node allocatable (GKE's reservations)
# --------------------------------------------------------------------------------------------------------------


def reserved_memory_bytes(capacity_bytes: int) -> int:
    """Memory GKE reserves for the kubelet and system: 25% of the first 4 GiB, 20% of the next 4 GiB, 10% of the
    next 8 GiB, 6% of the next 112 GiB, 2% above 128 GiB (machines under 1 GiB: 255 MiB).
    Source: GKE docs "Plan GKE Standard node sizes" / "Node allocatable resources"
    https://cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes#memory_and_cpu_reservations
    """
    if capacity_bytes < GIB:
        return 255 * MIB
    tiers = [(4 * GIB, 0.25), (4 * GIB, 0.20), (8 * GIB, 0.10), (112 * GIB, 0.06), (math.inf, 0.02)]
    left, reserved = capacity_bytes, 0.0
    for size, rate in tiers:
        part = min(left, size)
        reserved += part * rate
        left -= part
        if left <= 0:
            break
    return int(reserved)


EVICTION_THRESHOLD_BYTES = 100 * MIB  # same page: "GKE reserves an additional 100 MiB ... for kernel eviction"


def reserved_cpu_millicores(cores: int) -> float:
    """CPU GKE reserves: 6% of the first core, 1% of the next, 0.5% of the next 2, 0.25% of cores above 4.
    Source: as reserved_memory_bytes."""
    tiers = [(1, 0.06), (1, 0.01), (2, 0.005), (math.inf, 0.0025)]
    left, reserved = float(cores), 0.0
    for size, rate in tiers:
        part = min(left, size)
        reserved += part * rate * 1000
        left -= part
        if left <= 0:
            break
    return reserved


#: GKE's default boot disk, GB (API reference NodeConfig.disk_size_gb: "If unspecified, the default disk size
#: is 100GB").
DEFAULT_DISK_GB = 100
#: Local ephemeral storage a node leaves to pods, as a share of its boot disk's capacity: GKE's example output in
#: "Plan GKE Standard node sizes" (a node of the default disk: capacity ephemeral-storage 98831908Ki,
#: allocatable 47060071478 bytes: 46.5%). GKE's reservation grows slower than the disk; the share is kept for any
#: size, which is conservative for larger disks.
EPHEMERAL_ALLOCATABLE_SHARE = 47060071478 / (98831908 * 1024)


def node_resources(mt: MachineType, disk_gb: int = DEFAULT_DISK_GB) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of a node of machine type ``mt`` with a boot disk of ``disk_gb``, as the kubelet
    reports them (Kubernetes quantities)."""
    memory = int(mt.memory_gb * GIB)
    disk = int(disk_gb * 98831908 * 1024 / DEFAULT_DISK_GB)  # the filesystem of the example's 100 GB disk
    capacity = {
        "cpu": str(mt.vcpus),
        "memory": f"{memory // 1024}Ki",
        "pods": "110",
        "ephemeral-storage": f"{disk // 1024}Ki",
    }
    cpu_alloc = mt.vcpus * 1000 - math.ceil(reserved_cpu_millicores(mt.vcpus))
    mem_alloc = memory - reserved_memory_bytes(memory) - EVICTION_THRESHOLD_BYTES
    allocatable = {
        "cpu": f"{cpu_alloc}m",
        "memory": f"{mem_alloc // 1024}Ki",
        "pods": "110",
        "ephemeral-storage": str(int(disk * EPHEMERAL_ALLOCATABLE_SHARE)),
    }
    if mt.tpu_chips:
        capacity["google.com/tpu"] = allocatable["google.com/tpu"] = str(mt.tpu_chips)
    return capacity, allocatable
