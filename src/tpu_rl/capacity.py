"""Where a created TPU pool's VMs come from: one object per capacity type, with what its pool request applies and
the properties the rules, the plan and the operators read. xpk offers the same four (``src/xpk/core/capacity.py``:
``--on-demand``, ``--reservation``, ``--spot``, ``--flex``). A new type is one object here (plus its rule in the GKE
emulator, ``sim/gke_rules.py``); the trigger form, the requests, the rules and the tests follow. Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class RunConfig(Protocol):
    """What a capacity type reads of the run's config (``tpu_rl.config.RunConfig``, which imports this module)."""

    project: str
    reservation: str

    @property
    def hosts_per_slice(self) -> int: ...


@dataclass(frozen=True)
class CapacityType:
    """One capacity type.

    :param apply: sets the type's fields in a TPU pool request (``gke.tpu_node_pool``).
    :param fields: what it sets, in words, for the plan's reader.
    :param needs_reservation: ``reservation`` is required with it, and refused with any other type.
    :param starts_empty: the pool is created with no node; GKE adds the slice when the training's pods ask for it
        (nothing to wait for at create time: ``capacity_wait_minutes`` does not apply).
    :param preemptible: its VMs can be reclaimed at any time (they draw the preemptible TPU quota).
    :param unsupported_generations: TPU generations GKE does not offer with it.
    :param zones: where GKE offers it, by TPU generation (None: in every zone that has the generation).
    """

    name: str
    apply: Callable[[RunConfig, dict[str, Any]], None]
    fields: Callable[[RunConfig], str]
    needs_reservation: bool = False
    starts_empty: bool = False
    preemptible: bool = False
    unsupported_generations: frozenset[str] = frozenset()
    zones: dict[str, tuple[str, ...]] | None = None


def _on_demand(config: RunConfig, pool: dict[str, Any]) -> None:
    """Standard VMs, all of the slice's hosts at once (xpk ``--on-demand`` adds no flag)."""


def _reservation(config: RunConfig, pool: dict[str, Any]) -> None:
    """gcloud ``--reservation-affinity=specific --reservation=NAME`` (xpk ``--reservation``); GKE API reference
    ReservationAffinity: key ``compute.googleapis.com/reservation-name``, the reservation as its value: a name in
    the pool's project or ``projects/OWNER/reservations/NAME`` (a shared reservation; GKE "Consuming reserved zonal
    resources"; xpk ``core/reservation.py`` also sends ``/reservationBlocks/...``)."""
    pool["config"]["reservation_affinity"] = {
        "consume_reservation_type": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": [config.reservation_path],
    }


def _spot(config: RunConfig, pool: dict[str, Any]) -> None:
    """gcloud ``--spot`` (xpk ``--spot``): NodeConfig.spot. A Spot pool consumes no reservation (Cluster
    Toolkit's gke-node-pool refuses spot with any reservation affinity but NO_RESERVATION). GKE labels the
    nodes ``cloud.google.com/gke-spot=true`` and, on Standard clusters, adds no taint of its own (GKE docs
    "Spot VMs"): the workers already select the run's own pools, so they need no Spot selector."""
    pool["config"]["spot"] = True
    pool["config"]["reservation_affinity"] = {"consume_reservation_type": "NO_RESERVATION"}


def _flex_start(config: RunConfig, pool: dict[str, Any]) -> None:
    """DWS flex-start, as GKE's "Run a small batch workload with TPUs and flex-start provisioning mode"
    (https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training-tpu) and xpk ``--flex``
    (``src/xpk/core/capacity.py``: ``--flex-start --enable-autoscaling --location-policy=ANY
    --reservation-affinity=none --no-enable-autorepair --max-nodes=N``, ``--num-nodes=0``) create it: no
    initial nodes; autoscaling from 0 to the slice's hosts, which the autoscaler adds as one slice when
    the training's pods ask for it; no reservation; auto-repair off, which Cluster Toolkit's gke-node-pool
    requires for flex-start ("enable_flex_start needs node auto_repair set to false") and its TPU v6e
    flex-start blueprint sets on a REGULAR-channel cluster while keeping auto-upgrade on. No queued
    provisioning: xpk enables it only for single-slice GPU pools (``is_queued_cluster``)."""
    pool["config"]["flex_start"] = True
    pool["config"]["reservation_affinity"] = {"consume_reservation_type": "NO_RESERVATION"}
    pool["initial_node_count"] = 0
    pool["autoscaling"] = {
        "enabled": True,
        "min_node_count": 0,
        "max_node_count": config.hosts_per_slice,
        "location_policy": "ANY",
    }
    pool["management"] = {"auto_repair": False, "auto_upgrade": True}


#: Every capacity type, the default first.
CAPACITY: dict[str, CapacityType] = {
    t.name: t
    for t in (
        CapacityType("on_demand", _on_demand, lambda config: "no capacity field (standard VMs, all hosts at once)"),
        CapacityType(
            "reservation",
            _reservation,
            lambda config: f"config.reservation_affinity SPECIFIC_RESERVATION '{config.reservation}'",
            needs_reservation=True,
        ),
        CapacityType(
            "spot",
            _spot,
            lambda config: "config.spot true, config.reservation_affinity NO_RESERVATION",
            preemptible=True,
        ),
        CapacityType(
            "flex_start",
            _flex_start,
            lambda config: (
                "config.flex_start true, config.reservation_affinity NO_RESERVATION, initial_node_count 0, "
                f"autoscaling 0..{config.hosts_per_slice} (location policy ANY), management.auto_repair false"
            ),
            starts_empty=True,
            # GKE docs "About flex-start" (kubernetes-engine/docs/concepts/dws): "TPU v3 and v4 are not supported";
            # "Flex-start supports the following version and zones": TPU Trillium (v6e) asia-northeast1-b, us-east5-a
            # and us-east5-b, TPU v5e us-west4-a, TPU v5p us-east5-a (the GKE emulator's FLEX_START_TPU_ZONES).
            unsupported_generations=frozenset({"v4"}),
            zones={
                "v6e": ("asia-northeast1-b", "us-east5-a", "us-east5-b"),
                "v5litepod": ("us-west4-a",),
                "v5p": ("us-east5-a",),
            },
        ),
    )
}
#: The form's default: what an existing pool (``tpu_pool_mode`` other than ``per_run``) is taken as.
DEFAULT_CAPACITY = "on_demand"
