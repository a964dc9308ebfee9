"""The GKE cluster and its TPU node pools: created, adopted, waited for and deleted, by run ownership.

Every create adopts what exists; every delete removes only objects labelled with this run's key, so a
retried or cleared task never creates twice and never deletes a cluster or pool another run made.
GKE operations are awaited by the Google provider's ``GKEOperationTrigger`` (deferred, no worker slot).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import BaseOperator, BaseSensorOperator

from tpu_rl import gke
from tpu_rl.compat import AirflowException, AirflowFailException
from tpu_rl.config import RunConfig
from tpu_rl.hooks.cluster import kubernetes_hook_for
from tpu_rl.hooks.jobset import JobSetHook
from tpu_rl.run import RunIdentity
from tpu_rl.run_scope import RunScoped
from tpu_rl.leases import Holder, Lease, LeaseChange, cluster_lease_object, holder_has_ended
from tpu_rl.operators.leases import dag_run_state, expired_note, lease_store, now_text, release_capacity
from tpu_rl.vocabulary import GKE_LABEL_RUN_KEY, GKE_LABEL_SHARED, TPU_ACCELERATOR_LABEL, TPU_TOPOLOGY_LABEL

OPERATION_POLL_SECONDS = 10
#: After a stockout ended a pool's create, how long to wait before creating it again.
CAPACITY_RETRY_SECONDS = 120


def _cluster_hook(config: RunConfig):
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

    return GKEHook(gcp_conn_id=config.gcp_conn_id, location=config.region)


class _AwaitsGkeOperations(RunScoped, BaseOperator):
    """Defers on GKE long-running operations, one at a time: GKE refuses a node pool create or delete while
    another one runs on the cluster ("Operation ... is currently creating a node pool ... Please wait and try
    again once it is done"), so an operator with several submits the next one (``submit(context, step)``)
    only when the previous one is done.

    :param poll_interval: seconds between the trigger's checks of an operation.
    """

    def __init__(self, *, poll_interval: float = OPERATION_POLL_SECONDS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poll_interval = poll_interval

    def submit(self, context: Any, step: int, **wait: Any) -> None:
        """Submits operation ``step`` onwards (skipping what exists); defers on the first one submitted.
        ``wait``: what an operator carries from one deferral to the next (the capacity deadline)."""
        raise NotImplementedError

    def _await(self, config: RunConfig, operation_name: str, next_step: int | None = None,
               method_name: str = "operation_done") -> None:
        from airflow.providers.google.cloud.triggers.kubernetes_engine import GKEOperationTrigger

        self.defer(
            trigger=GKEOperationTrigger(
                operation_name=operation_name,
                project_id=config.project,
                location=config.region,
                gcp_conn_id=config.gcp_conn_id,
                poll_interval=self.poll_interval,
            ),
            method_name=method_name,
            kwargs={"next_step": next_step},
        )

    def _await_blocking_operation(self, config: RunConfig, client: Any, refused: Exception, step: int) -> None:
        """GKE refused operation ``step`` because another operation runs on the cluster (the create of a pool
        still waiting for capacity, say): waits for that one, deferred, then submits ``step`` again. Re-raises
        the refusal when no operation runs (then it is not about concurrency)."""
        cluster = gke.cluster_path(config)
        running = [op for op in client.list_operations(parent=gke.cluster_parent(config)).operations
                   if op.status.name in ("PENDING", "RUNNING")
                   and (op.target_link.endswith(f"/{cluster}") or f"/{cluster}/" in op.target_link)]
        if not running:
            raise refused
        blocking = running[0]
        self.log.info("GKE refuses it while operation %s (%s %s) runs (%s): waiting for that one, then trying again",
                      blocking.name, blocking.operation_type.name, blocking.target_link.rsplit("/", 1)[-1],
                      getattr(refused, "message", refused))
        self._await(config, blocking.name, next_step=step, method_name="blocking_operation_done")

    def blocking_operation_done(self, context: Any, event: dict[str, Any], next_step: int, **wait: Any) -> None:
        """Another operation ended, whatever its outcome (not ours to judge): submits ours again."""
        self.submit(context, next_step, **wait)

    def operation_done(self, context: Any, event: dict[str, Any], next_step: int | None = None, **wait: Any) -> None:
        if event["status"] in ("failed", "error"):
            raise AirflowException(f"GKE operation {event.get('operation_name')} failed: {event['message']}")
        # The provider's trigger reports every DONE operation as a success; GKE marks a failed one (a stockout,
        # a missing reservation) DONE with an error: read it.
        config = self.bind_scope(context).config
        operation = _cluster_hook(config).get_operation(event["operation_name"], project_id=config.project)
        if operation.error.code or operation.status_message:
            message = operation.error.message or operation.status_message
            self.operation_failed(context, operation, message, next_step=next_step, **wait)
            return
        self.log.info("GKE operation %s (%s %s) is done", operation.name, operation.operation_type.name,
                      operation.target_link.rsplit("/projects/", 1)[-1])
        if next_step is not None:
            self.submit(context, next_step, **wait)

    def operation_failed(self, context: Any, operation: Any, message: str, next_step: int | None, **wait: Any) -> None:
        """A DONE operation with an error: fails the task, or (a subclass) tries again."""
        raise AirflowException(f"GKE operation {operation.name} ({operation.operation_type.name}) failed: {message}")


def cluster_lease(config: RunConfig):
    """The lease of a shared cluster, in the run's bucket: runs that share a cluster share its bucket."""
    return lease_store(config, cluster_lease_object(config.project, config.region, config.cluster_name))


class CreateClusterOperator(_AwaitsGkeOperations):
    """Creates the run's cluster (cluster_mode=create), or adopts it when a previous try created it.

    cluster_mode=shared: the run first joins the cluster's lease, then creates the cluster or adopts it
    (another run of the lease made it); while the last run to leave is still deleting it, it waits.
    A cluster another live run uses is never adopted by cluster_mode=create.
    """

    #: Seconds between checks while the cluster of a shared lease is being deleted.
    CLOSING_POLL_SECONDS = 30

    def execute(self, context: Any, event: Any = None) -> None:
        from google.api_core.exceptions import AlreadyExists

        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        if not config.creates_cluster:
            self.log.info("cluster_mode is 'existing': using cluster %s, which this run will not delete", config.cluster_name)
            return
        hook = _cluster_hook(config)
        if config.shares_cluster and not self._join_lease(context, hook):
            return
        try:
            operation = hook.create_cluster(
                cluster=gke.cluster_body(config, run, datetime.now(timezone.utc)),
                project_id=config.project,
                wait_to_complete=False,
            )
        except AlreadyExists:
            cluster = hook.get_cluster(name=config.cluster_name, project_id=config.project)
            self._check_adoptable(context, cluster)
            owner = cluster.resource_labels.get(GKE_LABEL_RUN_KEY, "none")
            self.log.info(
                "Cluster %s already exists (status %s, created by run key %s; this run is %s): adopting it",
                config.cluster_name, cluster.status.name, owner, run.key,
            )
            return
        self.log.info("Creating cluster %s (operation %s)", gke.cluster_path(config), operation.name)
        self._await(config, operation.name)

    def _join_lease(self, context: Any, hook: Any) -> bool:
        """Joins the shared cluster's lease; False (after deferring) while its last holder deletes it."""
        from google.api_core.exceptions import NotFound
        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        config, run, ti = self.scope.config, self.scope.run, context["ti"]
        try:
            hook.get_cluster(name=config.cluster_name, project_id=config.project)
            cluster_exists = True
        except NotFound:
            cluster_exists = False

        def decide(lease: Lease) -> LeaseChange:
            state = lambda r: dag_run_state(ti, r)  # noqa: E731
            lease, expired = lease.expire(state, keep=run.key)
            notes = expired_note(expired)
            if lease.closing and cluster_exists and not lease.find(run.key):
                if not lease.closing_expired(state):
                    return LeaseChange(lease if expired else None, None, notes)
                notes.append(f"{lease.closer.describe()} left the cluster to delete it and its run has ended "
                             "without deleting it: this run takes the cluster over")
            joined = lease.admit(Holder.of(run, now_text()))
            return LeaseChange(joined, joined, notes)

        store = cluster_lease(config)
        change = store.change(decide)
        for note in change.notes:
            self.log.warning("%s (%s)", note, store.uri)
        if change.result is None:  # the lease is closing
            self.log.info("Shared cluster %s is being deleted by the last run that used it: waiting %d s to "
                          "create it again", config.cluster_name, self.CLOSING_POLL_SECONDS)
            self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=self.CLOSING_POLL_SECONDS)), method_name="execute")
        self.log.info("Joined the lease of shared cluster %s (%s): %s", config.cluster_name, store.uri,
                      "; ".join(h.describe() for h in change.result.holders))
        return True

    def _check_adoptable(self, context: Any, cluster: Any) -> None:
        """Refuses a cluster this run must not use as its own: in shared mode one that is not shared; in create
        mode one that shared runs use, or one another live run created (it would delete it under them)."""
        config, run = self.scope.config, self.scope.run
        shared = cluster.resource_labels.get(GKE_LABEL_SHARED) == "true"
        if config.shares_cluster and not shared:
            cluster_lease(config).change(lambda lease: LeaseChange(lease.without(run.key)))
            raise AirflowFailException(
                f"cluster_name: cluster {config.cluster_name} exists and is not a shared cluster (it is another "
                "run's, or not this package's); fix: use another cluster_name, or cluster_mode 'existing' to use "
                "it without deleting it."
            )
        if config.shares_cluster:
            recorded, mine = gke.cluster_lease_uri(cluster.description), gke.shared_lease_uri(config)
            if recorded and recorded != mine:
                cluster_lease(config).change(lambda lease: LeaseChange(lease.without(run.key)))
                raise AirflowFailException(
                    f"gcs_bucket: shared cluster {config.cluster_name} keeps its lease at {recorded}, and this run's "
                    f"would be {mine}: its runs could not see this one and would delete the cluster under it; fix: "
                    "set gcs_bucket to the bucket of the runs that share it (or use another cluster_name)."
                )
            return
        owner = gke.cluster_owner(cluster.description)
        if shared:
            raise AirflowFailException(
                f"cluster_name: cluster {config.cluster_name} is shared by runs in cluster_mode 'shared'; this run "
                "would delete it under them; fix: set cluster_mode to 'shared' (or use another cluster_name)."
            )
        if owner and (owner.dag_id, owner.run_id) != (run.dag_id, run.run_id):
            state = dag_run_state(context["ti"], owner)
            if not holder_has_ended(state):
                raise AirflowFailException(
                    f"cluster_name: cluster {config.cluster_name} belongs to the live run {owner.dag_id} / "
                    f"{owner.run_id} ({state}), which deletes it when it ends; fix: let runs share it with "
                    "cluster_mode 'shared', or use another cluster_name."
                )


class ClusterReadySensor(RunScoped, BaseSensorOperator):
    """Waits until the cluster is RUNNING (even one that already existed) and its API answers."""

    def poke(self, context: Any) -> bool:
        from google.api_core.exceptions import NotFound

        config = self.bind_scope(context).config
        if config.kubernetes_conn_id:
            from kubernetes.client import VersionApi

            version = VersionApi(kubernetes_hook_for(config).api_client).get_code()
            self.log.info("Cluster behind connection '%s' answers: Kubernetes %s", config.kubernetes_conn_id, version.git_version)
            return True
        try:
            cluster = _cluster_hook(config).get_cluster(name=config.cluster_name, project_id=config.project)
        except NotFound:
            raise AirflowFailException(
                f"cluster_name: no cluster '{config.cluster_name}' in {config.project}/{config.region}; fix: "
                "set cluster_mode to 'create', or name an existing cluster."
            ) from None
        status = cluster.status.name
        if status in ("ERROR", "DEGRADED", "STOPPING"):
            raise AirflowFailException(f"Cluster {config.cluster_name} is {status}: {cluster.status_message}")
        self.log.info("Cluster %s is %s", config.cluster_name, status)
        return status == "RUNNING"


class CreateTpuNodePoolsOperator(_AwaitsGkeOperations):
    """Creates the run's TPU node pools just before training (tpu_pool_mode=per_run); otherwise checks
    that the cluster has the slice's nodes, so a missing slice fails here and not as a pending JobSet.

    While GKE has no capacity for a pool it waits, deferred, at most ``capacity_wait_minutes`` from the
    task's start: through a create that GKE holds (its reason logged about once a minute), and through a
    stockout that ends the create, after which it replaces the failed pool every
    ``capacity_retry_interval`` seconds. A new try starts a new wait.

    :param capacity_retry_interval: seconds between a stockout and the next create of the pool.
    """

    def __init__(self, *, capacity_retry_interval: float = CAPACITY_RETRY_SECONDS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.capacity_retry_interval = capacity_retry_interval

    def execute(self, context: Any) -> None:
        config = self.bind_scope(context).config
        if not config.tpu_pools_per_run:
            self._check_slice_nodes(config)
            return
        self.submit(context, 0, capacity_deadline=time.time() + 60 * config.capacity_wait_minutes)

    def submit(self, context: Any, step: int, *, capacity_deadline: float = 0.0) -> None:
        """``capacity_deadline``: POSIX time until which a pool without capacity is waited for (0, as for a
        deferral made before capacity waits existed: not at all)."""
        from google.api_core.exceptions import AlreadyExists
        from google.cloud.container_v1 import NodePool

        from tpu_rl.triggers.gke import TpuPoolCreateTrigger

        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        hook = _cluster_hook(config)
        client = hook.get_cluster_manager_client()
        for index in range(step, config.cluster_nodepool_count):
            pool = NodePool.from_json(json.dumps(gke.tpu_node_pool(config, run, index)))
            name = f"{gke.cluster_path(config)}/nodePools/{pool.name}"
            try:
                operation = client.create_node_pool(parent=gke.cluster_path(config), node_pool=pool)
            except AlreadyExists:
                existing = client.get_node_pool(name=name)
                if existing.status != NodePool.Status.ERROR:
                    self.log.info("Node pool %s already exists (%s): adopting it", pool.name, existing.status.name)
                    continue
                # An earlier create failed (a stockout leaves the pool in ERROR): replace it.
                self.log.warning("Node pool %s is in ERROR (%s): deleting it to create it again", pool.name,
                                 existing.status_message)
                hook.wait_for_operation(client.delete_node_pool(name=name), project_id=config.project)
                operation = client.create_node_pool(parent=gke.cluster_path(config), node_pool=pool)
            self.log.info("Creating node pool %s (%s, %s: %s)", pool.name, config.compute_type,
                          config.capacity_type, gke.capacity_fields(config))
            self.defer(
                trigger=TpuPoolCreateTrigger(
                    operation_name=operation.name,
                    project_id=config.project,
                    location=config.region,
                    gcp_conn_id=config.gcp_conn_id,
                    poll_interval=self.poll_interval,
                    pool_path=name,
                    capacity_deadline=capacity_deadline,
                ),
                method_name="operation_done",
                kwargs={"next_step": index + 1, "capacity_deadline": capacity_deadline},
            )

    def operation_done(self, context: Any, event: dict[str, Any], next_step: int | None = None, **wait: Any) -> None:
        if event["status"] == "capacity_timeout":
            config = self.bind_scope(context).config
            raise AirflowFailException(
                f"GKE had no capacity for TPU node pool {event['node_pool']} within capacity_wait_minutes "
                f"({config.capacity_wait_minutes}): {event['message']}; {self._capacity_hint(config)}."
            )
        super().operation_done(context, event, next_step, **wait)

    def operation_failed(self, context: Any, operation: Any, message: str, next_step: int | None, *,
                         capacity_deadline: float = 0.0) -> None:
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger

        config = self.bind_scope(context).config
        pool = operation.target_link.rsplit("/", 1)[-1]
        if not gke.is_capacity_error(message):
            raise AirflowFailException(
                f"GKE could not create TPU node pool {pool}: {message}; fix: see the message; delete_tpu_pools "
                "removes the failed pool."
            )
        retry_at = time.time() + self.capacity_retry_interval
        if retry_at > capacity_deadline:
            raise AirflowFailException(
                f"GKE could not create TPU node pool {pool}: {message}; {self._capacity_hint(config)}."
            )
        self.log.warning("No capacity for node pool %s (GKE: %s); creating it again in %.0f s (waiting until %s)",
                         pool, message, self.capacity_retry_interval,
                         datetime.fromtimestamp(capacity_deadline, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
        self.defer(
            trigger=DateTimeTrigger(moment=datetime.fromtimestamp(retry_at, timezone.utc)),
            method_name="retry_after_stockout",
            kwargs={"step": next_step - 1, "capacity_deadline": capacity_deadline},
        )

    def retry_after_stockout(self, context: Any, event: Any, *, step: int, capacity_deadline: float) -> None:
        self.submit(context, step, capacity_deadline=capacity_deadline)

    @staticmethod
    def _capacity_hint(config: RunConfig) -> str:
        return (
            f"fix: there is no {config.tpu_type} capacity in {config.zone} now: trigger the run again later or "
            "with a longer capacity_wait_minutes, use another capacity_type (a reservation; flex_start waits "
            "for a slice without a reservation) or another zone; delete_tpu_pools removes the failed pool"
        )

    def _check_slice_nodes(self, config: RunConfig) -> None:
        selector = f"{TPU_ACCELERATOR_LABEL}={config.slice.generation.accelerator},{TPU_TOPOLOGY_LABEL}={config.topology}"
        nodes = JobSetHook(self.scope.cluster_target).list_nodes(selector)
        needed = config.hosts_per_slice * config.cluster_nodepool_count
        self.log.info("Found %d nodes with %s (the training needs %d)", len(nodes), selector, needed)
        if len(nodes) < needed:
            raise AirflowFailException(
                f"tpu_pool_mode: the cluster has {len(nodes)} {config.tpu_type} {config.topology} hosts, the run needs "
                f"{needed}; fix: create the TPU node pool(s), or set tpu_pool_mode to 'per_run'."
            )


#: XCom key of ``delete_tpu_pools``: when each slice the run created had its nodes (``gke.slice_times``).
XCOM_TPU_SLICES = "tpu_slices"


class DeleteTpuNodePoolsOperator(_AwaitsGkeOperations):
    """Deletes the TPU node pools this run created, right after training (teardown of the create).

    Once they are gone it pushes when each slice's nodes existed (XCom ``tpu_slices``), from GKE's own
    records of the pools' create and delete operations, so a retried create or delete counts once.
    """

    def execute(self, context: Any) -> None:
        config = self.bind_scope(context).config
        if not config.tpu_pools_per_run:
            self.log.info("tpu_pool_mode is '%s': no node pool of this run to delete", config.tpu_pool_mode)
            return
        self.submit(context, 0)

    def submit(self, context: Any, step: int) -> None:
        from google.api_core.exceptions import FailedPrecondition, NotFound

        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        client = _cluster_hook(config).get_cluster_manager_client()
        for index in range(step, config.cluster_nodepool_count):
            name = f"{gke.cluster_path(config)}/nodePools/{run.tpu_pool_name(index)}"
            try:
                operation = client.delete_node_pool(name=name)
            except NotFound:
                self.log.info("Node pool %s does not exist: nothing to delete", name)
                continue
            except FailedPrecondition as refused:  # e.g. its create still waits for capacity after a timeout
                self.log.info("Cannot delete node pool %s yet", name)
                self._await_blocking_operation(config, client, refused, index)
            self.log.info("Deleting node pool %s", name)
            self._await(config, operation.name, next_step=index + 1)
        release_capacity(config, run, self.log)
        self._record_slice_times(context)

    def _record_slice_times(self, context: Any) -> None:
        """The TPU time is reported, never a reason to fail the teardown: an unreadable list is logged."""
        config, run = self.scope.config, self.scope.run
        pools = [run.tpu_pool_name(i) for i in range(config.cluster_nodepool_count)]
        try:
            listed = _cluster_hook(config).get_cluster_manager_client().list_operations(
                parent=gke.cluster_parent(config)
            ).operations
        except Exception as error:
            self.log.warning("Could not list GKE's operations to count the slices' TPU time: %s", error)
            return
        cluster_pools = f"/clusters/{config.cluster_name}/nodePools/"
        operations = [
            {"type": op.operation_type.name, "pool": op.target_link.rsplit("/", 1)[-1], "end": op.end_time,
             "failed": bool(op.error.code or op.status_message)}
            for op in listed if cluster_pools in op.target_link
        ]
        times = gke.slice_times(operations, pools)
        for slice_ in times:
            self.log.info("TPU slice %s: nodes from %s to %s", slice_["pool"], slice_["nodes_from"], slice_["nodes_gone"])
        context["ti"].xcom_push(key=XCOM_TPU_SLICES, value=times)


class DeleteClusterOperator(_AwaitsGkeOperations):
    """Teardown: deletes the cluster only if this run created it; in an existing cluster it removes the
    run's token Secret instead. GKE refuses deletes while another operation runs: retries handle that."""

    def execute(self, context: Any) -> None:
        from google.api_core.exceptions import NotFound

        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        if not config.creates_cluster:
            self._delete_secret(config, run)
            return
        if config.shares_cluster and not self._leave_lease(context, closing=not config.keep_cluster):
            self._delete_secret(config, run)
            return
        if config.keep_cluster:
            self.log.warning("keep_cluster is set: cluster %s stays up and keeps costing money", config.cluster_name)
            return
        hook = _cluster_hook(config)
        try:
            cluster = hook.get_cluster(name=config.cluster_name, project_id=config.project)
        except NotFound:
            self.log.info("Cluster %s does not exist: nothing to delete", config.cluster_name)
            return
        owner = cluster.resource_labels.get(GKE_LABEL_RUN_KEY)
        if config.shares_cluster and cluster.resource_labels.get(GKE_LABEL_SHARED) != "true":
            self.log.warning("Cluster %s is not a shared cluster: leaving it", config.cluster_name)
            return
        if owner != run.key and not config.shares_cluster:
            self.log.warning(
                "Cluster %s was created by run key %s, not by this run (%s): leaving it", config.cluster_name, owner, run.key
            )
            return
        operation = hook.delete_cluster(name=config.cluster_name, project_id=config.project, wait_to_complete=False)
        if operation is not None:
            self.log.info("Deleting cluster %s (operation %s)", config.cluster_name, operation.name)
            self._await(config, operation.name)

    def _leave_lease(self, context: Any, closing: bool) -> bool:
        """Leaves the shared cluster's lease; True when no live run holds it any more. With ``closing`` this
        run then deletes the cluster, and marks the lease closing (with itself as the closer) so that a run
        joining now waits for the delete; without it (keep_cluster) the cluster stays, free to join."""
        config, run, ti = self.scope.config, self.scope.run, context["ti"]
        me = Holder.of(run, now_text())

        def decide(lease: Lease) -> LeaseChange:
            retrying_delete = lease.closing and (lease.closer is None or lease.closer.key == run.key)
            if not lease.find(run.key) and not retrying_delete:
                return LeaseChange(None, lease.holders or ("nobody: this run does not hold it",))
            lease, expired = lease.expire(lambda r: dag_run_state(ti, r), keep=run.key)
            lease = lease.without(run.key)
            if lease.holders:
                return LeaseChange(lease, lease.holders, expired_note(expired))
            return LeaseChange(lease.closed_by(me) if closing else lease, (), expired_note(expired))

        store = cluster_lease(config)
        change = store.change(decide)
        for note in change.notes:
            self.log.warning("%s (%s)", note, store.uri)
        if change.result:
            self.log.info("Shared cluster %s stays: still used by %s", config.cluster_name,
                          "; ".join(h if isinstance(h, str) else h.describe() for h in change.result))
            return False
        self.log.info("This run is the last of shared cluster %s's lease (%s)%s", config.cluster_name, store.uri,
                      ": deleting the cluster" if closing else "")
        return True

    def _delete_secret(self, config: RunConfig, run: RunIdentity) -> None:
        if JobSetHook(self.scope.cluster_target).delete_secret(run.secret_name(), config.namespace):
            self.log.info("Deleted Secret %s/%s; the existing cluster stays", config.namespace, run.secret_name())
        else:
            self.log.info("No Secret %s to delete; the existing cluster stays", run.secret_name())
