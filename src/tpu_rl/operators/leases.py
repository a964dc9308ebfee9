"""Leases that runs share through the bucket: the TPU capacity queue, and the shared cluster's lease that
``create_cluster`` joins and ``delete_cluster`` leaves (operators/cluster.py). The rules are in
:mod:`tpu_rl.leases`; here they meet Cloud Storage (a read-modify-write with a generation precondition) and
Airflow (the state of a holder's run).

Why not an Airflow pool for the capacity: a slice lives from ``create_tpu_pools`` to the end of
``delete_tpu_pools``, three tasks, and a pool slot is held by one task only; between two of them another
run could take the slot and create a second slice. The lease is taken before the slice is created and
given back after its node pools are deleted, so the group never holds more slices than it has.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import BaseSensorOperator

from tpu_rl.compat import AirflowException
from tpu_rl.hooks import gcs
from tpu_rl.leases import (
    Holder,
    Lease,
    LeaseChange,
    cluster_lease_object,
    drop_holder,
    join_cluster,
    lease_object,
    leave_cluster,
    take_capacity,
)
from tpu_rl.reaper import MISSING
from tpu_rl.run import RunIdentity
from tpu_rl.run_scope import RunScope, RunScoped

#: Read-modify-write attempts before giving up on a lease that keeps changing under us.
LEASE_WRITE_ATTEMPTS = 20


def dag_run_state(ti: Any, run: RunIdentity) -> str:
    """The DAG run's state as Airflow's task API gives it ('running', 'success', ...), or MISSING."""
    if not ti.get_dr_count(dag_id=run.dag_id, run_ids=[run.run_id]):
        return MISSING
    state = ti.get_dagrun_state(dag_id=run.dag_id, run_id=run.run_id)
    return str(getattr(state, "value", state))  # a DagRunState enum


def now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class LeaseStore:
    """One lease document in Cloud Storage, changed only with a generation precondition: of two runs that
    change it at once, one writes and the other reads again and decides again."""

    def __init__(self, document: gcs.GcsJsonObject) -> None:
        self.object = document

    @property
    def uri(self) -> str:
        return self.object.uri

    def read(self) -> tuple[Lease, int]:
        """The lease and its generation (0: no document yet)."""
        stored = self.object.read()
        return (Lease(), 0) if stored is None else (Lease.parse(stored.data), stored.generation)

    def change(self, decide: Callable[[Lease], LeaseChange], log: Any = None) -> LeaseChange:
        """Applies ``decide`` to the current lease; the decision's notes are logged as warnings on ``log``."""
        for _ in range(LEASE_WRITE_ATTEMPTS):
            lease, generation = self.read()
            change = decide(lease)
            if change.lease is None or change.lease == lease or self.object.write(change.lease.dump(), generation):
                for note in change.notes if log else ():
                    log.warning("%s (%s)", note, self.uri)
                return change
            # another run changed it first: decide again on what it wrote
        raise AirflowException(f"{self.uri} keeps changing: could not update it")


def lease_store(scope: RunScope, name: str) -> LeaseStore:
    """The lease object ``name`` in the run's bucket."""
    return LeaseStore(scope.bucket.json_object(name))


def cluster_lease(scope: RunScope) -> LeaseStore:
    """The lease of a shared cluster, in the run's bucket: runs that share a cluster share its bucket."""
    config = scope.config
    return lease_store(scope, cluster_lease_object(config.project, config.region, config.cluster_name))


def join_cluster_lease(scope: RunScope, ti: Any, cluster_exists: bool, log: Any) -> Lease | None:
    """Joins the shared cluster's lease: the lease, or None while it is closing (its last holder is deleting
    the cluster)."""
    store = cluster_lease(scope)
    me = Holder.of(scope.run, now_text())
    change = store.change(lambda lease: join_cluster(lease, me, lambda r: dag_run_state(ti, r), cluster_exists), log)
    if change.result is not None:
        log.info(
            "Joined the lease of shared cluster %s (%s): %s",
            scope.config.cluster_name,
            store.uri,
            "; ".join(h.describe() for h in change.result.holders),
        )
    return change.result


def leave_cluster_lease(scope: RunScope, ti: Any, closing: bool, log: Any) -> bool:
    """Leaves the shared cluster's lease; True when no live run holds it any more. With ``closing`` this run
    then deletes the cluster, and marks the lease closing (with itself as the closer) so that a run joining now
    waits for the delete; without it (keep_cluster) the cluster stays, free to join."""
    config, store = scope.config, cluster_lease(scope)
    me = Holder.of(scope.run, now_text())
    change = store.change(lambda lease: leave_cluster(lease, me, lambda r: dag_run_state(ti, r), closing), log)
    leaving = change.result
    if not leaving.last:
        users = "; ".join(h.describe() for h in leaving.still_used_by)
        log.info(
            "Shared cluster %s stays: still used by %s",
            config.cluster_name,
            users if leaving.held else f"{users or 'nobody'}: this run does not hold it",
        )
        return False
    log.info(
        "This run is the last of shared cluster %s's lease (%s)%s",
        config.cluster_name,
        store.uri,
        ": deleting the cluster" if closing else "",
    )
    return True


def drop_from_cluster_lease(scope: RunScope) -> None:
    """Takes the run out of the shared cluster's lease (it will not use the cluster after all)."""
    me = Holder.of(scope.run, now_text())
    cluster_lease(scope).change(lambda lease: drop_holder(lease, me))


def capacity_store(scope: RunScope) -> LeaseStore:
    return lease_store(scope, lease_object("capacity", scope.config.capacity_group))


class WaitForTpuCapacitySensor(RunScoped, BaseSensorOperator):
    """Waits (rescheduled: no worker slot while waiting) until the run's TPU slices fit in its capacity group,
    and takes them: ``delete_tpu_pools`` gives them back once the run's node pools are gone. Each poke logs
    the queue: who holds the group's slices and since when."""

    def poke(self, context: Any) -> bool:
        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        if not config.capacity_limited:
            self.log.info("No capacity_group: the run's slices are not counted against a limit")
            return True
        ti = context["ti"]
        me = Holder.of(run, now_text(), config.cluster_nodepool_count)
        store = capacity_store(scope)
        change = store.change(
            lambda lease: take_capacity(lease, me, config.capacity_slices, lambda r: dag_run_state(ti, r)), self.log
        )
        if change.result.taken:
            self.log.info(
                "Holding %d of the %d slice(s) of capacity group '%s' (%s)",
                me.slices,
                config.capacity_slices,
                config.capacity_group,
                store.uri,
            )
            return True
        held = change.result.lease
        self.log.info(
            "Waiting for TPU capacity: group '%s' has %d slice(s), %d held by %s; this run needs %d",
            config.capacity_group,
            config.capacity_slices,
            held.slices,
            "; ".join(h.describe() for h in held.holders) or "nobody",
            me.slices,
        )
        return False


def release_capacity(scope: RunScope, log: Any) -> None:
    """Gives the run's slices back to its capacity group (after its node pools are deleted)."""
    config, run = scope.config, scope.run
    if not config.capacity_limited:
        return
    store, me = capacity_store(scope), Holder.of(run, now_text())
    change = store.change(lambda lease: drop_holder(lease, me))
    if change.result is not None:
        log.info(
            "Gave back %d slice(s) to capacity group '%s' (%s)", change.result.slices, config.capacity_group, store.uri
        )
