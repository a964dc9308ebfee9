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
Access tokens are deterministic per service account (HMAC of the account with a secret kept in
$SIM/gke/token-secret): a refresh returns the same token, so a control plane started before a refresh
keeps accepting it (the control planes get {token: client_email} at start).

State: $SIM/gke/state.json (clusters, node pools, operations, control-plane slots); reservations the
emulator knows: $SIM/gke/reservations.json (a JSON list of names or projects/P/reservations/N; default
none); capacity faults: $SIM/gke/faults.json (sim/gke_faults.py), read on each request. Durations:
TPU_RL_SIM_GKE_CLUSTER_CREATE_SECONDS (3, after the control plane is ready), _POOL_CREATE_SECONDS (3),
_DELETE_SECONDS (2), _PENDING_SECONDS (0.3), _STOCKOUT_SECONDS (10: GKE's ~35 minutes of retrying a create for
capacity, time-scaled). See sim/README.md.

Split by job: this file holds the emulated project (its state, operations and the ClusterManager methods);
sim/gke_settings.py its files, ports and durations; sim/gke_auth.py the keys, tokens and token endpoint;
sim/gke_transport.py the gRPC server and the CONNECT proxy; sim/gke_dns.py the DNS endpoints;
sim/gke_nodes.py the nodes a pool registers; sim/gke_rules.py what GKE refuses.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import threading
import time
import uuid
from datetime import UTC, datetime

from . import gke_dns, gke_rules
from .gke_auth import Accounts, init_files, serve_tokens
from .gke_nodes import PoolNodes
from .gke_rules import GkeError
from .gke_settings import (
    CLUSTER_CREATE_S,
    DEFAULT_BOOT_DISK,
    DELETE_S,
    DNS_PORT,
    GKE_DIR,
    GRPC_PORT,
    HOST,
    MAX_SLOTS,
    PENDING_S,
    PKI,
    POOL_CREATE_S,
    PROXY_PORT,
    STOCKOUT_S,
    TOKEN_PORT,
    read_json,
)
from .gke_transport import serve_grpc, serve_proxy

log = logging.getLogger("gke")


def as_dict(msg) -> dict:
    """A container_v1 message as gke_rules reads it: JSON field names of the proto (``type``, not proto-plus's
    ``type_``), enum names."""

    def strip(value):  # proto-plus names a field "type" as "type_" (a Python keyword-ish name)
        if isinstance(value, dict):
            return {k.rstrip("_"): strip(v) for k, v in value.items()}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(type(msg).to_json(msg, preserving_proto_field_name=True, use_integers_for_enums=False)))


def now_iso():
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ------------------------------------------------------------------------------------------------------------
# Faults and reservations (files read on each request)
# ------------------------------------------------------------------------------------------------------------


def reservations() -> set[str]:
    return set(read_json(GKE_DIR / "reservations.json", []))


def held_seconds(fault_name: str) -> float:
    """How long a capacity-held fault keeps a pool's capacity back (a slow-reply fault: its reply)."""
    from . import gke_faults

    return float(gke_faults.list_faults().get(fault_name, {}).get("seconds") or 0)


def take_fault(kind: str, pool_name: str, machine_type: str, cluster: str = ""):
    """The first fault rule of `kind` matching the pool; counts one use against its `times`."""
    from . import gke_faults

    return gke_faults.take(kind, pool_name, machine_type, cluster)


# ------------------------------------------------------------------------------------------------------------
# The emulated project
# ------------------------------------------------------------------------------------------------------------


class Emulator:
    def __init__(self):
        from google.cloud import container_v1 as c

        self.c = c
        self.lock = threading.RLock()
        self.accounts = Accounts()
        self.clusters: dict[str, dict] = {}  # key "P/L/C" -> {"cluster": Cluster, "slot": int}
        self.operations: dict[str, dict] = {}  # op name -> {"op": Operation, "key", "pool", "kind", ...}
        self.control_planes: dict[str, object] = {}
        self._load()

    # --- persistence --------------------------------------------------------------------------------------
    def _load(self):
        c = self.c
        state = read_json(GKE_DIR / "state.json", {})
        for key, rec in state.get("clusters", {}).items():
            self.clusters[key] = {"cluster": c.Cluster.from_json(rec["cluster"]), "slot": rec["slot"]}
        for name, rec in state.get("operations", {}).items():
            self.operations[name] = {**rec, "op": c.Operation.from_json(rec["op"])}

    def save(self):
        c = self.c
        with self.lock:
            state = {
                "clusters": {
                    k: {"cluster": c.Cluster.to_json(v["cluster"]), "slot": v["slot"]} for k, v in self.clusters.items()
                },
                "operations": {
                    k: {**{f: v for f, v in rec.items() if f != "op"}, "op": c.Operation.to_json(rec["op"])}
                    for k, rec in self.operations.items()
                },
            }
            tmp = GKE_DIR / "state.json.tmp"
            tmp.write_text(json.dumps(state, indent=1))
            tmp.replace(GKE_DIR / "state.json")

    def resume(self):
        """After a restart: restart dead control planes of live clusters, continue unfinished operations."""
        for key, rec in list(self.clusters.items()):
            status = rec["cluster"].status
            if status in (self.c.Cluster.Status.RUNNING, self.c.Cluster.Status.RECONCILING):
                threading.Thread(target=self._revive, args=(key,), daemon=True).start()
        for name, rec in list(self.operations.items()):
            if rec["op"].status != self.c.Operation.Status.DONE:
                self._run(name)
            elif rec.get("nodes_created") is False:
                self._create_nodes_when_released(name)

    def _revive(self, key):
        try:
            cp = self.control_plane(key)
            if not cp.alive():
                log.info("control plane of %s is not running: restarting it", key)
                cp.start(self.accounts.tokens)
                cp.wait_ready(120)
        except Exception:  # noqa: BLE001 - logged, the cluster stays as it is
            log.exception("could not restart the control plane of %s", key)

    # --- helpers ----------------------------------------------------------------------------------------
    def control_plane(self, key):
        from .control_plane import ControlPlane

        with self.lock:
            if key not in self.control_planes:
                project, location, name = key.split("/")
                self.control_planes[key] = ControlPlane(f"{project}-{location}-{name}", self.clusters[key]["slot"])
            return self.control_planes[key]

    def free_slot(self):
        used = {rec["slot"] for rec in self.clusters.values()}
        for slot in range(MAX_SLOTS):
            if slot not in used:
                return slot
        raise GkeError("RESOURCE_EXHAUSTED", f"The simulation has no free control-plane slot ({MAX_SLOTS} in use).")

    def cluster(self, key) -> dict:
        if key not in self.clusters:
            project, location, name = key.split("/")
            # GKE's NOT_FOUND wording, quoted in hashicorp/terraform-provider-google issue 5229:
            # "Not found: projects/xxxx/locations/europe-west1/clusters/gke-cluster."
            raise GkeError("NOT_FOUND", f"Not found: projects/{project}/locations/{location}/clusters/{name}.")
        return self.clusters[key]

    def pool(self, key, pool_name):
        cluster = self.cluster(key)["cluster"]
        for p in cluster.node_pools:
            if p.name == pool_name:
                return p
        raise GkeError(
            "NOT_FOUND",
            f"Not found: projects/{key.split('/')[0]}/locations/{key.split('/')[1]}/"
            f"clusters/{cluster.name}/nodePools/{pool_name}.",
        )

    def running_ops(self, key):
        return [
            {"name": n, "operation_type": self.c.Operation.Type(r["op"].operation_type).name, "pool": r["pool"]}
            for n, r in self.operations.items()
            if r["key"] == key and r["op"].status != self.c.Operation.Status.DONE
        ]

    def new_op(self, key, kind, pool=None, **extra):
        """An operation, its links naming the project by number as GKE's do (API reference Operation.self_link,
        target_link: ``https://container.googleapis.com/v1/projects/123/locations/...``; every public output
        seen shows the number), while the request named it by id."""
        c = self.c
        project, location, cname = key.split("/")
        number = gke_rules.project_number(project)
        name = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"
        target = f"projects/{number}/locations/{location}/clusters/{cname}" + (f"/nodePools/{pool}" if pool else "")
        op = c.Operation(
            name=name,
            zone=location,
            location=location,
            operation_type=c.Operation.Type[kind],
            status=c.Operation.Status.PENDING,
            start_time=now_iso(),
            self_link=f"https://{HOST}/v1/projects/{number}/locations/{location}/operations/{name}",
            target_link=f"https://{HOST}/v1/{target}",
        )
        self.operations[name] = {"op": op, "key": key, "pool": pool, "kind": kind, **extra}
        self.save()
        self._run(name)
        return op

    def _run(self, name):
        threading.Thread(target=self._work, args=(name,), name=name, daemon=True).start()

    def _set(self, op_name, status=None, **fields):
        with self.lock:
            op = self.operations[op_name]["op"]
            if status:
                op.status = self.c.Operation.Status[status]
            for k, v in fields.items():
                setattr(op, k, v)
            self.save()

    def _finish(self, op_name, error: tuple[int, str] | None = None):
        with self.lock:
            op = self.operations[op_name]["op"]
            op.status = self.c.Operation.Status.DONE
            op.end_time = now_iso()
            if error:
                from google.rpc import status_pb2

                op.error = status_pb2.Status(code=error[0], message=error[1])
                op.status_message = error[1]
            self.save()

    # --- operation workers ------------------------------------------------------------------------------
    def _work(self, op_name):
        rec = self.operations[op_name]
        try:
            if rec["op"].status == self.c.Operation.Status.PENDING:
                time.sleep(PENDING_S)
                self._set(op_name, "RUNNING")
            {
                "CREATE_CLUSTER": self._create_cluster,
                "DELETE_CLUSTER": self._delete_cluster,
                "CREATE_NODE_POOL": self._create_pool,
                "DELETE_NODE_POOL": self._delete_pool,
                "UPGRADE_MASTER": self._upgrade_master,
            }[rec["kind"]](op_name, rec)
        except Exception as e:  # noqa: BLE001 - the operation reports it, as GKE would an internal error
            log.exception("operation %s failed", op_name)
            self._finish(op_name, (13, f"Internal error in the GKE emulator: {e}"))

    def _create_cluster(self, op_name, rec):
        c, key = self.c, rec["key"]
        if take_fault("cluster-error", "", "", key.rsplit("/", 1)[-1]):
            self._cluster_failed(op_name, key, "Failed to create cluster")  # GKE's words (see gke_faults.py)
            return
        cp = self.control_plane(key)
        try:
            cp.start(self.accounts.tokens)
            cp.wait_ready(180)
        except Exception as e:  # noqa: BLE001
            self._cluster_failed(op_name, key, f"Control plane failed to start: {e}")
            return
        with self.lock:
            cluster = self.clusters[key]["cluster"]
            cluster.endpoint = cp.endpoint
            cluster.master_auth.cluster_ca_certificate = base64.b64encode(cp.ca_pem).decode()
            self.save()
        time.sleep(CLUSTER_CREATE_S)
        with self.lock:
            pools = [(p.name, as_dict(p)) for p in self.clusters[key]["cluster"].node_pools]
        for _, pool in pools:
            self._create_nodes(key, pool)
        with self.lock:
            cluster = self.clusters[key]["cluster"]
            for p in cluster.node_pools:
                p.status = c.NodePool.Status.RUNNING
            cluster.status = c.Cluster.Status.RUNNING
            cluster.current_node_count = sum(self._nodes(key, p).count for _, p in pools)
        self._finish(op_name)

    def _cluster_failed(self, op_name, key, message):
        """The create ends DONE with INTERNAL and the cluster stays, in ERROR, until it is deleted."""
        with self.lock:
            cluster = self.clusters[key]["cluster"]
            cluster.status = self.c.Cluster.Status.ERROR
            cluster.status_message = message
        self._finish(op_name, (13, message))

    def _delete_cluster(self, op_name, rec):
        key = rec["key"]
        time.sleep(DELETE_S)
        self.control_plane(key).stop(purge=True)
        with self.lock:
            self.clusters.pop(key, None)
            self.control_planes.pop(key, None)
        self._finish(op_name)

    def _upgrade_master(self, op_name, rec):
        """GKE's own patch upgrade of the control plane (the maintenance exclusion still allows it in the window):
        the cluster RECONCILING for its duration, every other operation on it refused meanwhile."""
        c, key = self.c, rec["key"]
        with self.lock:
            self.cluster(key)["cluster"].status = c.Cluster.Status.RECONCILING
            self.save()
        time.sleep(rec.get("seconds") or 0)
        with self.lock:
            if key in self.clusters:
                self.clusters[key]["cluster"].status = c.Cluster.Status.RUNNING
        self._finish(op_name)

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

    def _create_pool(self, op_name, rec):
        c, key = self.c, rec["key"]
        time.sleep(POOL_CREATE_S)
        fault = rec.get("fault")
        with self.lock:
            pool = self.pool(key, rec["pool"])
            body = as_dict(pool)
        if fault:
            # GKE keeps the create RUNNING while it retries, saying nothing of it in the pool (no source shows
            # conditions filled during a create), then fails it and leaves the pool: in ERROR with no nodes, or
            # RUNNING_WITH_ERROR ("created and is partially usable": API reference NodePool.Status) with the nodes it
            # made, as after the IGM stockouts quoted in hashicorp/terraform-provider-google issue 3304 ('Nodepool
            # "test" has status "RUNNING_WITH_ERROR" with message "...Not all instances running in IGM...
            # [ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS]"').
            made = int(read_json(GKE_DIR / "faults.json", {}).get(fault, {}).get("nodes") or 0)
            time.sleep(STOCKOUT_S)
            if made:
                self._create_nodes(key, body, limit=made)
            message = self._stockout_message(key, body, running=made)
            with self.lock:
                pool = self.pool(key, rec["pool"])
                pool.status = c.NodePool.Status.RUNNING_WITH_ERROR if made else c.NodePool.Status.ERROR
                pool.status_message = message
                pool.conditions = [
                    c.StatusCondition(code=c.StatusCondition.Code.GCE_STOCKOUT, canonical_code=8, message=message)
                ]
                # one change: the pool's failure shows with its operation's end, never while it runs
                self._finish(op_name, (8, message))  # RESOURCE_EXHAUSTED
            return
        if (body.get("config") or {}).get("flex_start"):
            # GKE creates a flex-start pool empty: the operation is done and the slice comes later, when there
            # is capacity for it (held back here until held_until).
            with self.lock:
                self.pool(key, rec["pool"]).status = c.NodePool.Status.RUNNING
            self._finish(op_name)
            self._create_nodes_when_released(op_name)
            return
        if rec.get("held_until"):
            # No capacity yet: GKE keeps the create running while it retries (no source shows it saying why in
            # the pool's conditions meanwhile), until the capacity comes.
            time.sleep(max(0.0, rec["held_until"] - time.time()))
        if rec.get("slow_until"):
            self._show_error_while_slow(key, rec)
        self._create_nodes(key, body)
        with self.lock:
            self.pool(key, rec["pool"]).status = c.NodePool.Status.RUNNING
        self._finish(op_name)

    def _show_error_while_slow(self, key, rec):
        """A slow create: the pool shows ERROR in the middle third of it while its operation runs, then goes back
        to PROVISIONING until the create ends (NVIDIA/aicr 2065: "briefly reported ERROR; GKE recovered it")."""
        third = max(0.0, rec["slow_until"] - time.time()) / 3
        for status, message in (("ERROR", "Node pool creation is slow; GKE keeps trying."), ("PROVISIONING", "")):
            time.sleep(third)
            with self.lock:
                try:
                    pool = self.pool(key, rec["pool"])
                except GkeError:  # deleted meanwhile (which GKE refuses while the create runs)
                    return
                pool.status, pool.status_message = getattr(self.c.NodePool.Status, status), message
                self.save()
        time.sleep(third)

    def _create_nodes_when_released(self, op_name):
        """The nodes of a flex-start pool whose capacity is held: after held_until (also after a restart:
        resume() calls this for every pool create that still has nodes to make)."""
        rec = self.operations[op_name]

        def create():
            time.sleep(max(0.0, (rec.get("held_until") or 0) - time.time()))
            try:
                with self.lock:
                    body = as_dict(self.pool(rec["key"], rec["pool"]))
            except GkeError:  # the pool was deleted while it waited
                return
            self._create_nodes(rec["key"], body)
            with self.lock:
                rec["nodes_created"] = True
                self.save()

        rec["nodes_created"] = False
        threading.Thread(target=create, name=f"{op_name}-nodes", daemon=True).start()

    def _stockout_message(self, key, body: dict, running: int = 0) -> str:
        """GKE's text for a pool create that found no capacity (the operation's error, the pool's condition)."""
        zone = self._nodes(key, body).zones[0]
        project = key.split("/")[0]
        count = self._nodes(key, body).count
        return (
            f"Google Compute Engine: Not all instances running in IGM after {POOL_CREATE_S + STOCKOUT_S:.1f}s. "
            f"Expected {count}, running {running}, transitioning {count - running}. "
            f"Current errors: [GCE_STOCKOUT]: Instance '{self._nodes(key, body).names()[0]}' creation failed: "
            f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill "
            "the request.  '(resource type:compute)'."
        )

    def _delete_pool(self, op_name, rec):
        key = rec["key"]
        time.sleep(DELETE_S)
        self._delete_nodes(key, rec["pool"])
        with self.lock:
            cluster = self.clusters[key]["cluster"]
            cluster.node_pools = [p for p in cluster.node_pools if p.name != rec["pool"]]
        self._finish(op_name)

    # --- nodes ------------------------------------------------------------------------------------------
    def _nodes(self, key, pool: dict) -> PoolNodes:
        return PoolNodes(key, list(self.clusters[key]["cluster"].locations), pool)

    def _create_nodes(self, key, pool: dict, limit: int | None = None):
        """The pool's nodes (the first ``limit`` of them: a partial create)."""
        import urllib.error

        cp = self.control_plane(key)
        for body in self._nodes(key, pool).bodies()[:limit]:
            try:
                cp.api("POST", "/api/v1/nodes", body)
            except urllib.error.HTTPError as e:
                if e.code != 409:
                    raise

    def _delete_nodes(self, key, pool_name):
        import urllib.error

        cp = self.control_plane(key)
        try:
            nodes = cp.api("GET", f"/api/v1/nodes?labelSelector=cloud.google.com%2Fgke-nodepool%3D{pool_name}")
        except (urllib.error.URLError, OSError):
            log.warning("control plane of %s unreachable: nodes of %s not deleted", key, pool_name)
            return
        for node in nodes.get("items", []):
            try:
                cp.api("DELETE", f"/api/v1/nodes/{node['metadata']['name']}")
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise

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
            gke_rules.check_cluster(body, location, project, reservations(), DEFAULT_BOOT_DISK)
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
            cluster.current_master_version = cluster.current_node_version = "1.34.4-gke.sim"
            cluster.initial_cluster_version = cluster.initial_cluster_version or "1.34.4-gke.sim"
            for p in cluster.node_pools:
                p.status = c.NodePool.Status.PROVISIONING
                p.version = "1.34.4-gke.sim"
                p.self_link = f"{cluster.self_link}/nodePools/{p.name}"
            self.clusters[key] = {"cluster": cluster, "slot": slot}
            return self.new_op(key, "CREATE_CLUSTER")

    def dns_route(self, host: str):
        """Where the cluster's DNS endpoint leads (sim/gke_dns.py)."""
        with self.lock:
            for rec in self.clusters.values():
                cluster = rec["cluster"]
                dns = cluster.control_plane_endpoints_config.dns_endpoint_config
                if dns.endpoint != host:
                    continue
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
        return None

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
            gke_rules.check_node_pool(cluster_body, body, location, project, reservations(), DEFAULT_BOOT_DISK)
            gke_rules.check_node_pool_absent(name, pool.name, {p.name for p in cluster.node_pools})
            self._refuse_for_faults(key, pool.name)
            gke_rules.check_no_running_operation(name, self.running_ops(key), "create node pool", pool=pool.name)
            gke_rules.check_concurrent_operations(name, self.running_ops(key))
            machine_type = body.get("config", {}).get("machine_type", "")
            if take_fault("reservation-missing", pool.name, machine_type, name):
                affinity = body.get("config", {}).get("reservation_affinity") or {}
                res = (affinity.get("values") or ["(any)"])[0].rsplit("/", 1)[-1]
                zone = (body.get("locations") or list(cluster.locations) or ["?"])[0]
                raise GkeError(
                    "NOT_FOUND",
                    f'Google Compute Engine: reservation "{res}" not found for node pool '
                    f'"{pool.name}" at zone "{zone}".',
                )
            if take_fault("quota", pool.name, machine_type, name):
                raise GkeError("PERMISSION_DENIED", gke_rules.quota_message(body, location))
            fault = take_fault("stockout", pool.name, machine_type, name)
            held = take_fault("capacity-held", pool.name, machine_type, name)
            slow_create = take_fault("slow-create", pool.name, machine_type, name)
            slow = take_fault("slow-reply", pool.name, machine_type, name)
            pool.status = c.NodePool.Status.PROVISIONING
            pool.version = "1.34.4-gke.sim"
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
            if rec is None or not rec["key"].startswith(f"{project}/"):
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


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    if sys.argv[1:] == ["init"]:
        print(f"service account key: {init_files()}")
        return
    init_files()
    emulator = Emulator()
    server = serve_grpc(emulator)
    serve_proxy()
    serve_tokens(emulator.accounts)
    gke_dns.serve(DNS_PORT, PKI, emulator.dns_route, emulator.accounts.caller)
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
