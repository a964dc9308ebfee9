"""GKE request bodies (``google.cloud.container_v1`` JSON) for the cluster and its node pools.

They follow the tutorial's blueprint (``gke-tpu-v6e-advanced.yaml``): a system pool, a CPU pool for the
Pathways head and the conversions, and one TPU node pool per slice with a compact placement.
Each carries the run key as a resource label: teardown deletes only what its own run created; in a named Airflow
environment also the environment (``tpu_rl.environment``), which the reaper and the leases read.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Any

from tpu_rl.candidates import Candidate
from tpu_rl.capacity import CAPACITY
from tpu_rl.config import RunConfig
from tpu_rl.environment import label_value
from tpu_rl.leases import cluster_lease_object
from tpu_rl.machines import needs_hyperdisk
from tpu_rl.run import RunIdentity
from tpu_rl.timestamps import parse_time
from tpu_rl.vocabulary import (
    GKE_LABEL_ENVIRONMENT,
    GKE_LABEL_KEEP,
    GKE_LABEL_RUN_KEY,
    GKE_LABEL_SHARED,
    GKE_METADATA_DAG_ID,
    GKE_METADATA_ENVIRONMENT,
    GKE_METADATA_RUN_ID,
    TPU_TAINT_KEY,
)

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
SYSTEM_POOL = "system"
SYSTEM_MACHINE_TYPE = "n2-standard-8"
#: A node upgrade recreates the slice's hosts mid-run. GKE refuses to turn auto-upgrade off on a
#: release-channel cluster ("Auto_upgrade cannot be false when release_channel REGULAR is set"), so, as
#: Cluster Toolkit's gke-tpu-v6e blueprints do (``maintenance_exclusions``: scope NO_MINOR_OR_NODE_UPGRADES,
#: ``exclusion_end_time_behavior: UNTIL_END_OF_SUPPORT``), the cluster holds node and minor upgrades off until
#: its version's end of support (control-plane patches still apply): a shared or kept cluster outlives any
#: fixed end date.
UPGRADE_EXCLUSION = "tpu-rl-no-node-upgrades"
#: The daily maintenance window's start (GMT): Cluster Toolkit's gke-cluster module always sets one
#: (``daily_maintenance_window``, variable ``maintenance_start_time``, default "09:00").
MAINTENANCE_START = "09:00"


def cluster_body(config: RunConfig, run: RunIdentity, now: datetime) -> dict[str, Any]:
    """The cluster create request; ``now`` (UTC) starts the upgrade exclusion."""
    pools = [system_pool(config), cpu_pool(config)]
    if config.tpu_pools_with_cluster:
        pools += [tpu_node_pool(config, run, i) for i in range(config.cluster_nodepool_count)]
    labels = {
        **owner_labels(run),
        **({GKE_LABEL_KEEP: "true"} if config.keep_cluster else {}),
        **({GKE_LABEL_SHARED: "true"} if config.shares_cluster else {}),
    }
    body = {
        "name": config.cluster_name,
        "description": owner_description(run, shared_lease_uri(config) if config.shares_cluster else None),
        "resource_labels": labels,
        "release_channel": {"channel": "REGULAR"},
        "maintenance_policy": {
            "window": {
                "daily_maintenance_window": {"start_time": MAINTENANCE_START},
                "maintenance_exclusions": {UPGRADE_EXCLUSION: _upgrade_exclusion(now)},
            }
        },
        "workload_identity_config": {"workload_pool": f"{config.project}.svc.id.goog"},
        "addons_config": {"gcs_fuse_csi_driver_config": {"enabled": True}},
        "network_config": {"datapath_provider": "ADVANCED_DATAPATH"},
        "ip_allocation_policy": {"use_ip_aliases": True},
        "master_authorized_networks_config": {
            "enabled": True,
            "cidr_blocks": [{"display_name": "authorized", "cidr_block": config.authorized_cidr}],
        },
        "node_pools": pools,
    }
    if config.uses_dns_endpoint:
        # GKE's DNS-based endpoint (gcloud --enable-dns-access): reached from anywhere Google's APIs are,
        # with IAM (container.clusters.connect) instead of an IP allow-list; the authorized networks above
        # gate only the IP endpoint. Cloud Composer 3 has no fixed egress address to allow-list.
        body["control_plane_endpoints_config"] = {"dns_endpoint_config": {"allow_external_traffic": True}}
    return body


_OWNER = re.compile(
    r"Created by tpu-rl for the Airflow DAG run (?P<dag_id>\S+) / (?P<run_id>\S+?)"
    r"(?: of the Airflow environment (?P<environment>.+?))?\."
    r"(?: Shared by the runs of the lease (?P<lease>gs://\S+)\.)?"
)


def owner_labels(run: RunIdentity) -> dict[str, str]:
    """The resource labels that tie a cluster or a TPU pool to its run: its key, and its named environment."""
    environment = {GKE_LABEL_ENVIRONMENT: label_value(run.environment)} if run.environment else {}
    return {GKE_LABEL_RUN_KEY: run.key, **environment}


def owner_description(run: RunIdentity, lease_uri: str | None = None) -> str:
    """The cluster's description: who created it, in full (resource labels hold only the run key and a label-safe
    environment), and for a shared cluster where its lease is (a label value cannot hold a bucket name with dots)."""
    environment = f" of the Airflow environment {run.environment}" if run.environment else ""
    shared = f" Shared by the runs of the lease {lease_uri}." if lease_uri else ""
    return f"Created by tpu-rl for the Airflow DAG run {run.dag_id} / {run.run_id}{environment}.{shared}"


def cluster_owner(description: str) -> RunIdentity | None:
    """The run that created a cluster, from its description; None for a cluster this package did not create."""
    match = _OWNER.fullmatch(description or "")
    return RunIdentity(match["dag_id"], match["run_id"], environment=match["environment"] or "") if match else None


def shared_lease_uri(config: RunConfig) -> str:
    """Where the runs sharing the config's cluster keep its lease: the run's bucket."""
    return f"gs://{config.gcs_bucket}/{cluster_lease_object(config.project, config.region, config.cluster_name)}"


def cluster_lease_uri(description: str) -> str | None:
    """The lease a shared cluster was created with, from its description (None: not recorded)."""
    match = _OWNER.fullmatch(description or "")
    return match["lease"] if match else None


def pool_owner(node_metadata: dict[str, str]) -> RunIdentity | None:
    """The run that created a node pool, from its nodes' metadata (``config.metadata``)."""
    if GKE_METADATA_DAG_ID in node_metadata and GKE_METADATA_RUN_ID in node_metadata:
        return RunIdentity(
            node_metadata[GKE_METADATA_DAG_ID],
            node_metadata[GKE_METADATA_RUN_ID],
            environment=node_metadata.get(GKE_METADATA_ENVIRONMENT, ""),
        )
    return None


def _upgrade_exclusion(now: datetime) -> dict[str, Any]:
    """From ``now`` until the end of support of the cluster's version; no end_time (Cluster Toolkit's module
    requires exactly one of end_time and the end-time behavior)."""
    return {
        "start_time": now.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "maintenance_exclusion_options": {
            "scope": "NO_MINOR_OR_NODE_UPGRADES",
            "end_time_behavior": "UNTIL_END_OF_SUPPORT",
        },
    }


def _node_config(config: RunConfig, machine_type: str, run: RunIdentity | None = None, **extra: Any) -> dict[str, Any]:
    node_config: dict[str, Any] = {
        "machine_type": machine_type,
        "oauth_scopes": [CLOUD_PLATFORM_SCOPE],
        "workload_metadata_config": {"mode": "GKE_METADATA"},
        # gVNIC on every pool, as Cluster Toolkit sets it on its system, CPU and TPU pools (gke-node-pool and
        # gke-cluster: ``gvnic { enabled = image_type == "COS_CONTAINERD" }``, the default image) and xpk on
        # every slice pool (``--enable-gvnic``); C4D machines have no other NIC.
        "gvnic": {"enabled": True},
        **extra,
    }
    if needs_hyperdisk(machine_type):  # C4, C4D, N4 and TPU v6e hosts boot only from Hyperdisk
        node_config["disk_type"] = "hyperdisk-balanced"
    if config.node_service_account:
        node_config["service_account"] = config.node_service_account
    if run is not None:
        node_config["resource_labels"] = owner_labels(run)
        node_config["metadata"] = {GKE_METADATA_DAG_ID: run.dag_id, GKE_METADATA_RUN_ID: run.run_id}
        if run.environment:
            node_config["metadata"][GKE_METADATA_ENVIRONMENT] = run.environment
    return node_config


def system_pool(config: RunConfig) -> dict[str, Any]:
    return {
        "name": SYSTEM_POOL,
        "initial_node_count": 1,
        "config": _node_config(config, SYSTEM_MACHINE_TYPE),
        "autoscaling": {"enabled": True, "min_node_count": 1, "max_node_count": 5},
    }


def cpu_pool(config: RunConfig) -> dict[str, Any]:
    """Runs the Pathways head and the conversions; its boot disk holds a conversion's ~62 GB download."""
    return {
        "name": config.cpu_pool_name,
        "initial_node_count": 1,
        "locations": [config.zone],
        "config": _node_config(config, config.pw_cpu_machine_type, disk_size_gb=config.cpu_pool_disk_gb),
        "autoscaling": {"enabled": True, "min_node_count": 0, "max_node_count": config.cpu_pool_max_nodes},
    }


def tpu_node_pool(
    config: RunConfig, run: RunIdentity, slice_index: int, candidate: Candidate | None = None
) -> dict[str, Any]:
    """A slice's pool on ``candidate`` (default: the run's first): in its zone, with its capacity type's fields. The
    cluster is regional and created without ``locations``, so a pool may name any zone of the region (API reference
    ``NodePool.locations``: "If this value is unspecified during node pool creation, the Cluster.Locations value
    will be used"; Terraform's ``google_container_node_pool.node_locations``: "Nodes must be in the region of their
    regional cluster")."""
    on = config.on_candidate(candidate or config.candidates[0])
    pool: dict[str, Any] = {
        "name": run.tpu_pool_name(slice_index) if config.tpu_pools_per_run else f"tpu-slice-{slice_index}",
        "initial_node_count": config.hosts_per_slice,
        "locations": [on.zone],
        "config": _node_config(
            config,
            config.compute_type,
            run,
            disk_size_gb=100,
            taints=[{"key": TPU_TAINT_KEY, "value": "present", "effect": "NO_SCHEDULE"}],
        ),
        "placement_policy": {"type": "COMPACT", "tpu_topology": config.topology},
        # Both stay on: GKE refuses auto-upgrade off on a release-channel cluster; the cluster's maintenance
        # exclusion (UPGRADE_EXCLUSION) keeps upgrades from recreating the slice.
        "management": {"auto_repair": True, "auto_upgrade": True},
    }
    CAPACITY[on.capacity_type].apply(on, pool)
    return pool


def capacity_fields(config: RunConfig, candidate: Candidate | None = None) -> str:
    """What a candidate's capacity type (default: the run's first) sets in each TPU pool request, for the plan's
    reader."""
    on = config.on_candidate(candidate or config.candidates[0])
    return CAPACITY[on.capacity_type].fields(on)


def candidate_fields(pool: dict[str, Any]) -> tuple[tuple[str, ...], bool, bool, tuple[str, ...]]:
    """What tells the pools of two capacity candidates apart, in a pool request or in GKE's pool read back as
    one: its zones, Spot, flex-start and the reservation it consumes."""
    config = pool.get("config") or {}
    affinity = config.get("reservation_affinity") or {}
    return (
        tuple(pool.get("locations") or ()),
        bool(config.get("spot")),
        bool(config.get("flex_start")),
        tuple(affinity.get("values") or ()),
    )


#: Words of a GKE message (an operation's error, a node pool's condition) that say the zone has no
#: capacity now, as opposed to a request that is wrong.
_NO_CAPACITY = (
    "stockout",
    "resource_exhausted",
    "resource pool exhausted",
    "resource_pool_exhausted",
    "insufficient capacity",
    "does not have enough resources",
)


#: GKE's words for refusals that say "quota" but clear by waiting: its limit of concurrent operations on a cluster
#: (429 "Too many operations: cluster "X" hits the concurrent operations quota 5, please try again later") and of
#: API requests per project (429 "Quota exceeded for quota metric 'Requests' ..."); terraform-provider-google
#: issues 15205, 15579, 3782 (magic-modules PR 8828 made Terraform retry the first).
_THROTTLING = ("too many operations", "concurrent operations quota", "quota metric 'requests'", "ratelimitexceeded")
#: How many operations GKE runs at once on one cluster (the 429 above names 5; GKE does not document it).
CLUSTER_OPERATIONS_LIMIT = 5


class Refusal(StrEnum):
    """Why GKE refused a request at once, as the pipeline acts on it."""

    #: The project lacks Compute Engine quota: no wait brings it; the run fails naming the quota.
    QUOTA = "quota"
    #: The capacity the request names is not there now: a specific reservation with too few free VMs (429
    #: "Reservation does not have enough resources for the request: specific reservation "R" is insufficient for
    #: node pool "P" at zone "Z": required 1 and short of 1 VM count of machine type M.", quoted in
    #: GoogleCloudPlatform/gsutil issue 1000). Read as a stockout: it may free up, within the candidate's wait.
    CAPACITY = "capacity"
    #: Too many operations on the cluster, or requests from the project: waiting clears it.
    THROTTLED = "throttled"
    #: Another operation runs on the cluster or the pool (one of the run's, or GKE's own: a control-plane upgrade,
    #: an auto-repair): it is waited for.
    BUSY = "busy"
    #: The caller's identity lacks an IAM permission, or may not act as the nodes' service account: no wait grants
    #: it; the run fails naming the permission and the role that holds it (:func:`permission_fix`).
    PERMISSION = "permission"


def refusal(status: str, message: str) -> Refusal | None:
    """How to read GKE's refusal of a request, by its status (the gRPC code's name) first and its words only where one
    status has several meanings: RESOURCE_EXHAUSTED (HTTP 429) is throttling unless it names Compute Engine
    quota or capacity that is not there (a reservation too small); FAILED_PRECONDITION is another operation
    running (GKE "Troubleshoot concurrent operations": "Cluster is running incompatible operation", "Operation
    ... is currently upgrading cluster"); PERMISSION_DENIED (403) with quota's words is quota ("Insufficient
    regional quota to satisfy request"), any other 403 is IAM, as is the 400 GKE answers for nodes whose service
    account the caller may not act as. None: any other refusal, which is the caller's to report."""
    if status == "RESOURCE_EXHAUSTED":
        if is_quota_error(message):
            return Refusal.QUOTA
        return Refusal.CAPACITY if is_capacity_error(message) else Refusal.THROTTLED
    if status == "FAILED_PRECONDITION":
        return Refusal.BUSY
    if status == "PERMISSION_DENIED":
        return Refusal.QUOTA if is_quota_error(message) else Refusal.PERMISSION
    if status == "INVALID_ARGUMENT" and _NO_ACT_AS.search(message):
        return Refusal.PERMISSION
    return None


#: GKE's words for a missing permission: ``Required "container.clusters.create" permission(s) for "projects/P/..."``
#: (403, ErrorInfo IAM_PERMISSION_DENIED; quoted in 2i2c-org/infrastructure issue 488, pulumi/examples issue 150), and
#: the form other Google APIs use, ``Permission 'container.clusters.list' denied on resource '...'``.
_PERMISSION_NAMED = re.compile(r"""Required "(?P<required>[\w.]+)" permission|Permission '(?P<denied>[\w.]+)' denied""")
#: GKE's words when a create names nodes' service account the caller may not act as (HTTP 400: ``The user does not
#: have access to service account "X". Ask a project owner to grant you the iam.serviceAccountUser role on the service
#: account.``, as ``gcloud container node-pools create`` shows it).
_NO_ACT_AS = re.compile(r'does not have access to service account "(?P<account>[^"]+)"')
#: The role docs/getting-started/composer.md grants for each permission GKE may refuse the pipeline or the reaper (IAM's
#: role reference: roles/container.admin holds ``container.*``, roles/iam.serviceAccountUser iam.serviceAccounts.actAs).
PERMISSION_ROLES = {"container.": "roles/container.admin", "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser"}


def iam_permission(message: str) -> str | None:
    """The IAM permission a refusal names in Google's words (None: it names none, as Kubernetes RBAC's 403 does)."""
    match = _PERMISSION_NAMED.search(message)
    return (match["required"] or match["denied"]) if match else None


def permission_fix(message: str, project: str) -> str:
    """What to grant when GKE refuses a call for IAM: the permission GKE named and the documented role that holds
    it, on the resource it is granted on (the node account for actAs, else the project)."""
    where = "docs/getting-started/composer.md, '1. Identities and the roles each one uses'"
    if match := _NO_ACT_AS.search(message):
        return (
            f"fix: the identity of the Airflow connection lacks iam.serviceAccounts.actAs on the nodes' service "
            f"account {match['account']}: grant it roles/iam.serviceAccountUser on that account ({where}); "
            "waiting does not help"
        )
    permission = iam_permission(message)
    if permission is None:
        return f"fix: the identity of the Airflow connection may not make this call in project {project} ({where})"
    role = next((r for prefix, r in PERMISSION_ROLES.items() if permission.startswith(prefix)), "a role holding it")
    return (
        f"fix: the identity of the Airflow connection lacks permission {permission} in project {project}: grant it "
        f"{role} there ({where}); waiting does not help"
    )


def is_quota_error(message: str) -> bool:
    """Whether GKE's message says the project lacks quota: GKE answers a create beyond quota at once with 403
    "Insufficient regional quota to satisfy request: resource ..." or names it as Compute Engine does
    ("Quota 'TPUS_PER_TPU_FAMILY' exceeded"); a pool's condition says GCE_QUOTA_EXCEEDED. RESOURCE_EXHAUSTED
    alone may be either quota or capacity: only these words tell quota apart, and GKE's throttling
    (:data:`_THROTTLING`) says "quota" too without being one."""
    lowered = message.lower()
    if any(words in lowered for words in _THROTTLING):
        return False
    return "quota" in lowered or "gce_quota_exceeded" in lowered


def is_capacity_error(message: str) -> bool:
    """Whether GKE's message says the zone has no capacity now (and not that quota is short)."""
    return not is_quota_error(message) and any(word in message.lower() for word in _NO_CAPACITY)


def quota_reason(conditions: list[dict[str, Any]]) -> str | None:
    """GKE's message when a node pool's ``conditions`` say quota is short (StatusCondition code
    GCE_QUOTA_EXCEEDED: "Google Compute Engine quota was exceeded"); None otherwise."""
    for condition in conditions:
        if condition.get("code") == "GCE_QUOTA_EXCEEDED" or is_quota_error(condition.get("message") or ""):
            return condition.get("message") or "GCE_QUOTA_EXCEEDED"
    return None


def capacity_wait_reason(conditions: list[dict[str, Any]]) -> str | None:
    """Why a node pool that is still being created waits for capacity, from its ``conditions`` (GKE API
    reference StatusCondition: code GCE_STOCKOUT "indicates that Google Compute Engine resources are
    temporarily unavailable"; canonical_code RESOURCE_EXHAUSTED, unless it is quota); None when nothing says so."""
    if quota_reason(conditions) is not None:
        return None
    for condition in conditions:
        if (
            condition.get("code") == "GCE_STOCKOUT"
            or condition.get("canonical_code") == "RESOURCE_EXHAUSTED"
            or is_capacity_error(condition.get("message") or "")
        ):
            return condition.get("message") or condition.get("code") or "no capacity"
    return None


#: The Compute Engine quota that on-demand and Spot TPU node pools of a generation consume (GKE's "Troubleshoot
#: TPUs in GKE": TPU slice node pools use Compute Engine API quota, not the Cloud TPU API's; Cloud TPU's v6e
#: page: "Verify that your project has enough TPUS_PER_TPU_FAMILY quota"; the Compute Engine region quotas
#: name v5e's TPU_LITE_PODSLICE_V5 and PREEMPTIBLE_TPU_LITE_PODSLICE_V5).
TPU_QUOTAS = {
    "v6e": ("TPUS_PER_TPU_FAMILY (dimension tpu_family CT6E)", "the preemptible TPU v6e quota"),
    "v5litepod": ("TPU_LITE_PODSLICE_V5", "PREEMPTIBLE_TPU_LITE_PODSLICE_V5"),
    "v5p": ("the TPU v5p chips quota", "the preemptible TPU v5p chips quota"),
    "v4": ("the TPU v4 pod slice quota", "the preemptible TPU v4 pod slice quota"),
}
#: The metric of each of those quotas that Compute Engine's region quotas (``regions.get``) name, by (generation,
#: preemptible): only those the sources above name; the preflight warns that it cannot check the others.
TPU_QUOTA_METRICS = {
    ("v6e", False): "TPUS_PER_TPU_FAMILY",
    ("v5litepod", False): "TPU_LITE_PODSLICE_V5",
    ("v5litepod", True): "PREEMPTIBLE_TPU_LITE_PODSLICE_V5",
}


#: The quota a refusal names: GKE's own form (``Insufficient regional quota to satisfy request: resource "CPUS":
#: ...``) or Compute Engine's (``Quota 'IN_USE_ADDRESSES' exceeded. Limit: 8.0 in region us-east5.``).
_QUOTA_NAMED = re.compile(r"""resource "(?P<resource>[A-Z0-9_]+)"|Quota '(?P<quota>[A-Z0-9_]+)' exceeded""")
#: What a run's cluster draws of the quotas that are not TPU chips (GKE "Quotas and limits"; docs/how-to/capacity.md,
#: "Quotas a run needs"), by the start of the metric's name.
OTHER_QUOTAS = {
    "IN_USE_ADDRESSES": "in-use IP addresses: one per node with a public IP (a v6e-64 run's about 20)",
    "CPUS": "vCPUs: the system pool's and the CPU pool's machines (a project on the default regional CPU quota "
    "may also hold at most three GKE clusters per region)",
    "N2_CPUS": "N2 vCPUs: the system pool's machines",
    "C4D_CPUS": "C4D vCPUs: the CPU pool's machines (pw_cpu_machine_type)",
    "HYPERDISK": "Hyperdisk: the boot disks of C4D and TPU v6e machines, which take only Hyperdisk",
    "SSD_TOTAL_GB": "SSD persistent disk: the nodes' boot disks",
}


def quota_named(message: str) -> str | None:
    """The quota metric GKE's refusal names (None: it names none)."""
    match = _QUOTA_NAMED.search(message)
    return (match["resource"] or match["quota"]) if match else None


def quota_hint(config: RunConfig, message: str = "") -> str:
    """What to ask for when GKE refuses a TPU pool for quota: the quota GKE named, or the TPU chips'."""
    named = quota_named(message)
    if named and "TPU" not in named:
        what = next((text for prefix, text in OTHER_QUOTAS.items() if named.startswith(prefix)), "")
        return (
            f"fix: the project lacks Compute Engine quota {named} in {config.region}"
            + (f" ({what})" if what else "")
            + ", not TPU chips. Request it on the Quotas page (IAM & Admin > Quotas & System Limits, service Compute "
            "Engine API); docs/how-to/capacity.md, 'Quotas a run needs', lists what a run draws. Waiting does not "
            "help: capacity_wait_minutes does not apply"
        )
    standard, preemptible = TPU_QUOTAS.get(config.slice.generation.name, ("the TPU quota", "the preemptible TPU quota"))
    quota = preemptible if CAPACITY[config.capacity_type].preemptible else standard
    return (
        f"fix: the project lacks Compute Engine quota for {config.chips} "
        f"{config.tpu_type} chips in {config.region}: {quota}. GKE's TPU node pools use Compute Engine quota "
        "(compute.googleapis.com), not the Cloud TPU API's (tpu.googleapis.com). Request it on the Quotas page "
        "(IAM & Admin > Quotas & System Limits, service Compute Engine API; for v6e, Cloud TPU's page says to "
        "contact Google Cloud support), or use capacity_type 'reservation': a reservation's chips need no quota. "
        "Waiting does not help: capacity_wait_minutes does not apply"
    )


_TARGET = re.compile(
    r"/(?:locations|zones)/[^/]+/clusters/(?P<cluster>[^/]+)"
    r"(?:/nodePools/(?P<pool>[^/]+))?(?:/node/[^/]+)?$"
)


def operation_target(target_link: str) -> tuple[str, str | None] | None:
    """(cluster, node pool or None) an operation acts on, from its ``target_link``; None for another target.

    Only the location-relative part is read: GKE's operation links name the project by number
    (``https://container.googleapis.com/v1/projects/123/locations/us-central1/clusters/c``, API reference
    Operation.target_link), where the run knows its project by id; a link may say ``zones`` for
    ``locations``, and a node pool repair targets one of its nodes (``.../nodePools/p/node/n``)."""
    match = _TARGET.search(target_link)
    return (match["cluster"], match["pool"]) if match else None


def cluster_parent(config: RunConfig) -> str:
    return f"projects/{config.project}/locations/{config.region}"


def cluster_path(config: RunConfig) -> str:
    return f"{cluster_parent(config)}/clusters/{config.cluster_name}"


def slice_times(operations: list[dict[str, Any]], pools: list[str]) -> list[dict[str, str]]:
    """When each pool of ``pools`` had its slice, from GKE's operations on them, each given as ``type``
    (``CREATE_NODE_POOL``, ``DELETE_NODE_POOL``), ``pool``, ``end`` (RFC 3339) and ``failed``: its nodes are
    whole when a successful create ended (a flex-start pool gets its nodes later: an upper bound) and gone when
    the delete after it ended. A pool created and deleted twice (moved to another capacity candidate) had two
    slices; a create without a delete after it is left out (the slice is still there); a failed create had none.

    Returns ``pool``, ``nodes_from`` and ``nodes_gone`` (ISO 8601, UTC) per slice, in the order of ``pools``,
    oldest first.
    """
    times = []
    for pool in pools:
        ended = sorted(
            (parse_time(op["end"]), op["type"])
            for op in operations
            if op["pool"] == pool and op["end"] and not (op["type"] == "CREATE_NODE_POOL" and op["failed"])
        )
        created = None
        for end, kind in ended:
            if kind == "CREATE_NODE_POOL":
                created = end
            elif created is not None:
                times.append({"pool": pool, "nodes_from": created.isoformat(), "nodes_gone": end.isoformat()})
                created = None
    return times
