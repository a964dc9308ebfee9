"""GKE API emulator: google.container.v1.ClusterManager over gRPC/TLS, reached by the real clients unmodified.

    gke_emulator.py init    writes $SIM/gke/service-account.json (a fresh RSA key) if missing
    gke_emulator.py         runs the emulator (sim/up.sh starts it as component `gke`)

One process, four listeners, all on 127.0.0.1:
  proxy  (TPU_RL_SIM_GKE_PROXY_PORT, 14480)  an HTTP CONNECT proxy: the clients run with
         grpc_proxy=http://127.0.0.1:<proxy>, so gRPC sends `CONNECT container.googleapis.com:443`; the
         proxy pipes that tunnel to the gRPC server below. The Kubernetes clients run with
         HTTPS_PROXY=<proxy> (NO_PROXY=127.0.0.1,localhost), so a cluster's DNS endpoint
         `CONNECT gke-<id>.<location>.gke.goog:443` goes to the DNS front end below. It answers 403 to any
         other host and never dials anything but its own ports on 127.0.0.1.
  grpc   (TPU_RL_SIM_GKE_GRPC_PORT, 14481)   the ClusterManager service, TLS with $SIM/pki/gke.crt
         (SAN DNS:container.googleapis.com, signed by the sim CA; clients trust it through
         GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=$SIM/pki/ca.crt).
  dns    (TPU_RL_SIM_GKE_DNS_PORT, 14483)    the clusters' DNS-based control-plane endpoints (sim/gke_dns.py):
         TLS with a certificate of the stand-in public CA, IAM-checked, joined to the cluster's apiserver.
  token  (TPU_RL_SIM_GKE_TOKEN_PORT, 14482)  the OAuth token endpoint named by the key file's token_uri
         (JWT-bearer grant, RS256 assertion verified against the key's public key); GET /healthz.

Authentication: every gRPC call needs `authorization: Bearer <token>` where the token is an access token
this emulator issued, or a self-signed JWT of a known service account (google-auth sends one on gRPC:
the generated clients set always_use_jwt_access, as Google's APIs accept). Else UNAUTHENTICATED.
Authorization: IAM as GKE checks it (sim/gke_iam.py): each method's permission in the request's project (403
PERMISSION_DENIED, GKE's words), actAs on the service account of nodes a create makes (GKE's 400), and
container.clusters.connect at a cluster's DNS endpoint, against $SIM/gke/iam.json (read on each request; written by
`init` with the roles docs/getting-started/composer.md grants).
Access tokens are deterministic per service account (HMAC of the account with a secret kept in
$SIM/gke/token-secret): a refresh returns the same token, so a control plane started before a refresh
keeps accepting it (the control planes get {token: client_email} at start).

State: $SIM/gke/state.json (clusters, node pools, operations, control-plane slots); reservations the
emulator knows: $SIM/gke/reservations.json (a JSON list of names or projects/P/reservations/N, or of
{"name": projects/OWNER/reservations/N, "shared_with": [projects], "vm_count": N}, N the VMs it holds; default
none); capacity faults:
$SIM/gke/faults.json (sim/gke_faults.py), read on each request. Durations:
TPU_RL_SIM_GKE_CLUSTER_CREATE_SECONDS (3, after the control plane is ready), _POOL_CREATE_SECONDS (3),
_DELETE_SECONDS (2), _PENDING_SECONDS (0.3), _STOCKOUT_SECONDS (10: GKE's ~35 minutes of retrying a create for
capacity, time-scaled). See docs/explanation/simulation.md.

Split by job: this file holds the ClusterManager methods (each request parsed, checked and turned into an
operation) and the entry point; sim/gke_project.py the emulated project (its state, operations and their work);
sim/gke_settings.py its files, ports and durations; sim/gke_auth.py the keys, tokens and token endpoint;
sim/gke_transport.py the gRPC server and the CONNECT proxy; sim/gke_dns.py the DNS endpoints; sim/gke_iam.py who may
do what; sim/gke_nodes.py the
nodes a pool registers; sim/gke_rules.py and sim/gke_machines.py what GKE refuses (sim/gke_errors.py: how).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import uuid

from . import compute_api, gke_dns, gke_iam, gke_rules
from .gke_auth import init_files, serve_tokens
from .gke_errors import GkeError
from .gke_project import Project, as_dict, held_seconds, now_iso, take_fault
from .gke_settings import (
    COMPUTE_PORT,
    DEFAULT_BOOT_DISK,
    DNS_PORT,
    GKE_DIR,
    GRPC_PORT,
    HOST,
    PKI,
    PROJECT,
    PROXY_PORT,
    TOKEN_PORT,
    read_json,
)
from .gke_transport import serve_grpc, serve_proxy

log = logging.getLogger("gke")


def reservations(project: str) -> dict[str, frozenset[str]]:
    """The reservations the emulator knows, with who may consume each (read on each request)."""
    return gke_rules.reservation_consumers(read_json(GKE_DIR / "reservations.json", []), project)


def region_limits(region: str) -> dict[str, float]:
    """The region's Compute Engine quota limits: $SIM/gke/quotas.json's, over the stand-in's defaults."""
    return {**compute_api.DEFAULT_QUOTAS, **(read_json(GKE_DIR / "quotas.json", {}).get(region) or {})}


def reservation_vm_counts(project: str) -> dict[str, int]:
    """The reservations the emulator knows that hold a fixed number of VMs (read on each request)."""
    return gke_rules.reservation_vm_counts(read_json(GKE_DIR / "reservations.json", []), project)


# ------------------------------------------------------------------------------------------------------------
# The ClusterManager methods
# ------------------------------------------------------------------------------------------------------------


class Emulator(Project):
    """The ClusterManager service over the emulated project: sim/gke_transport.py answers each RPC with the method
    of its name."""

    # --- IAM --------------------------------------------------------------------------------------------
    def authorize(self, method: str, req, caller: str) -> None:
        """GKE's IAM check of a call by ``caller``, before anything else is done with it (sim/gke_iam.py): the
        method's permission in the request's project, and for nodes it creates, actAs on their service account."""
        policy = gke_iam.read_policy(GKE_DIR / "iam.json")
        project, resource = iam_target(method, req)
        gke_iam.check(policy, caller, gke_iam.METHOD_PERMISSIONS[method], project, resource)
        if method == "CreateCluster":
            cluster = self.c.Cluster(req.cluster)
            pools = [as_dict(p) for p in cluster.node_pools] or [{"config": as_dict(cluster.node_config)}]
        elif method == "CreateNodePool":
            pools = [as_dict(self.c.NodePool(req.node_pool))]
        else:
            return
        gke_iam.check_act_as(policy, caller, gke_iam.node_accounts(pools, gke_rules.project_number(project)))

    def connect_refusal(self, route: gke_dns.Route, caller: str) -> str | None:
        """Why the DNS endpoint refuses ``caller`` the cluster behind ``route`` (None: it may connect). The body of
        the real endpoint's 403 is not published: the message is GKE API's for a missing permission."""
        policy = gke_iam.read_policy(GKE_DIR / "iam.json")
        try:
            gke_iam.check(policy, caller, gke_iam.CONNECT, route.project, route.cluster_path)
        except GkeError as refused:
            return refused.message
        return None

    # --- faults a request meets -------------------------------------------------------------------------
    def _refuse_for_faults(self, key, pool=""):
        """What the fault rules make GKE answer a request that changes the cluster ``key`` (its pool ``pool``):
        a 429 for the project's request rate ("throttle"), or GKE's own upgrade of the control plane started just
        before the request ("upgrade"), which the request's checks then refuse it for."""
        project, _, cluster = key.split("/")
        self._unavailable_for_faults(cluster, pool)
        if take_fault("throttle", pool, "", cluster):
            raise GkeError("RESOURCE_EXHAUSTED", gke_rules.request_rate_message(gke_rules.project_number(project)))
        rule = take_fault("upgrade", pool, "", cluster)
        if rule and key in self.clusters:
            self.new_op(key, "UPGRADE_MASTER", seconds=held_seconds(rule))

    @staticmethod
    def _unavailable_for_faults(cluster, pool=""):
        """A matching "unavailable" rule: the request is answered UNAVAILABLE (HTTP 503), as a front end that lost
        its backend or a reset connection is; the same request made again may pass (Terraform's Google provider
        retries 500, 502 and 503)."""
        if take_fault("unavailable", pool, "", cluster):
            raise GkeError("UNAVAILABLE", "The service is currently unavailable.")

    # --- RPCs -------------------------------------------------------------------------------------------
    def create_cluster(self, req):
        c = self.c
        project, location = parse_parent(req.parent, req.project_id, req.zone)
        cluster = c.Cluster(req.cluster)
        body = as_dict(cluster)
        with self.lock:
            key = f"{project}/{location}/{cluster.name}"
            self._refuse_for_faults(key)
            gke_rules.check_cluster_name(cluster.name)
            gke_rules.check_cluster_absent(
                cluster.name,
                project,
                location,
                {k.split("/")[2] for k in self.clusters if k.startswith(f"{project}/{location}/")},
            )
            if not body.get("node_pools") and not body.get("initial_node_count"):
                # GKE answers this for a Standard cluster without nodes (wording ours).
                raise GkeError("INVALID_ARGUMENT", "Cluster.initial_node_count or Cluster.node_pools must be set.")
            gke_rules.check_cluster(body, location, project, reservations(project), DEFAULT_BOOT_DISK)
            self._check_quota(project, location, body, body.get("node_pools") or [])
            if body.get("initial_node_count"):  # the legacy form: one pool named default-pool
                cluster.node_pools.append(
                    c.NodePool(
                        name="default-pool",
                        initial_node_count=cluster.initial_node_count,
                        config=(cluster.node_config or c.NodeConfig(machine_type="e2-medium")),
                    )
                )
                cluster.initial_node_count = 0
            slot = self.free_slot()
            cluster.status = c.Cluster.Status.PROVISIONING
            cluster.location = location
            cluster.zone = location
            if not cluster.locations:
                cluster.locations.extend(gke_rules.zones_of(location)[:3])
            cluster.self_link = f"https://{HOST}/v1/projects/{project}/locations/{location}/clusters/{cluster.name}"
            cluster.id = uuid.uuid4().hex
            cluster.control_plane_endpoints_config.dns_endpoint_config.endpoint = gke_dns.endpoint_name(
                cluster.id, location
            )
            cluster.create_time = now_iso()
            version = gke_rules.cluster_version(body)  # a full version asked for, else the channel's default
            cluster.current_master_version = cluster.current_node_version = version
            cluster.initial_cluster_version = cluster.initial_cluster_version or version
            for p in cluster.node_pools:
                p.status = c.NodePool.Status.PROVISIONING
                p.version = version
                p.self_link = f"{cluster.self_link}/nodePools/{p.name}"
            self.clusters[key] = {"cluster": cluster, "slot": slot}
            return self.new_op(key, "CREATE_CLUSTER")

    def dns_route(self, host: str):
        """Where the cluster's DNS endpoint leads (sim/gke_dns.py), and the cluster whose IAM says who may use it."""
        with self.lock:
            for key, rec in self.clusters.items():
                if rec["cluster"].control_plane_endpoints_config.dns_endpoint_config.endpoint == host:
                    route = self._route_of(rec["cluster"])
                    project, location, name = key.split("/")
                    route.project = project
                    route.cluster_path = f"projects/{project}/locations/{location}/clusters/{name}"
                    return route
        return None

    @staticmethod
    def _route_of(cluster) -> gke_dns.Route:
        """Where a cluster's DNS endpoint leads now: its apiserver, a refusal, or a reset."""
        dns = cluster.control_plane_endpoints_config.dns_endpoint_config
        if not dns.allow_external_traffic:
            # Wording ours; the behaviour is the API reference's: allow_external_traffic "controls
            # whether user traffic is allowed over this endpoint".
            return gke_dns.Route(
                refusal=(
                    403,
                    (
                        f"The DNS-based endpoint of cluster {cluster.name} does not allow user traffic "
                        "(controlPlaneEndpointsConfig.dnsEndpointConfig.allowExternalTraffic is false): enable "
                        f"it with `gcloud container clusters update {cluster.name} --enable-dns-access`."
                    ),
                )
            )
        if not cluster.endpoint:
            return gke_dns.Route(refusal=(503, f"The control plane of cluster {cluster.name} is not ready."))
        if take_fault("kube-unavailable", "", "", cluster.name):
            return gke_dns.Route(refusal=(503, "The service is currently unavailable."))
        if take_fault("kube-reset", "", "", cluster.name):
            return gke_dns.Route(reset=True)
        return gke_dns.Route(apiserver=cluster.endpoint)

    def get_cluster(self, req):
        project, location, name = parse_cluster(req.name, req.project_id, req.zone, req.cluster_id)
        self._unavailable_for_faults(name)
        with self.lock:
            return self.cluster(f"{project}/{location}/{name}")["cluster"]

    def list_clusters(self, req):
        project, location = parse_parent(req.parent, req.project_id, req.zone)
        with self.lock:
            items = [
                v["cluster"]
                for k, v in self.clusters.items()
                if k.startswith(f"{project}/") and (location == "-" or k.split("/")[1] == location)
            ]
        return self.c.ListClustersResponse(clusters=items)

    def delete_cluster(self, req):
        project, location, name = parse_cluster(req.name, req.project_id, req.zone, req.cluster_id)
        key = f"{project}/{location}/{name}"
        with self.lock:
            rec = self.cluster(key)
            self._refuse_for_faults(key)
            gke_rules.check_no_running_operation(name, self.running_ops(key), "delete cluster")
            rec["cluster"].status = self.c.Cluster.Status.STOPPING
            return self.new_op(key, "DELETE_CLUSTER")

    def create_node_pool(self, req):
        c = self.c
        project, location, name = parse_cluster(req.parent, req.project_id, req.zone, req.cluster_id)
        key = f"{project}/{location}/{name}"
        pool = c.NodePool(req.node_pool)
        body = as_dict(pool)
        with self.lock:
            cluster = self.cluster(key)["cluster"]
            cluster_body = as_dict(cluster)
            gke_rules.check_node_pool(cluster_body, body, location, project, reservations(project), DEFAULT_BOOT_DISK)
            gke_rules.check_node_pool_absent(name, pool.name, {p.name for p in cluster.node_pools})
            self._refuse_for_faults(key, pool.name)
            gke_rules.check_no_running_operation(name, self.running_ops(key), "create node pool", pool=pool.name)
            gke_rules.check_concurrent_operations(name, self.running_ops(key))
            machine_type = body.get("config", {}).get("machine_type", "")
            where = {
                "zone": gke_rules.pool_zones(cluster_body, body, location)[0],
                "capacity_type": gke_rules.capacity_type_of(body),
                "region": location,
            }
            gke_rules.check_reservation_zone(body, where["zone"], project, read_json(GKE_DIR / "reservations.json", []))
            consumed = self._reserved_vms(project, gke_rules.reservation_of(body, project))
            gke_rules.check_reservation_vms(body, where["zone"], project, reservation_vm_counts(project), consumed)
            self._check_quota(project, location, cluster_body, [body])
            if take_fault("reservation-missing", pool.name, machine_type, name, **where):
                affinity = body.get("config", {}).get("reservation_affinity") or {}
                res = (affinity.get("values") or ["(any)"])[0].rsplit("/", 1)[-1]
                zone = (body.get("locations") or list(cluster.locations) or ["?"])[0]
                raise GkeError(
                    "NOT_FOUND",
                    f'Google Compute Engine: reservation "{res}" not found for node pool '
                    f'"{pool.name}" at zone "{zone}".',
                )
            if take_fault("quota", pool.name, machine_type, name, **where):
                raise GkeError("PERMISSION_DENIED", gke_rules.quota_message(body, location))
            fault = take_fault("stockout", pool.name, machine_type, name, **where)
            held = take_fault("capacity-held", pool.name, machine_type, name, **where)
            slow_create = take_fault("slow-create", pool.name, machine_type, name, **where)
            slow = take_fault("slow-reply", pool.name, machine_type, name, **where)
            pool.status = c.NodePool.Status.PROVISIONING
            pool.version = cluster.current_node_version
            pool.self_link = f"{cluster.self_link}/nodePools/{pool.name}"
            if not pool.locations:
                pool.locations.extend(cluster.locations)
            cluster.node_pools.append(pool)
            operation = self.new_op(
                key,
                "CREATE_NODE_POOL",
                pool=pool.name,
                fault=fault,
                held_until=time.time() + held_seconds(held) if held else None,
                slow_until=time.time() + held_seconds(slow_create) if slow_create else None,
            )
        if slow:  # Applied, answered late: outside the lock, the pool's create goes on meanwhile.
            time.sleep(held_seconds(slow))
        return operation

    def _check_quota(self, project: str, location: str, cluster: dict, pools: list[dict]) -> None:
        """GKE's 403 for pools whose first nodes the region's Compute Engine quota cannot hold (limits:
        $SIM/gke/quotas.json, sim/compute_api.py; usage: the project's pools in the region)."""
        region = gke_rules.region_of(location)
        needs: dict[str, float] = {}
        for pool in pools:
            for metric, need in gke_rules.quota_needs(cluster, pool, location).items():
                needs[metric] = needs.get(metric, 0.0) + need
        if needs:
            gke_rules.check_quota(pools[0], needs, region_limits(region), self.quota_usage(project, region), region)

    def quota_usage(self, project: str, region: str) -> dict[str, float]:
        """What the project's pools in ``region`` draw of each quota metric (pools in ERROR or going away: nothing)."""
        usage: dict[str, float] = {}
        with self.lock:
            for key, rec in self.clusters.items():
                owner, location, _ = key.split("/")
                if owner != project or gke_rules.region_of(location) != region:
                    continue
                cluster = as_dict(rec["cluster"])
                for pool in rec["cluster"].node_pools:
                    if pool.status.name in ("ERROR", "STOPPING"):
                        continue
                    for metric, used in gke_rules.quota_needs(cluster, as_dict(pool), location).items():
                        usage[metric] = usage.get(metric, 0.0) + used
        return usage

    def reservation_in_use(self, owner: str, name: str) -> int:
        """The VMs the emulated project's pools take from reservation ``owner``/``name`` (Compute Engine's
        ``specificReservation.inUseCount``)."""
        with self.lock:
            return self._reserved_vms(PROJECT, f"projects/{owner}/reservations/{name}")

    def _reserved_vms(self, project: str, path: str | None) -> int:
        """The VMs the project's pools take from reservation ``path``: their nodes, but for pools that have none
        (ERROR) or are going away (STOPPING)."""
        if path is None:
            return 0
        return sum(
            int(pool.initial_node_count)
            for key, rec in self.clusters.items()
            if key.startswith(f"{project}/")
            for pool in rec["cluster"].node_pools
            if pool.status.name not in ("ERROR", "STOPPING")
            and gke_rules.reservation_of(as_dict(pool), project) == path
        )

    def get_node_pool(self, req):
        project, location, name, pool = parse_pool(req.name, req.project_id, req.zone, req.cluster_id, req.node_pool_id)
        self._unavailable_for_faults(name, pool)
        with self.lock:
            return self.pool(f"{project}/{location}/{name}", pool)

    def list_node_pools(self, req):
        project, location, name = parse_cluster(req.parent, req.project_id, req.zone, req.cluster_id)
        with self.lock:
            return self.c.ListNodePoolsResponse(
                node_pools=list(self.cluster(f"{project}/{location}/{name}")["cluster"].node_pools)
            )

    def delete_node_pool(self, req):
        project, location, name, pool_name = parse_pool(
            req.name, req.project_id, req.zone, req.cluster_id, req.node_pool_id
        )
        key = f"{project}/{location}/{name}"
        with self.lock:
            pool = self.pool(key, pool_name)
            self._refuse_for_faults(key, pool_name)
            gke_rules.check_no_running_operation(name, self.running_ops(key), "delete node pool", pool=pool_name)
            gke_rules.check_concurrent_operations(name, self.running_ops(key))
            pool.status = self.c.NodePool.Status.STOPPING
            return self.new_op(key, "DELETE_NODE_POOL", pool=pool_name)

    def get_operation(self, req):
        project, location, op_name = parse_operation(req.name, req.project_id, req.zone, req.operation_id)
        with self.lock:
            rec = self.operations.get(op_name)
            # GKE keeps an operation in the location of its cluster: asked for in another location (or project), it
            # answers NOT_FOUND, in the words of its NOT_FOUND for a cluster (Project.cluster).
            if rec is None or rec["key"].split("/")[:2] != [project, location]:
                raise GkeError("NOT_FOUND", f"Not found: projects/{project}/locations/{location}/operations/{op_name}.")
        self._unavailable_for_faults(rec["key"].rsplit("/", 1)[-1], rec.get("pool") or "")
        return rec["op"]

    def list_operations(self, req):
        project, location = parse_parent(req.parent, req.project_id, req.zone)
        with self.lock:
            ops = [
                r["op"]
                for r in self.operations.values()
                if r["key"].startswith(f"{project}/") and (location == "-" or r["key"].split("/")[1] == location)
            ]
        return self.c.ListOperationsResponse(operations=ops)


# --- resource names --------------------------------------------------------------------------------------------


def iam_target(method: str, req) -> tuple[str, str]:
    """The project a call's permission is checked in, and the resource GKE's refusal names: the cluster (or pool's
    cluster) it names, else its parent."""
    if method in ("ListClusters", "ListOperations"):
        project, location = parse_parent(req.parent, req.project_id, req.zone)
        return project, f"projects/{project}/locations/{location}"
    if method == "CreateCluster":
        project, location = parse_parent(req.parent, req.project_id, req.zone)
        return project, f"projects/{project}/locations/{location}/clusters/{req.cluster.name}"
    if method == "GetOperation":
        project, location, name = parse_operation(req.name, req.project_id, req.zone, req.operation_id)
        return project, f"projects/{project}/locations/{location}/operations/{name}"
    if method in ("CreateNodePool", "ListNodePools"):
        project, location, name = parse_cluster(req.parent, req.project_id, req.zone, req.cluster_id)
    elif method in ("GetNodePool", "DeleteNodePool"):
        project, location, name, _ = parse_pool(req.name, req.project_id, req.zone, req.cluster_id, req.node_pool_id)
    else:
        project, location, name = parse_cluster(req.name, req.project_id, req.zone, req.cluster_id)
    return project, f"projects/{project}/locations/{location}/clusters/{name}"


def _split(name: str, shape: list[str]) -> list[str] | None:
    parts = name.split("/")
    if len(parts) != 2 * len(shape) or any(parts[2 * i] != s for i, s in enumerate(shape)):
        return None
    return parts[1::2]


def parse_parent(parent, project_id="", zone=""):
    got = _split(parent, ["projects", "locations"]) if parent else [project_id, zone]
    if not got or not all(got):
        raise GkeError("INVALID_ARGUMENT", f'Invalid parent "{parent}": expected projects/*/locations/*.')
    return got[0], got[1]


def parse_cluster(name, project_id="", zone="", cluster_id=""):
    got = _split(name, ["projects", "locations", "clusters"]) if name else [project_id, zone, cluster_id]
    if not got or not all(got):
        raise GkeError("INVALID_ARGUMENT", f'Invalid name "{name}": expected projects/*/locations/*/clusters/*.')
    return tuple(got)


def parse_pool(name, project_id="", zone="", cluster_id="", pool_id=""):
    got = (
        _split(name, ["projects", "locations", "clusters", "nodePools"])
        if name
        else [project_id, zone, cluster_id, pool_id]
    )
    if not got or not all(got):
        raise GkeError(
            "INVALID_ARGUMENT", f'Invalid name "{name}": expected projects/*/locations/*/clusters/*/nodePools/*.'
        )
    return tuple(got)


def parse_operation(name, project_id="", zone="", operation_id=""):
    got = _split(name, ["projects", "locations", "operations"]) if name else [project_id, zone, operation_id]
    if not got or not all(got):
        raise GkeError("INVALID_ARGUMENT", f'Invalid name "{name}": expected projects/*/locations/*/operations/*.')
    return tuple(got)


def write_policy() -> None:
    """The simulation's IAM policy: the roles the documents grant (sim/gke_iam.py ``sim_policy``); the reaper of the
    simulation watches its one project (sim/cluster.py ``TPU_RL_REAPER_WATCH``)."""
    (GKE_DIR / "iam.json").write_text(json.dumps(gke_iam.sim_policy(PROJECT, [PROJECT]), indent=1))


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    if sys.argv[1:] == ["init"]:
        print(f"service account key: {init_files()}")
        write_policy()
        return
    init_files()
    if not (GKE_DIR / "iam.json").exists():
        write_policy()
    emulator = Emulator()
    server = serve_grpc(emulator)
    serve_proxy()
    serve_tokens(emulator.accounts)
    gke_dns.serve(DNS_PORT, PKI, emulator.dns_route, emulator.accounts.caller, emulator.connect_refusal)
    compute_api.serve(
        COMPUTE_PORT,
        PKI,
        compute_api.ComputeApi(
            reservations=lambda: read_json(GKE_DIR / "reservations.json", []),
            quotas=lambda: read_json(GKE_DIR / "quotas.json", {}),
            in_use=emulator.reservation_in_use,
            usage=emulator.quota_usage,
            policy=lambda: gke_iam.read_policy(GKE_DIR / "iam.json"),
            caller=emulator.accounts.caller,
        ),
    )
    emulator.resume()
    log.info(
        "GKE emulator: proxy 127.0.0.1:%d, gRPC/TLS 127.0.0.1:%d, DNS endpoints 127.0.0.1:%d, "
        "token http://127.0.0.1:%d/token",
        PROXY_PORT,
        GRPC_PORT,
        DNS_PORT,
        TOKEN_PORT,
    )
    import faulthandler
    import signal

    faulthandler.enable()
    stop = threading.Event()

    def on_signal(number, _frame):
        log.info("signal %d: stopping", number)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stop.wait()
    server.stop(2)
    emulator.save()


if __name__ == "__main__":
    main()
