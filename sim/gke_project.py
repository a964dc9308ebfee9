"""The GKE emulator's emulated project: its clusters, node pools and operations (kept in $SIM/gke/state.json,
taken up again after a restart), each cluster's Kubernetes control plane (sim/control_plane.py), and the work of
each operation, PENDING -> RUNNING -> DONE: a cluster's control plane started or stopped, a pool's nodes registered
(sim/gke_nodes.py) or deleted, an operation slowed or failed by the capacity faults (sim/gke_faults.py).

sim/gke_emulator.py answers the ClusterManager requests over it: it checks each one and starts its operation here
(``Project.new_op``).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from datetime import UTC, datetime

from . import gke_rules
from .gke_auth import Accounts
from .gke_errors import GkeError
from .gke_nodes import PoolNodes
from .gke_settings import (
    CLUSTER_CREATE_S,
    DELETE_S,
    GKE_DIR,
    HOST,
    MAX_SLOTS,
    PENDING_S,
    POOL_CREATE_S,
    STOCKOUT_S,
    read_json,
)

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
# Faults (their file is read on each request)
# ------------------------------------------------------------------------------------------------------------


def held_seconds(fault_name: str) -> float:
    """How long a capacity-held fault keeps a pool's capacity back (a slow-reply fault: its reply)."""
    from . import gke_faults

    return float(gke_faults.list_faults().get(fault_name, {}).get("seconds") or 0)


def take_fault(
    kind: str,
    pool_name: str,
    machine_type: str,
    cluster: str = "",
    zone: str = "",
    capacity_type: str = "",
    region: str = "",
):
    """The first fault rule of `kind` matching the pool (its zone, capacity type and region, when the rule names
    them); counts one use against its `times`."""
    from . import gke_faults

    return gke_faults.take(kind, pool_name, machine_type, cluster, zone, capacity_type, region)


# ------------------------------------------------------------------------------------------------------------
# The emulated project
# ------------------------------------------------------------------------------------------------------------


class Project:
    """The clusters, node pools and operations of the emulated project, and the threads that carry each operation
    through; every change under ``lock`` and saved at once."""

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
        stocked_out = self._stocked_out_pool(key, pools)
        if stocked_out:
            self._cluster_stockout(op_name, key, pools, *stocked_out)
            return
        for _, pool in pools:
            self._create_nodes(key, pool)
        with self.lock:
            cluster = self.clusters[key]["cluster"]
            for p in cluster.node_pools:
                p.status = c.NodePool.Status.RUNNING
            cluster.status = c.Cluster.Status.RUNNING
            cluster.current_node_count = sum(self._nodes(key, p).count for _, p in pools)
        self._finish(op_name)

    def _cluster_failed(self, op_name, key, message, code=13):
        """The create ends DONE with ``code`` (INTERNAL unless said) and the cluster stays, in ERROR, until it is
        deleted."""
        with self.lock:
            cluster = self.clusters[key]["cluster"]
            cluster.status = self.c.Cluster.Status.ERROR
            cluster.status_message = message
        self._finish(op_name, (code, message))

    def _stocked_out_pool(self, key, pools):
        """The first of a creating cluster's pools a "stockout" rule matches, as it would match the pool created on
        its own, with the rule's name; None when no rule matches."""
        cluster = key.rsplit("/", 1)[-1]
        for name, body in pools:
            machine_type = (body.get("config") or {}).get("machine_type") or ""
            where = {
                "zone": (body.get("locations") or [""])[0],
                "capacity_type": gke_rules.capacity_type_of(body),
                "region": key.split("/")[1],
            }
            fault = take_fault("stockout", name, machine_type, cluster, **where)
            if fault:
                return body, fault
        return None

    def _cluster_stockout(self, op_name, key, pools, stocked: dict, fault: str):
        """A pool of the cluster's own request finds no capacity: GKE retries its VMs within the cluster's create
        (about 35 minutes, time-scaled), then ends the create DONE with the pool's stockout, in the IGM text of a pool
        create (akka/akka-core issue 32992: "(gcloud.container.clusters.create) Operation [...] finished with error:
        Google Compute Engine: Not all instances running in IGM after 35m4.03s. Expected 5, running 2, transitioning
        3. Current errors: [GCE_STOCKOUT]: ..."; kubeflow/pipelines issue 673: the cluster condition GCE_STOCKOUT).
        The cluster stays, in ERROR, until it is deleted (terraform-provider-google issue 2970: it still answers a
        GET); the other pools keep their nodes, the stocked-out one has the nodes the rule's "nodes" says."""
        c = self.c
        made = int(read_json(GKE_DIR / "faults.json", {}).get(fault, {}).get("nodes") or 0)
        time.sleep(STOCKOUT_S)
        for _, body in pools:
            if body is not stocked:
                self._create_nodes(key, body)
        if made:
            self._create_nodes(key, stocked, limit=made)
        message = self._stockout_message(key, stocked, running=made)
        condition = c.StatusCondition(code=c.StatusCondition.Code.GCE_STOCKOUT, canonical_code=8, message=message)
        with self.lock:
            cluster = self.clusters[key]["cluster"]
            for pool in cluster.node_pools:
                failed = pool.name == stocked.get("name")
                pool.status = c.NodePool.Status.RUNNING
                if failed:
                    pool.status = c.NodePool.Status.RUNNING_WITH_ERROR if made else c.NodePool.Status.ERROR
                    pool.status_message, pool.conditions = message, [condition]
            cluster.conditions = [condition]
            self._cluster_failed(op_name, key, message, code=8)  # RESOURCE_EXHAUSTED, as a pool's stockout

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
