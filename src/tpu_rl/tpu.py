"""TPU generations: how a TPU type, a topology and a machine type become hosts and labels."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TpuGeneration:
    name: str
    #: GKE node label ``cloud.google.com/gke-tpu-accelerator``.
    accelerator: str
    #: Pathways resource manager ``--instance_type`` prefix.
    pathways_prefix: str
    #: Machine types and their chips per host.
    machine_types: dict[str, int]
    #: Topologies a slice can have (2D generations list them; 3D ones are checked by rule).
    topologies: tuple[str, ...] | None
    #: The number in ``v4-128`` counts TensorCores, two per chip; ``v6e-64`` counts chips.
    cores_per_chip: int = 1
    #: The zones that offer it: Cloud TPU "TPU regions and zones" (https://cloud.google.com/tpu/docs/regions-zones,
    #: as listed in 2026-12, single-tenant zones left out). GKE refuses a pool of its machine type elsewhere
    #: ("Invalid machine type ... in zone ...: GCE_NOT_FOUND"). The GKE emulator keeps its own table
    #: (sim/gke_machines.py TPU_ZONES); tests/unit/test_gke_rules.py checks that the two agree.
    zones: tuple[str, ...] = ()


GENERATIONS = {
    g.name: g
    for g in (
        TpuGeneration(
            "v6e",
            "tpu-v6e-slice",
            "tpuv6e",
            {"ct6e-standard-4t": 4, "ct6e-standard-8t": 8, "ct6e-standard-1t": 1},
            ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
            zones=("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a", "asia-northeast1-b"),
        ),
        TpuGeneration(
            "v5litepod",
            "tpu-v5-lite-podslice",
            "tpuv5e",
            {"ct5lp-hightpu-4t": 4, "ct5lp-hightpu-8t": 8, "ct5lp-hightpu-1t": 1},
            ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
            zones=("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a", "europe-west4-b"),
        ),
        TpuGeneration(
            "v5p",
            "tpu-v5p-slice",
            "tpuv5",
            {"ct5p-hightpu-4t": 4},
            None,
            cores_per_chip=2,
            zones=("us-central1-a", "us-east5-a", "europe-west4-b"),
        ),
        TpuGeneration(
            "v4", "tpu-v4-podslice", "tpuv4", {"ct4p-hightpu-4t": 4}, None, cores_per_chip=2, zones=("us-central2-b",)
        ),
    )
}


def chips_per_host(machine_type: str) -> int:
    """TPU chips on one host of this machine type; 0 for a machine type without TPUs."""
    return next((g.machine_types[machine_type] for g in GENERATIONS.values() if machine_type in g.machine_types), 0)


class SliceError(ValueError):
    """A TPU type, topology or machine type that cannot describe a slice. ``field`` names the param."""

    def __init__(self, field: str, problem: str, fix: str):
        super().__init__(f"{field}: {problem}; fix: {fix}.")
        self.field, self.problem, self.fix = field, problem, fix


@dataclass(frozen=True)
class SliceShape:
    generation: TpuGeneration
    topology: str
    chips: int
    chips_per_host: int

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def pathways_instance_type(self) -> str:
        return f"{self.generation.pathways_prefix}:{self.topology}"


def _is_valid_3d(dims: list[int]) -> bool:
    """v4 and v5p slices (Cloud TPU docs, "TPU v5p" / "TPU v4", topologies): AxBxC with every dimension at
    most 4 (1, 2 or 4, as in 2x2x1 or 2x4x4), or every dimension a multiple of 4 (4x4x12, 8x8x16)."""
    if len(dims) != 3 or min(dims) < 1:
        return False
    return all(d in (1, 2, 4) for d in dims) or all(d % 4 == 0 for d in dims)


def slice_shape(tpu_type: str, topology: str, compute_type: str) -> SliceShape:
    """Checks that the three values agree and derives the slice's chips and hosts."""
    match = re.fullmatch(r"(v6e|v5litepod|v5p|v4)-(\d+)", tpu_type)
    if not match:
        raise SliceError(
            "tpu_type",
            f"'{tpu_type}' is not a TPU type this DAG knows",
            f"use <generation>-<size> with generation one of {', '.join(GENERATIONS)}, e.g. v6e-64",
        )
    generation = GENERATIONS[match.group(1)]
    if not re.fullmatch(r"\d+x\d+(x\d+)?", topology):
        raise SliceError("topology", f"'{topology}' is not a topology", "write it as AxB or AxBxC, e.g. 8x8")
    dims = [int(d) for d in topology.split("x")]
    valid = topology in generation.topologies if generation.topologies else _is_valid_3d(dims)
    if not valid:
        allowed = (
            ", ".join(generation.topologies)
            if generation.topologies
            else "AxBxC with every dimension 1, 2 or 4, or every dimension a multiple of 4"
        )
        raise SliceError("topology", f"'{topology}' is not a {generation.name} topology", f"use one of {allowed}")
    chips = math.prod(dims)
    expected = int(match.group(2)) // generation.cores_per_chip
    if chips != expected:
        raise SliceError(
            "topology",
            f"{topology} has {chips} chips but {tpu_type} has {expected}",
            "change topology or tpu_type so they agree",
        )
    if compute_type not in generation.machine_types:
        raise SliceError(
            "compute_type",
            f"'{compute_type}' is not a {generation.name} machine type",
            f"use one of {', '.join(generation.machine_types)}",
        )
    per_host = generation.machine_types[compute_type]
    if chips % per_host or (chips > per_host and per_host != 4):
        raise SliceError(
            "compute_type",
            f"{compute_type} has {per_host} chips per host and cannot form a {chips}-chip slice",
            f"multi-host slices use {next(m for m, c in generation.machine_types.items() if c == 4)}",
        )
    return SliceShape(generation, topology, chips, per_host)
