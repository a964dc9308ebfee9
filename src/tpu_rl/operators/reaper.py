"""The reaper: finds what runs of this package left behind in GKE when Airflow could not tear it down
(the run was deleted, its environment lost or restored, its teardown never ran), and removes it.

It lists, in each watched project and location, the clusters and node pools this package created (their
description and node metadata name the run) and, in every reachable cluster, the JobSets and Secrets with
the run labels; asks Airflow for the state of each owner run of its own Airflow environment (another
environment's run is not asked about, and what it made is kept: ``tpu_rl.reaper``); decides with
:func:`tpu_rl.reaper.decide`; prints the report and pushes it as the XCom ``report``. Dry run unless ``delete`` is
set. Reapable TPU capacity that is still there fails the task, so the usual alerting fires.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import BaseOperator

from tpu_rl import environment, gke
from tpu_rl import reaper as rp
from tpu_rl.compat import AirflowFailException
from tpu_rl.hooks.gke import GkeApiHook
from tpu_rl.hooks.kubernetes import ClusterTarget, KubernetesApiHook
from tpu_rl.operators.leases import dag_run_state
from tpu_rl.run import RunIdentity
from tpu_rl.timestamps import parse_time
from tpu_rl.tpu import chips_per_host
from tpu_rl.vocabulary import (
    ANNOTATION_DAG_ID,
    ANNOTATION_ENVIRONMENT,
    ANNOTATION_RUN_ID,
    GKE_LABEL_KEEP,
    LABEL_RUN_KEY,
)

_LOCATION = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]/[a-z]+-[a-z]+\d+(-[a-z])?")


def pool_chips(pool) -> int:
    """The TPU chips a node pool holds or can hold: a flex-start (or any autoscaled) pool is created with no
    node and scales to its whole slice, so its autoscaling maximum counts, per zone as its node count does."""
    autoscaled = pool.autoscaling.max_node_count if pool.autoscaling.enabled else 0
    per_zone = max(pool.initial_node_count, autoscaled)
    return chips_per_host(pool.config.machine_type) * per_zone * max(len(pool.locations), 1)


class ReapOrphanedResourcesOperator(BaseOperator):
    """Keeps or reaps each resource this package created whose run is gone (see the module docstring).

    Reads the run's params: ``watch`` (``project/location`` entries), ``grace_minutes``, ``delete``,
    ``gcp_conn_id``.
    """

    ui_color = "#f4cccc"

    @functools.cached_property
    def _hooks(self) -> dict[tuple, Any]:
        return {}

    def gke_hook(self, gcp_conn_id: str, project: str, location: str) -> GkeApiHook:
        """The GKE hook of a project and location, made once per execution (as a run's scope keeps its hooks)."""
        key = ("gke", gcp_conn_id, project, location)
        if key not in self._hooks:
            self._hooks[key] = GkeApiHook(gcp_conn_id, project, location)
        return self._hooks[key]

    def kubernetes_hook(self, target: ClusterTarget) -> KubernetesApiHook:
        """The Kubernetes hook of a cluster, made once per execution."""
        key = ("kubernetes", json.dumps(target.to_dict(), sort_keys=True))
        if key not in self._hooks:
            self._hooks[key] = KubernetesApiHook(target)
        return self._hooks[key]

    def execute(self, context: Any) -> list[dict]:
        params = context["params"]
        watch, grace, delete = self._settings(params)
        now, here = datetime.now(UTC), environment.current()
        resources, clusters = [], {}
        for where in watch:
            project, location = where.split("/")
            found, reachable = self._gke_resources(project, location, params["gcp_conn_id"])
            resources += found
            clusters.update(reachable)
        for (project, location, name), target in clusters.items():
            resources += self._kubernetes_resources(project, location, name, target)
        holders = self._lease_holders(resources, params["gcp_conn_id"])
        runs = {r.owner for r in resources} | {h for found in holders.values() for h in found}
        states = {
            owner: dag_run_state(context["ti"], owner) if rp.asks_about(owner, here) else rp.NOT_ASKED for owner in runs
        }
        users = self._live_users(resources, states, holders)
        decisions = [
            rp.decide(
                r,
                states[r.owner],
                now,
                grace,
                users.get((r.project, r.location, r.name), ()) if r.kind == rp.CLUSTER else (),
                here,
            )
            for r in resources
        ]
        if delete:
            decisions = self._delete(decisions, clusters, params["gcp_conn_id"])
        self.log.info(
            "Reaper report (%s, grace %s, Airflow environment %s):\n%s",
            "deleting" if delete else "dry run",
            grace,
            environment.called(here),
            rp.report(decisions),
        )
        rows = [d.row() for d in decisions]
        context["ti"].xcom_push(key="report", value=rows)
        left = rp.left_behind_capacity(decisions)
        if left:
            raise AirflowFailException(
                f"{len(left)} resource(s) holding TPU capacity outlived their runs: "
                + "; ".join(f"{d.resource.path} ({d.reason}, {d.resource.chips} chips)" for d in left)
                + ". Fix: trigger this DAG with delete=true to remove them, or delete them yourself."
            )
        return rows

    # --- inputs ---------------------------------------------------------------------------------------
    @staticmethod
    def _settings(params: Any) -> tuple[list[str], timedelta, bool]:
        watch = list(params.get("watch") or [])
        bad = [w for w in watch if not _LOCATION.fullmatch(str(w))]
        if not watch or bad:
            raise AirflowFailException(
                "watch: "
                + (f"{bad} are not project/location entries" if bad else "nothing to watch")
                + '; fix: list the projects and locations runs create clusters in, e.g. ["my-project/us-east5"]'
            )
        grace = params.get("grace_minutes")
        if not isinstance(grace, (int, float)) or grace < 0:
            raise AirflowFailException(f"grace_minutes: {grace!r} is not a number of minutes >= 0; fix: e.g. 60")
        return watch, timedelta(minutes=grace), bool(params.get("delete"))

    def _gke_resources(self, project: str, location: str, gcp_conn_id: str):
        """This package's clusters and node pools in one location; the clusters whose Kubernetes API to read."""
        hook = self.gke_hook(gcp_conn_id, project, location)
        operations = list(hook.list_operations())
        # A node pool has no creation time of its own: its create operation's start.
        pool_created = {
            gke.operation_target(op.target_link): op.start_time
            for op in operations
            if op.operation_type.name == "CREATE_NODE_POOL"
        }
        deletes = _running_deletes(operations)
        found, reachable = [], {}
        for cluster in hook.list_clusters():
            base = {"project": project, "location": location}
            owner = gke.cluster_owner(cluster.description)
            cluster_deleted = _being_deleted(cluster.status.name, deletes.get((cluster.name, None)), "the cluster")
            tpu_pools = []
            for pool in cluster.node_pools:
                pool_owner = gke.pool_owner(dict(pool.config.metadata))
                if pool_owner is None:
                    continue
                created = parse_time(pool_created.get((cluster.name, pool.name)) or cluster.create_time)
                deleted = cluster_deleted and f"with its cluster ({cluster_deleted})"
                resource = rp.Resource(
                    rp.NODE_POOL,
                    pool.name,
                    pool_owner,
                    created,
                    cluster=cluster.name,
                    chips=pool_chips(pool),
                    being_deleted=deleted or _being_deleted(pool.status.name, deletes.get((cluster.name, pool.name))),
                    **base,
                )
                found.append(resource)
                tpu_pools.append(resource)
            if owner is not None:
                keep = "created with keep_cluster" if cluster.resource_labels.get(GKE_LABEL_KEEP) == "true" else ""
                found.append(
                    rp.Resource(
                        rp.CLUSTER,
                        cluster.name,
                        owner,
                        parse_time(cluster.create_time),
                        chips=sum(p.chips for p in tpu_pools),
                        kept_by_design=keep,
                        lease=gke.cluster_lease_uri(cluster.description) or "",
                        being_deleted=cluster_deleted,
                        **base,
                    )
                )
            if cluster.status.name == "RUNNING":  # it may hold JobSets of runs that used it as an existing cluster
                dns = cluster.control_plane_endpoints_config.dns_endpoint_config
                reachable[(project, location, cluster.name)] = ClusterTarget(
                    project_id=project,
                    location=location,
                    cluster_name=cluster.name,
                    gcp_conn_id=gcp_conn_id,
                    use_dns_endpoint=bool(dns.endpoint and dns.allow_external_traffic),
                )
        return found, reachable

    def _kubernetes_resources(self, project: str, location: str, cluster: str, target: ClusterTarget):
        try:
            jobsets, secrets = self.kubernetes_hook(target).list_labelled(LABEL_RUN_KEY)
        except Exception as e:  # noqa: BLE001 - one unreachable cluster must not hide the others' report
            self.log.warning(
                "Cluster %s/%s/%s is unreachable (%s): its JobSets and Secrets are not checked",
                project,
                location,
                cluster,
                str(e)[:300],
            )
            return []
        found = []
        for kind, objects in ((rp.JOBSET, jobsets), (rp.SECRET, secrets)):
            for obj in objects:
                meta = obj["metadata"]
                notes = meta.get("annotations") or {}
                if ANNOTATION_DAG_ID not in notes or ANNOTATION_RUN_ID not in notes:
                    continue
                found.append(
                    rp.Resource(
                        kind,
                        meta["name"],
                        RunIdentity(
                            notes[ANNOTATION_DAG_ID],
                            notes[ANNOTATION_RUN_ID],
                            environment=notes.get(ANNOTATION_ENVIRONMENT, ""),
                        ),
                        parse_time(str(meta["creationTimestamp"])),
                        project,
                        location,
                        cluster=cluster,
                        namespace=meta["namespace"],
                        uid=meta.get("uid", ""),
                    )
                )
        return found

    def _lease_holders(self, resources: list[rp.Resource], gcp_conn_id: str) -> dict[tuple, tuple[RunIdentity, ...]]:
        """Per shared cluster, the runs its lease lists (a run that joined it may have nothing in it yet). A
        lease that cannot be read keeps its cluster: its runs are not known."""
        from tpu_rl.hooks.gcs import GcsBucketHook
        from tpu_rl.operators.leases import LeaseStore

        holders, hook = {}, None
        for i, r in enumerate(resources):
            if r.kind != rp.CLUSTER or not r.lease:
                continue
            bucket, _, name = r.lease.removeprefix("gs://").partition("/")
            try:
                hook = hook.other(bucket) if hook else GcsBucketHook(bucket, gcp_conn_id)  # one client for all
                lease, _ = LeaseStore(hook.json_object(name)).read()
            except Exception as e:  # noqa: BLE001 - a bucket the reaper cannot read must not reap what it guards
                self.log.warning("Cannot read the lease %s of shared cluster %s: %s", r.lease, r.name, str(e)[:300])
                resources[i] = dataclasses.replace(r, kept_by_design=f"its lease {r.lease} could not be read")
                continue
            holders[(r.project, r.location, r.name)] = tuple(h.run for h in lease.holders)
        return holders

    @staticmethod
    def _live_users(
        resources: list[rp.Resource], states: dict[RunIdentity, str], holders: dict[tuple, tuple[RunIdentity, ...]]
    ) -> dict[tuple, tuple]:
        """Per cluster, the live runs (and the runs of other Airflow environments, whose state is not asked) with
        node pools, JobSets or Secrets in it, or holding its lease (a shared cluster): a cluster is kept while
        another run uses it."""
        users: dict[tuple, list[RunIdentity]] = {}
        for r in resources:
            if r.kind != rp.CLUSTER and rp.may_use(states[r.owner]):
                users.setdefault((r.project, r.location, r.cluster), []).append(r.owner)
        for where, runs in holders.items():
            users.setdefault(where, []).extend(run for run in runs if rp.may_use(states[run]))
        return {k: tuple(dict.fromkeys(v)) for k, v in users.items() if v}

    # --- deletion -------------------------------------------------------------------------------------
    def _delete(self, decisions: list[rp.Decision], targets: dict, gcp_conn_id: str) -> list[rp.Decision]:
        """Kubernetes objects first, then pools of clusters that stay, then clusters (their pools go with them)."""
        reaped_clusters = {
            (d.resource.project, d.resource.location, d.resource.name)
            for d in decisions
            if d.reap and d.resource.kind == rp.CLUSTER
        }
        order = {rp.JOBSET: 0, rp.SECRET: 1, rp.NODE_POOL: 2, rp.CLUSTER: 3}
        result = []
        for d in sorted(decisions, key=lambda d: order[d.resource.kind]):
            r = d.resource
            if not d.reap:
                result.append(d)
                continue
            if r.kind == rp.NODE_POOL and (r.project, r.location, r.cluster) in reaped_clusters:
                result.append(dataclasses.replace(d, deleted=True, reason=d.reason + "; goes with its cluster"))
                continue
            try:
                if r.kind == rp.JOBSET:
                    self.kubernetes_hook(targets[(r.project, r.location, r.cluster)]).delete_jobset(
                        r.name, r.namespace, uid=r.uid
                    )
                elif r.kind == rp.SECRET:
                    self.kubernetes_hook(targets[(r.project, r.location, r.cluster)]).delete_secret(r.name, r.namespace)
                elif r.kind == rp.NODE_POOL:
                    self.gke_hook(gcp_conn_id, r.project, r.location).delete_node_pool(r.cluster, r.name)
                else:
                    self.gke_hook(gcp_conn_id, r.project, r.location).delete_cluster(r.name)
            except Exception as e:  # noqa: BLE001 - the next reaper run tries again; the report says why
                self.log.warning("Could not delete %s %s: %s", r.kind, r.path, str(e)[:300])
                result.append(dataclasses.replace(d, reason=f"{d.reason}; delete failed: {str(e)[:120]}"))
                continue
            self.log.warning(
                "Deleted %s %s: owner %s / %s, run %s, age %s, %s chips",
                r.kind,
                r.path,
                r.owner.dag_id,
                r.owner.run_id,
                d.run_state,
                d.age,
                r.chips,
            )
            result.append(dataclasses.replace(d, deleted=True))
        return result


def _running_deletes(operations) -> dict[tuple[str, str | None], str]:
    """The cluster and pool deletes GKE is running, by (cluster, pool or None): each operation's name."""
    running = {}
    for op in operations:
        if op.operation_type.name in ("DELETE_CLUSTER", "DELETE_NODE_POOL") and op.status.name != "DONE":
            if target := gke.operation_target(op.target_link):
                running[target] = op.name
    return running


def _being_deleted(status: str, operation: str | None, what: str = "the node pool") -> str:
    """Why GKE shows a cluster or pool STOPPING: its running delete operation, or that it is being deleted."""
    if operation:
        return f"GKE runs the delete of {what} (operation {operation})"
    return f"GKE is deleting {what} (status STOPPING)" if status == "STOPPING" else ""
