"""What GKE refuses, as pure functions over request bodies (container_v1 JSON with snake_case field names and
enum names, i.e. ``type(msg).to_dict(msg, preserving_proto_field_name=True, use_integers_for_enums=False)``).

Used by sim/gke_emulator.py before it accepts a request, and by tests/unit/test_gke_rules.py. No imports from
plugins/ (the pipeline is what these rules check): only the standard library, sim/gke_errors.py and
sim/gke_machines.py, pure too.

Here: locations, names, a node pool's settings and capacity (Spot, flex-start, reservations, quota), the whole
request (``check_cluster``, ``check_node_pool``, which run every rule) and what the operations running on a
cluster forbid. What GKE refuses of a pool's machine (its type, TPU slice, boot disk, network interface) is in
sim/gke_machines.py, with the machine table.

Every rule raises ``GkeError(code, message)`` (sim/gke_errors.py: the gRPC status the emulator answers with).
Messages are GKE's where a public source quotes them (cited at each rule); otherwise written in GKE's style and
marked "(wording ours)".
"""

from __future__ import annotations

import re

from .gke_errors import GkeError, invalid_argument
from .gke_machines import (
    DEFAULT_BOOT_DISK,
    FLEX_START_MAX_RUN_SECONDS,
    FLEX_START_TPU_MIN_VERSION,
    FLEX_START_TPU_ZONES,
    MACHINE_TYPES,
    TPU_ZONES,
    check_disk_type,
    check_gvnic,
    check_tpu_slice,
    machine,
)

# --------------------------------------------------------------------------------------------------------------
# Locations and the project
# --------------------------------------------------------------------------------------------------------------

# The zones of the regions the emulator serves: those with TPU zones in Cloud TPU's "TPU regions and zones"
# (v6e: us-central1-b, us-east1-d, us-east5-a/-b, europe-west4-a, asia-northeast1-b; v5e: us-central1-a,
# us-south1-a, us-west1-c, us-west4-a; v5p: us-east5-a), each with the zones Compute Engine's "Regions and
# zones" lists for it. A region missing here is refused rather than given zones it may not have. us-central2, the
# region of TPU v4, is given only the zone the TPU page names (us-central2-b; keras-team/kinetic issue 305 lists the
# machine series it offers).
REGION_ZONES = {
    "us-central2": ("b",),
    "us-east5": ("a", "b", "c"),
    "us-central1": ("a", "b", "c", "f"),
    "us-east1": ("b", "c", "d"),
    "us-south1": ("a", "b", "c"),
    "us-west1": ("a", "b", "c"),
    "us-west4": ("a", "b", "c"),
    "europe-west4": ("a", "b", "c"),
    "asia-northeast1": ("a", "b", "c"),
}

# The simulated project's number (in its Compute Engine default account and Workload Identity principals),
# and the node annotation that carries a node's service account to the MaxText emulator's bucket checks.
PROJECT_NUMBER = "100000000001"
NODE_SERVICE_ACCOUNT_ANNOTATION = "sim.tpu-rl.dev/service-account"


def project_number(project_id: str) -> str:
    """The number of a project (GKE's operation links name it so): the simulated project's, or one derived
    from any other id (stable, 12 digits)."""
    if project_id == "tpu-rl-sim":
        return PROJECT_NUMBER
    return str(100000000000 + int.from_bytes(project_id.encode(), "big") % 899999999999)


def region_of(location: str) -> str:
    """The region of a location: itself, or a zone's (``us-east5-b`` -> ``us-east5``)."""
    return location.rsplit("-", 1)[0] if location.count("-") == 2 else location


def zones_of(region: str) -> list[str]:
    """The zones of a region (REGION_ZONES); a zone is its own only zone."""
    if region.count("-") != 1:  # a zone, not a region
        return [region]
    if region not in REGION_ZONES:
        # Source: GKE's answer for a location it does not serve, e.g. 'Location "us-east9" is not found or
        # access is unauthorized.' (wording after GKE's 404 for an unknown location)
        raise GkeError("NOT_FOUND", f'Location "{region}" is not found or access is unauthorized.')
    return [f"{region}-{s}" for s in REGION_ZONES[region]]


# --------------------------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------------------------

NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?")


def check_cluster_name(name: str) -> None:
    """Cluster name: lowercase letters, digits and hyphens, starts with a letter, ends with a letter or digit,
    at most 40 characters.
    Source: GKE API reference, Cluster.name ("The name of this cluster. The name must be unique within this
    project and location (e.g. zone or region), and can be up to 40 characters with the following
    restrictions: Lowercase letters, numbers, and hyphens only. Must start with a letter. Must end with a
    number or a letter.") https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters#Cluster
    """
    _check_name("cluster.name", "Cluster.name", name)


def check_node_pool_name(name: str) -> None:
    """Node pool name: same format as a cluster name, at most 40 characters.
    Source: gcloud container node-pools create reference (NAME: "The name of the node pool to create") and
    the console's rule "Name must start with a lowercase letter followed by up to 39 lowercase letters,
    numbers, or hyphens, and cannot end with a hyphen" (the same rule as the cluster name, quoted in
    gitlab-org/gitlab issue 22655). https://cloud.google.com/sdk/gcloud/reference/container/node-pools/create
    """
    _check_name("node_pool.name", "NodePool.name", name)


def _check_name(field: str, message_name: str, name: str) -> None:
    if not name:
        raise invalid_argument(f"{message_name} must be specified.")  # (wording ours)
    if not NAME_RE.fullmatch(name):
        raise invalid_argument(
            f'Invalid value for field "{field}": "{name}". Must be up to 40 characters: lowercase letters, '
            "numbers and hyphens, starting with a letter and ending with a letter or a number."
        )  # (wording ours)


# --------------------------------------------------------------------------------------------------------------
# Node pool settings
# --------------------------------------------------------------------------------------------------------------


def check_management_with_release_channel(cluster: dict, pool: dict) -> None:
    """On a cluster enrolled in a release channel, node auto-upgrade cannot be disabled.
    Source: GKE API reference ReleaseChannel ("When a cluster is subscribed to a release channel, Google
    maintains both the master version and the node version. Node auto-upgrade defaults to true and cannot be
    disabled.") https://cloud.google.com/kubernetes-engine/docs/reference/rest/Shared.Types/ReleaseChannel ;
    error text quoted in nkoson/gke-tutorial issue 8 and terraform-google-kubernetes-engine PR 682:
    "Error 400: Auto_upgrade cannot be false when release_channel REGULAR is set., badRequest".
    Auto-repair is not bound by the channel: GKE docs "Auto-repair nodes" ("In Standard clusters, node
    auto-repair is enabled by default for new node pools. You can disable auto repair ...")
    https://cloud.google.com/kubernetes-engine/docs/how-to/node-auto-repair , and flex-start pools need it
    off (check_capacity) on such clusters: Cluster Toolkit's TPU v6e flex-start blueprint
    (examples/gke-consumption-options/dws-flex-start/gke-tpu-v6e) sets auto_repair false, auto_upgrade true
    on a REGULAR-channel cluster.
    A pool without a ``management`` message gets GKE's defaults (both true) and passes.
    """
    channel = (cluster.get("release_channel") or {}).get("channel") or "UNSPECIFIED"
    if channel == "UNSPECIFIED" or "management" not in pool or pool["management"] is None:
        return
    if not pool["management"].get("auto_upgrade"):
        raise invalid_argument(f"Auto_upgrade cannot be false when release_channel {channel} is set.")


def check_pool_locations(region: str, pool: dict) -> None:
    """A node pool's locations must be zones of the cluster's region.
    Source: GKE API reference NodePool.locations ("The list of Google Compute Engine zones in which the
    NodePool's nodes should be located ... must be in the same region as the cluster"); the symptom in
    hashicorp/terraform-provider-google issue 5229 (a pool in a zone outside the cluster's location).
    https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters.nodePools#NodePool
    """
    allowed = zones_of(region)
    for zone in pool.get("locations") or []:
        if zone not in allowed:
            raise invalid_argument(
                f'Location "{zone}" is not a zone of the cluster\'s region "{region}"; node pool '
                f'"{pool.get("name")}" can use {", ".join(allowed)}.'
            )  # (wording ours)


#: A reservation as ReservationAffinity names it: NAME (the pool's project), or projects/OWNER/reservations/NAME with an
#: optional block and sub-block (Compute API ReservationAffinity; xpk core/reservation.py sends blocks).
_RESERVATION_VALUE = re.compile(
    r"(?:projects/(?P<owner>[^/]+)/reservations/)?(?P<name>[^/]+)"
    r"(?:/reservationBlocks/[^/]+(?:/reservationSubBlocks/[^/]+)?)?"
)


def reservation_consumers(entries: list, project: str) -> dict[str, frozenset[str]]:
    """The reservations the emulated Compute Engine holds, by path, with the projects that may consume each: its
    owner, and the projects it is shared with. ``entries``: names or paths (reservations of ``project`` or of the
    path's owner, not shared), or ``{"name": path, "shared_with": [project, ...]}``.
    Source: Compute Engine "Shared reservations" (a reservation's shareSettings: shareType SPECIFIC_PROJECTS and
    the consumer projects; only those projects can consume it)."""
    known = {}
    for entry in entries:
        name, shared = (entry["name"], entry.get("shared_with", [])) if isinstance(entry, dict) else (entry, [])
        match = _RESERVATION_VALUE.fullmatch(name)
        owner = match["owner"] or project
        known[f"projects/{owner}/reservations/{match['name']}"] = frozenset({owner, *shared})
    return known


def check_reservation_affinity(pool: dict, project: str, known_reservations: dict[str, frozenset[str]]) -> None:
    """SPECIFIC_RESERVATION needs key compute.googleapis.com/reservation-name and exactly one value, naming a
    reservation that exists (in the pool's project, or another project's shared with it).
    Source: GKE API reference ReservationAffinity ("key: Corresponds to the label key of a reservation resource.
    To target a SPECIFIC_RESERVATION by name, specify "compute.googleapis.com/reservation-name" as the key and
    specify the name of your reservation as its value.")
    https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/NodeConfig#ReservationAffinity ;
    GKE docs "Consuming reserved zonal resources" (a shared reservation by projects/OWNER/reservations/NAME)
    https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations ;
    unknown reservation: GKE's 404 quoted in GoogleCloudPlatform/cluster-toolkit PR 5043: "Google Compute
    Engine: reservation "NAME" not found for node pool "POOL" at zone "ZONE"." (code NOT_FOUND); a reservation
    of another project not shared with the pool's is refused likewise (wording ours: Compute Engine does not
    show one project another's reservations).
    ``known_reservations``: :func:`reservation_consumers`.
    """
    config = pool.get("config") or {}
    affinity = config.get("reservation_affinity") or {}
    kind = affinity.get("consume_reservation_type") or "UNSPECIFIED"
    if kind != "SPECIFIC_RESERVATION":
        return
    if affinity.get("key") != "compute.googleapis.com/reservation-name":
        raise invalid_argument(
            'Reservation affinity key must be "compute.googleapis.com/reservation-name" for SPECIFIC_RESERVATION.'
        )  # (wording ours)
    values = affinity.get("values") or []
    if len(values) != 1:
        raise invalid_argument(
            f"SPECIFIC_RESERVATION requires exactly one reservation name, got {len(values)}."
        )  # (wording ours)
    match = _RESERVATION_VALUE.fullmatch(values[0])
    if not match:
        raise invalid_argument(f'Invalid reservation "{values[0]}".')  # (wording ours)
    path = f"projects/{match['owner'] or project}/reservations/{match['name']}"
    if project not in known_reservations.get(path, ()):
        zone = (pool.get("locations") or ["?"])[0]
        raise GkeError(
            "NOT_FOUND",
            f'Google Compute Engine: reservation "{match["name"]}" not found for node pool '
            f'"{pool.get("name")}" at zone "{zone}".',
        )


def check_reservation_zone(pool: dict, zone: str, project: str, entries: list) -> None:
    """A reservation is zonal: a pool in another zone than the one ``entries`` (reservations.json) gives it is
    answered as for a reservation that does not exist there, GKE's 404 of :func:`check_reservation_affinity`
    ('Google Compute Engine: reservation "NAME" not found for node pool "POOL" at zone "ZONE".'). Compute Engine
    "Reservations of Compute Engine zonal resources": "Reservations are zonal"."""
    path = reservation_of(pool, project)
    for entry in entries:
        if not isinstance(entry, dict) or not entry.get("zone"):
            continue
        match = _RESERVATION_VALUE.fullmatch(entry["name"])
        if path == f"projects/{match['owner'] or project}/reservations/{match['name']}" and entry["zone"] != zone:
            raise GkeError(
                "NOT_FOUND",
                f'Google Compute Engine: reservation "{match["name"]}" not found for node pool "{pool.get("name")}" '
                f'at zone "{zone}".',
            )


def reservation_vm_counts(entries: list, project: str) -> dict[str, int]:
    """The reservations of ``entries`` (:func:`reservation_consumers`' list) that hold a fixed number of VMs, by
    path: ``{"name": ..., "vm_count": N}`` (Compute API ``Reservation.specificReservation.count``, "the number of
    resources that are allocated"). Those without one take any pool, as before."""
    counts = {}
    for entry in entries:
        if isinstance(entry, dict) and entry.get("vm_count") is not None:
            match = _RESERVATION_VALUE.fullmatch(entry["name"])
            counts[f"projects/{match['owner'] or project}/reservations/{match['name']}"] = int(entry["vm_count"])
    return counts


def reservation_of(pool: dict, project: str) -> str | None:
    """The path of the specific reservation a pool request consumes (None: it consumes none by name)."""
    affinity = (pool.get("config") or {}).get("reservation_affinity") or {}
    values = affinity.get("values") or []
    if affinity.get("consume_reservation_type") != "SPECIFIC_RESERVATION" or len(values) != 1:
        return None
    match = _RESERVATION_VALUE.fullmatch(values[0])
    return f"projects/{match['owner'] or project}/reservations/{match['name']}" if match else None


def check_reservation_vms(pool: dict, zone: str, project: str, counts: dict[str, int], consumed: int) -> None:
    """A pool whose nodes do not fit in what its reservation has left (``counts``: :func:`reservation_vm_counts`;
    ``consumed``: the VMs the project's other pools take from it) is refused at once with 429 RESOURCE_EXHAUSTED.
    Source: GKE's answer quoted in GoogleCloudPlatform/gsutil issue 1000 ('ResponseError: code=429,
    message=Reservation does not have enough resources for the request: specific reservation "reservation" is
    insufficient for node pool "np4" at zone "us-central1-c": required 1 and short of 1 VM count of machine type
    n2-standard-2.')."""
    path = reservation_of(pool, project)
    if path not in counts:
        return
    required, free = int(pool.get("initial_node_count") or 0), max(counts[path] - consumed, 0)
    if required <= free:
        return
    machine_type = (pool.get("config") or {}).get("machine_type", "")
    raise GkeError(
        "RESOURCE_EXHAUSTED",
        f'Reservation does not have enough resources for the request: specific reservation "{path.rsplit("/", 1)[-1]}" '
        f'is insufficient for node pool "{pool.get("name")}" at zone "{zone}": required {required} and short of '
        f"{required - free} VM count of machine type {machine_type}.",
    )


def pool_zones(cluster: dict, pool: dict, region: str) -> list[str]:
    """The zones a pool's nodes go to: its own locations, else the cluster's, else (a cluster created without
    locations) the first three of its region, as the emulator gives such a cluster."""
    return list(pool.get("locations") or cluster.get("locations") or zones_of(region)[:3])


def check_machine_zones(cluster: dict, pool: dict, region: str) -> None:
    """A TPU machine type only in the zones that offer its generation (sim/gke_machines.TPU_ZONES, after Cloud TPU's
    "TPU regions and zones"): a ct6e pool in us-east5-c is refused at once.
    Source of the text: GKE's 400 for a machine type a zone lacks, quoted in keras-team/kinetic issue 305:
    'googleapi: Error 400: Invalid machine type "e2-standard-4" in zone "us-central2-b": GCE_NOT_FOUND'."""
    mt = MACHINE_TYPES.get((pool.get("config") or {}).get("machine_type") or "")
    if mt is None or not mt.tpu_generation:
        return
    for zone in pool_zones(cluster, pool, region):
        if zone not in TPU_ZONES[mt.tpu_generation]:
            raise invalid_argument(f'Invalid machine type "{mt.name}" in zone "{zone}": GCE_NOT_FOUND')


def capacity_type_of(pool: dict) -> str:
    """The capacity type of a node pool request, as the fault rules name it (sim/gke_faults.py): Spot
    (``config.spot``), flex-start (``config.flex_start``), a reservation (``reservation_affinity``
    SPECIFIC_RESERVATION), else on demand. GKE's fields: API reference ``NodeConfig.spot``, ``NodeConfig.flex_start``,
    ``ReservationAffinity.consume_reservation_type``."""
    config = pool.get("config") or {}
    affinity = (config.get("reservation_affinity") or {}).get("consume_reservation_type")
    if config.get("spot"):
        return "spot"
    if config.get("flex_start"):
        return "flex_start"
    return "reservation" if affinity == "SPECIFIC_RESERVATION" else "on_demand"


def check_capacity(pool: dict) -> None:
    """What GKE requires of a Spot or flex-start node pool:
    - spot and flex-start exclude each other;
    - a Spot pool consumes no reservation (reservation affinity NO_RESERVATION or unset);
    - a flex-start pool: not TPU v4, no reservation (NO_RESERVATION), no initial nodes, autoscaling enabled
      from 0, and auto-repair off (a pool without ``management`` gets auto-repair on, GKE's default, and is
      refused).
    Sources: GKE docs "Run a small batch workload with TPUs and flex-start provisioning mode"
    https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training-tpu (gcloud container
    node-pools create ... --reservation-affinity=none --enable-autoscaling --flex-start --num-nodes 0
    --min-nodes=0 --max-nodes=N); GoogleCloudPlatform/cluster-toolkit modules/compute/gke-node-pool/main.tf
    preconditions ("enable_flex_start needs node auto_repair set to false", "enable_flex_start does not work
    with static_node_count", "enable_flex_start requires reservation_affinity.consume_reservation_type to be
    'NO_RESERVATION'", "Both enable_flex_start and spot consumption option cannot be set to true at the same
    time", "Spot consumption option only works with reservation_affinity consume_reservation_type
    NO_RESERVATION"); AI-Hypercomputer/xpk src/xpk/core/capacity.py (flex: --flex-start
    --enable-autoscaling --location-policy=ANY --reservation-affinity=none --no-enable-autorepair, and
    --num-nodes=0 in core/nodepool.py). GKE's own texts for these refusals are not quoted in these sources:
    every message here is (wording ours). The auto-repair rule is Cluster Toolkit's precondition: GKE's
    flex-start page neither sets nor forbids auto-repair, so here the emulator may be stricter than GKE.
    """
    config = pool.get("config") or {}
    name = pool.get("name")
    affinity = (config.get("reservation_affinity") or {}).get("consume_reservation_type") or "UNSPECIFIED"
    if config.get("spot") and config.get("flex_start"):
        raise invalid_argument(f'Node pool "{name}": spot and flex_start cannot both be set.')
    if config.get("spot") and affinity not in ("UNSPECIFIED", "NO_RESERVATION"):
        raise invalid_argument(
            f'Node pool "{name}": Spot VMs cannot consume reservations; reservation affinity must be '
            f"NO_RESERVATION, got {affinity}."
        )
    if not config.get("flex_start"):
        return
    mt = MACHINE_TYPES.get(config.get("machine_type") or "")
    if mt is not None and mt.tpu_generation == "v4":
        # GKE docs "About flex-start" https://cloud.google.com/kubernetes-engine/docs/concepts/dws
        # (requirements: "TPU v3 and v4 are not supported").
        raise invalid_argument(f'Node pool "{name}": flex-start does not support machine type "{mt.name}".')
    if affinity != "NO_RESERVATION":
        raise invalid_argument(
            f'Node pool "{name}": flex-start requires reservation affinity NO_RESERVATION, got {affinity}.'
        )
    if int(pool.get("initial_node_count") or 0):
        raise invalid_argument(
            f'Node pool "{name}": flex-start node pools start with no nodes; initial_node_count must be 0.'
        )
    autoscaling = pool.get("autoscaling") or {}
    if not autoscaling.get("enabled") or int(autoscaling.get("min_node_count") or 0):
        raise invalid_argument(f'Node pool "{name}": flex-start requires autoscaling enabled with min_node_count 0.')
    if (pool.get("management") or {"auto_repair": True}).get("auto_repair"):
        raise invalid_argument(f'Node pool "{name}": flex-start requires node auto-repair to be disabled.')


#: The version the emulator gives a cluster created without a full one (GKE picks its channel's default).
DEFAULT_CLUSTER_VERSION = "1.34.4-gke.sim"
_FULL_VERSION = re.compile(r"\d+\.\d+\.\d+-gke\.\d+")


def cluster_version(cluster: dict) -> str:
    """The cluster's GKE version: what it runs, else the full version its create asks for, else the default (an
    alias such as "latest" or "1.33" is taken as the default)."""
    asked = cluster.get("initial_cluster_version") or ""
    return (
        cluster.get("current_master_version")
        or (asked if _FULL_VERSION.fullmatch(asked) else "")
        or DEFAULT_CLUSTER_VERSION
    )


def _version_key(version: str) -> tuple[int, int, int, int]:
    """1.33.0-gke.1712000 as (1, 33, 0, 1712000); a build that is not a number (the emulator's "sim") as 0."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)(?:-gke\.(\d+))?", version)
    if not match:
        return (0, 0, 0, 0)
    return tuple(int(part or 0) for part in match.groups())  # type: ignore[return-value]


def _duration_seconds(duration: str | None) -> float:
    """A protobuf Duration in its JSON form ("604800s", "1.5s"); 0 when unset."""
    return float(duration.rstrip("s")) if duration else 0.0


def check_flex_start_tpu(cluster: dict, pool: dict, region: str) -> None:
    """What GKE requires of a flex-start pool beyond check_capacity: a max_run_duration of at most 7 days; for a TPU
    machine type, a cluster at GKE 1.33.0-gke.1712000 or later and a zone where flex-start offers the generation.
    Sources: GKE "About flex-start" (sim/gke_machines.py, FLEX_START_*). GKE's texts for these refusals are not quoted
    in any source found: every message here is (wording ours)."""
    config = pool.get("config") or {}
    if not config.get("flex_start"):
        return
    name = pool.get("name")
    run_seconds = _duration_seconds(config.get("max_run_duration"))
    if run_seconds > FLEX_START_MAX_RUN_SECONDS:
        raise invalid_argument(
            f'Node pool "{name}": max_run_duration {run_seconds:g}s exceeds the flex-start limit of 7 days '
            f"({FLEX_START_MAX_RUN_SECONDS}s)."
        )
    mt = MACHINE_TYPES.get(config.get("machine_type") or "")
    if mt is None or not mt.tpu_generation:
        return
    version = cluster_version(cluster)
    if _version_key(version) < _version_key(FLEX_START_TPU_MIN_VERSION):
        raise invalid_argument(
            f'Node pool "{name}": flex-start with TPUs requires GKE version {FLEX_START_TPU_MIN_VERSION} or later; '
            f"the cluster runs {version}."
        )
    offered = FLEX_START_TPU_ZONES.get(mt.tpu_generation, frozenset())
    for zone in pool_zones(cluster, pool, region):
        if zone not in offered:
            raise invalid_argument(
                f'Node pool "{name}": flex-start does not offer machine type "{mt.name}" in zone "{zone}"; it is '
                f"offered in {', '.join(sorted(offered)) or 'no zone'}."
            )


def check_workload_metadata(cluster: dict, pool: dict) -> None:
    """workload_metadata_config.mode GKE_METADATA needs Workload Identity on the cluster.
    Source: GKE API reference WorkloadMetadataConfig.Mode GKE_METADATA ("Run the GKE Metadata Server on this
    node ... This feature can only be enabled if Workload Identity is enabled at the cluster level.")
    https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/NodeConfig#mode
    """
    config = pool.get("config") or {}
    mode = (config.get("workload_metadata_config") or {}).get("mode") or "MODE_UNSPECIFIED"
    pool_id = (cluster.get("workload_identity_config") or {}).get("workload_pool") or ""
    if mode == "GKE_METADATA" and not pool_id:
        raise invalid_argument(
            "Workload Identity must be enabled on the cluster to use GKE_METADATA workload metadata mode "
            f'(node pool "{pool.get("name")}").'
        )  # (wording ours)


#: Source: GKE API reference NodeConfig.metadata (https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/NodeConfig):
#: "Keys must conform to the regexp [a-zA-Z0-9-_]+ and be less than 128 bytes in length ... keys must not
#: conflict with any other metadata keys for the project or be one of the reserved keys" (the list below);
#: "each value's size must be less than or equal to 32 KB. The total size of all keys and values must be
#: less than 512 KB."
RESERVED_METADATA_KEYS = {
    "cluster-location",
    "cluster-name",
    "cluster-uid",
    "configure-sh",
    "containerd-configure-sh",
    "enable-os-login",
    "gci-ensure-gke-docker",
    "gci-metrics-enabled",
    "gci-update-strategy",
    "instance-template",
    "kube-env",
    "startup-script",
    "user-data",
    "disable-address-manager",
    "windows-startup-script-ps1",
    "common-psm1",
    "k8s-node-setup-psm1",
    "install-ssh-psm1",
    "user-profile-psm1",
}
_METADATA_KEY = re.compile(r"[a-zA-Z0-9_-]+")


def check_node_metadata(pool: dict) -> None:
    metadata = (pool.get("config") or {}).get("metadata") or {}
    for key, value in metadata.items():
        if key in RESERVED_METADATA_KEYS:
            raise invalid_argument(
                f'Node pool "{pool.get("name")}": metadata key "{key}" is reserved.'
            )  # (wording ours)
        if not _METADATA_KEY.fullmatch(key) or len(key.encode()) >= 128:
            raise invalid_argument(
                f'Node pool "{pool.get("name")}": metadata key "{key}" must match [a-zA-Z0-9-_]+ and be '
                "less than 128 bytes."
            )  # (wording ours)
        if len(str(value).encode()) > 32 * 1024:
            raise invalid_argument(f'Node pool "{pool.get("name")}": the value of metadata key "{key}" exceeds 32 KB.')
    if sum(len(k.encode()) + len(str(v).encode()) for k, v in metadata.items()) >= 512 * 1024:
        raise invalid_argument(f'Node pool "{pool.get("name")}": metadata exceeds 512 KB in total.')


def check_node_pool(
    cluster: dict,
    pool: dict,
    region: str,
    project: str,
    reservations: dict[str, frozenset[str]],
    default_disk: str = DEFAULT_BOOT_DISK,
) -> None:
    """Every per-pool rule, in the order GKE's validation is likely to meet them."""
    check_node_pool_name(pool.get("name") or "")
    machine_type = (pool.get("config") or {}).get("machine_type")
    if machine_type:
        machine(machine_type)
    check_pool_locations(region, pool)
    check_machine_zones(cluster, pool, region)
    check_management_with_release_channel(cluster, pool)
    check_workload_metadata(cluster, pool)
    check_node_metadata(pool)
    check_disk_type(pool, default_disk)
    check_gvnic(pool)
    check_tpu_slice(pool)
    check_capacity(pool)
    check_flex_start_tpu(cluster, pool, region)
    check_reservation_affinity(pool, project, reservations)


def check_cluster(
    cluster: dict,
    region: str,
    project: str,
    reservations: dict[str, frozenset[str]],
    default_disk: str = DEFAULT_BOOT_DISK,
) -> None:
    check_cluster_name(cluster.get("name") or "")
    names = [p.get("name") for p in cluster.get("node_pools") or []]
    for name in names:
        if names.count(name) > 1:
            raise invalid_argument(f'Node pool name "{name}" is used more than once.')  # (wording ours)
    if cluster.get("initial_node_count") and names:
        # Source: GKE API reference Cluster.initial_node_count ("... cannot be used together with node_pools").
        raise invalid_argument("Cannot specify both initial_node_count and node_pools.")  # (wording ours)
    for pool in cluster.get("node_pools") or []:
        check_node_pool(cluster, pool, region, project, reservations, default_disk)


# --------------------------------------------------------------------------------------------------------------
# Existence and concurrency
# --------------------------------------------------------------------------------------------------------------


#: The Compute Engine quota TPU node pools of a machine series consume (GKE "Troubleshoot TPUs in GKE": on-demand
#: and Spot TPU slice node pools need Compute Engine quota; Cloud TPU v6e: TPUS_PER_TPU_FAMILY; Compute Engine
#: region quotas: TPU_LITE_PODSLICE_V5).
TPU_QUOTA_METRICS = {
    "ct6e": "TPUS_PER_TPU_FAMILY",
    "ct5lp": "TPU_LITE_PODSLICE_V5",
    "ct5p": "TPU_V5P_PODSLICE",
    "ct4p": "TPU_V4_PODSLICE",
}


#: The machine families whose vCPUs draw the region's general CPUS quota; every other family has its own
#: ``<FAMILY>_CPUS`` (Compute Engine "Allocation quotas"). TPU hosts draw their chips' quota only.
GENERAL_CPU_FAMILIES = ("e2", "n1")


def quota_needs(cluster: dict, pool: dict, region: str) -> dict[str, float]:
    """What a pool's first nodes draw of the region's Compute Engine quotas, by metric: a TPU pool its chips (on
    demand: the family's metric; Spot and flex-start: its PREEMPTIBLE_ twin; a reservation: nothing, its VMs are
    reserved), a CPU pool its vCPUs, in every zone its nodes go to."""
    mt = machine((pool.get("config") or {}).get("machine_type", ""))
    nodes = int(pool.get("initial_node_count") or 0) * len(pool_zones(cluster, pool, region))
    if mt.tpu_chips:
        capacity = capacity_type_of(pool)
        if capacity == "reservation":
            return {}
        metric = TPU_QUOTA_METRICS.get(mt.family, "TPUS")
        metric = f"PREEMPTIBLE_{metric}" if capacity in ("spot", "flex_start") else metric
        # A flex-start pool starts empty; its slice draws the quota when GKE adds it.
        nodes = nodes or int((pool.get("autoscaling") or {}).get("max_node_count") or 0)
        return {metric: float(mt.tpu_chips * nodes)}
    metric = "CPUS" if mt.family in GENERAL_CPU_FAMILIES else f"{mt.family.upper()}_CPUS"
    return {metric: float(mt.vcpus * nodes)}


def check_quota(pool: dict, needs: dict[str, float], limits: dict[str, float], usage: dict[str, float], region: str):
    """GKE refuses at once a pool whose first nodes the region's quota cannot hold (403, :func:`quota_message`)."""
    for metric, need in needs.items():
        left = limits.get(metric, 0.0) - usage.get(metric, 0.0)
        if need > left:
            raise GkeError(
                "PERMISSION_DENIED", quota_message(pool, region, metric, need, limits.get(metric, 0.0), left)
            )


def quota_message(
    pool: dict,
    region: str,
    metric: str | None = None,
    need: float | None = None,
    limit: float = 0.0,
    left: float = 0.0,
) -> str:
    """GKE's answer to a node pool create beyond quota: 403 at once, in the form GKE gives for a regional
    quota (quoted in kaiwaehner/... issue 48: 'Error 403: (1) insufficient regional quota to satisfy request:
    resource "CPUS": request requires '72.0' and is short '48.0'. project has a quota of '24.0' with '24.0'
    available.'), here for the TPU family's quota the pool's chips count against. (wording after GKE's)"""
    mt = machine((pool.get("config") or {}).get("machine_type", ""))
    if need is None:  # the quota fault: none of the TPU family's quota
        need = float(
            mt.tpu_chips
            * int(pool.get("initial_node_count") or (pool.get("autoscaling") or {}).get("max_node_count") or 0)
        )
    metric = metric or TPU_QUOTA_METRICS.get(mt.family, "TPUS")
    left = max(0.0, left)
    return (
        f"Insufficient regional quota to satisfy request: resource \"{metric}\": request requires '{need:.1f}' "
        f"and is short '{need - left:.1f}'. project has a quota of '{limit:.1f}' with '{left:.1f}' available in "
        f"region {region}. View and manage quotas at https://console.cloud.google.com/iam-admin/quotas."
    )


def check_cluster_absent(name: str, project: str, location: str, existing: set[str]) -> None:
    """Source: GKE answers a duplicate create with 409 ALREADY_EXISTS, e.g. "Already exists:
    projects/P/locations/L/clusters/C." (google.api_core.exceptions.AlreadyExists, as the operators expect). Wording
    ours after GKE's."""
    if name in existing:
        raise GkeError("ALREADY_EXISTS", f"Already exists: projects/{project}/locations/{location}/clusters/{name}.")


def check_no_running_operation(cluster_name: str, running: list[dict], action: str, pool: str | None = None) -> None:
    """An operation GKE refuses because another one runs: a node pool's second operation, any operation while
    a cluster-level one runs, a cluster-level one while any runs. Pool operations on different pools run side
    by side. Sources: GKE "Add and manage node pools" ("You can manually create, update, or delete a node pool
    while another node pool is already being created, updated, or deleted."); GKE "Troubleshoot concurrent
    operations" ("In general, GKE only allows one cluster-level operation, or one operation per node pool, to
    run at the same time", with the errors "Cluster is running incompatible operation OPERATION_NAME" and
    "Operation OPERATION_NAME is currently ACTIONING cluster CLUSTER_NAME. Please wait and try again once it
    is done"); 400 FAILED_PRECONDITION as in hashicorp/terraform-provider-google issue 10366.
    ``running``: the cluster's unfinished operations, dicts with name, operation_type and pool (None for a
    cluster-level one); ``pool``: the pool the refused operation would act on (None: the cluster).
    """
    blocking = [op for op in running if pool is None or op.get("pool") in (None, pool)]
    if not blocking:
        return
    op = blocking[0]
    verb = {
        "CREATE_CLUSTER": "creating cluster",
        "DELETE_CLUSTER": "deleting cluster",
        "CREATE_NODE_POOL": "creating a node pool for cluster",
        "DELETE_NODE_POOL": "deleting a node pool for cluster",
    }.get(op.get("operation_type"), "upgrading cluster")
    # GKE's own upgrade of the control plane: "Operation operation-... is currently upgrading cluster C. Please wait
    # and try again once it is done." (terraform-provider-google issue 3650).
    if op.get("operation_type") in ("CREATE_NODE_POOL", "DELETE_NODE_POOL", "UPGRADE_MASTER"):
        raise GkeError(
            "FAILED_PRECONDITION",
            f"Operation {op['name']} is currently {verb} {cluster_name}. Please wait and try again once it is done.",
        )
    raise GkeError("FAILED_PRECONDITION", f"Cluster is running incompatible operation {op['name']}.")


#: How many operations GKE runs at once on one cluster: "Error 429: Too many operations: cluster "X" hits the
#: concurrent operations quota 5, please try again later." (terraform-provider-google issues 15205 and 15579;
#: magic-modules PR 8828 made Terraform retry it). GKE does not document the figure.
CONCURRENT_OPERATIONS = 5


def check_concurrent_operations(cluster_name: str, running: list[dict]) -> None:
    """An operation beyond the cluster's concurrent operations: 429 RESOURCE_EXHAUSTED (gRPC's code for HTTP 429),
    cleared by waiting. ``running``: as for :func:`check_no_running_operation`."""
    if len(running) >= CONCURRENT_OPERATIONS:
        raise GkeError(
            "RESOURCE_EXHAUSTED",
            f'Too many operations: cluster "{cluster_name}" hits the concurrent operations quota '
            f"{CONCURRENT_OPERATIONS}, please try again later.",
        )


def request_rate_message(project_number: str) -> str:
    """GKE's 429 for a project over its API requests per minute (GKE "Quotas and limits": 3000 a minute;
    terraform-provider-google issue 3782 shows a 429 "quota exceeded"; this wording is Google APIs' per-minute
    request quota error, the metric and limit named as container.googleapis.com names them: wording ours)."""
    return (
        "Quota exceeded for quota metric 'Requests' and limit 'Requests per minute' of service "
        f"'container.googleapis.com' for consumer 'project_number:{project_number}'."
    )


def check_node_pool_absent(cluster_name: str, pool_name: str, existing: set[str]) -> None:
    """Source: as check_cluster_absent: a second pool of the same name answers 409 ALREADY_EXISTS."""
    if pool_name in existing:
        raise GkeError("ALREADY_EXISTS", f'Already exists: node pool "{pool_name}" in cluster "{cluster_name}".')
