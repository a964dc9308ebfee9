"""The GKE cluster and its TPU node pools: created, adopted, waited for and deleted, by run ownership.

Every create adopts what exists; every delete removes only objects labelled with this run's key, so a
retried or cleared task never creates twice and never deletes a cluster or pool another run made.
GKE operations are awaited by ``triggers.gke.GkeOperationTrigger`` (deferred, no worker slot).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import BaseOperator, BaseSensorOperator

from tpu_rl import candidates, gke
from tpu_rl.candidates import Candidate
from tpu_rl.compat import AirflowException, AirflowFailException
from tpu_rl.config import RunConfig
from tpu_rl.contract import CAPACITY_CANDIDATES, TRAINING_CAPACITY, XCOM_CAPACITY, XCOM_TPU_SLICES
from tpu_rl.failover import Attempt, GiveUp, Outcome, candidate_at, describe_attempts, next_candidate
from tpu_rl.hooks.gke import GkeApiHook, GkeRefusedError
from tpu_rl.leases import holder_has_ended
from tpu_rl.operators.leases import (
    dag_run_state,
    drop_from_cluster_lease,
    join_cluster_lease,
    leave_cluster_lease,
    release_capacity,
)
from tpu_rl.operators.training_record import record_capacity_attempts, recorded_capacity_attempts
from tpu_rl.run import RunIdentity
from tpu_rl.run_scope import RunScoped
from tpu_rl.timestamps import parse_time
from tpu_rl.vocabulary import GKE_LABEL_RUN_KEY, GKE_LABEL_SHARED, TPU_ACCELERATOR_LABEL, TPU_TOPOLOGY_LABEL

OPERATION_POLL_SECONDS = 10
#: After a stockout ended a pool's create, how long to wait before creating it again.
CAPACITY_RETRY_SECONDS = 120
#: After GKE refused a request for throttling (or while busy with an operation it does not list), how long to wait
#: before asking again; and after how many refusals in a row (about 20 minutes) the task fails.
REFUSED_RETRY_SECONDS = 30
REFUSED_RETRIES = 40


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _which(candidate: int, attempts: list[dict[str, Any]] | None) -> dict[str, Any]:
    """What a deferral carries of the capacity candidates: nothing on the first with no attempt (the deferrals of
    a one-candidate run are those of earlier versions)."""
    return {"candidate": candidate, "attempts": list(attempts)} if candidate or attempts else {}


def _arrival(config: RunConfig, candidate: int, attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """The keywords of the first pass on ``candidate``: its wait runs from now."""
    wait = config.candidates[candidate].wait_minutes
    return {"capacity_deadline": time.time() + 60 * wait, **_which(candidate, attempts)}


class _AwaitsGkeOperations(RunScoped, BaseOperator):
    """Defers on GKE long-running operations, one deferral at a time: an operator submits what it can
    (``submit(context, step)``: the TPU pools' creates and deletes all at once, since GKE runs operations on
    different node pools side by side; the cluster's operations one after another, since GKE refuses any other
    operation during one of them), defers on one operation still running, and submits again when it is done.

    :param poll_interval: seconds between the trigger's checks of an operation.
    :param refused_retry_interval: seconds before a request GKE refused for throttling is asked again.
    """

    def __init__(
        self,
        *,
        poll_interval: float = OPERATION_POLL_SECONDS,
        refused_retry_interval: float = REFUSED_RETRY_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.poll_interval = poll_interval
        self.refused_retry_interval = refused_retry_interval

    def submit(self, context: Any, step: int, **wait: Any) -> Any:
        """Submits operation ``step`` onwards (skipping what exists); defers on the first one submitted.
        ``wait``: what an operator carries from one deferral to the next (the capacity deadline)."""
        raise NotImplementedError

    def _wait_for(self, config: RunConfig, operation_name: str) -> dict[str, Any]:
        """The keywords of a wait for GKE's operation ``operation_name`` in the run's project and region (a
        ``triggers.gke.GkeOperationTrigger``, or its pool-create subclass with its own keywords added)."""
        return {
            "operation_name": operation_name,
            "project_id": config.project,
            "location": config.region,
            "gcp_conn_id": config.gcp_conn_id,
            "poll_interval": self.poll_interval,
        }

    def _await(
        self, config: RunConfig, operation_name: str, next_step: int | None = None, method_name: str = "operation_done"
    ) -> None:
        from tpu_rl.triggers.gke import GkeOperationTrigger

        self.defer(
            trigger=GkeOperationTrigger(**self._wait_for(config, operation_name)),
            method_name=method_name,
            kwargs={"next_step": next_step},
        )

    def wait_out(self, refused: GkeRefusedError, what: str, refusals: int, **wait: Any) -> None:
        """Defers until GKE takes a refused request again, then submits again (:meth:`resubmit`): through the
        operation that blocks it (the run's own, or GKE's: a control-plane upgrade, an auto-repair), or
        ``refused_retry_interval`` when GKE throttles. Fails after :data:`REFUSED_RETRIES` refusals in a row, and at
        once when IAM refuses (the message names the permission and the role to grant)."""
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger

        from tpu_rl.triggers.gke import GkeOperationTrigger

        if refused.refusal is gke.Refusal.PERMISSION:  # no wait grants a role
            raise AirflowFailException(f"GKE refused to {what}: {refused.message}")
        if refusals >= REFUSED_RETRIES:
            raise AirflowException(
                f"GKE refused to {what} {refusals} times in a row: {refused.message}; fix: see the message (GKE "
                "runs at most 5 operations at once on a cluster, and refuses most while its own upgrade or repair "
                "runs); a retry of this task asks again."
            )
        config, kwargs = self.scope.config, {**wait, "refusals": refusals + 1}
        if (blocking := refused.blocking) is not None:
            self.log.info(
                "GKE refuses to %s while operation %s (%s) runs (%s): waiting for it",
                what,
                blocking.name,
                blocking.operation_type.name,
                refused.message,
            )
            trigger: Any = GkeOperationTrigger(**self._wait_for(config, blocking.name))
        else:
            self.log.warning(
                "GKE refuses to %s for now (%s: %s): asking again in %.0f s",
                what,
                refused.refusal,
                refused.message,
                self.refused_retry_interval,
            )
            trigger = DateTimeTrigger(moment=datetime.now(UTC) + timedelta(seconds=self.refused_retry_interval))
        self.defer(trigger=trigger, method_name="resubmit", kwargs=kwargs)

    def resubmit(self, context: Any, event: Any = None, **wait: Any) -> Any:
        """After the wait for a refused request: submits again. The blocking operation's outcome is not the run's
        to judge (GKE's upgrade, another pool's create)."""
        return self.submit(context, 0, **wait)

    def operation_done(self, context: Any, event: dict[str, Any], next_step: int | None = None, **wait: Any) -> Any:
        if event["status"] in ("failed", "error"):
            raise AirflowException(f"GKE operation {event.get('operation_name')} failed: {event['message']}")
        # The trigger reports every DONE operation as a success; GKE marks a failed one (a stockout,
        # a missing reservation) DONE with an error: read it.
        operation = self.bind_scope(context).gke.get_operation(event["operation_name"])
        if operation.error.code or operation.status_message:
            message = operation.error.message or operation.status_message
            return self.operation_failed(context, operation, message, next_step=next_step, **wait)
        self.log.info(
            "GKE operation %s (%s %s) is done",
            operation.name,
            operation.operation_type.name,
            operation.target_link.rsplit("/projects/", 1)[-1],
        )
        if next_step is not None:
            return self.submit(context, next_step, **wait)

    def operation_failed(self, context: Any, operation: Any, message: str, next_step: int | None, **wait: Any) -> None:
        """A DONE operation with an error: fails the task, or (a subclass) tries again."""
        raise AirflowException(f"GKE operation {operation.name} ({operation.operation_type.name}) failed: {message}")


class CreateClusterOperator(_AwaitsGkeOperations):
    """Creates the run's cluster (cluster_mode=create), or adopts it when a previous try created it.

    cluster_mode=shared: the run first joins the cluster's lease, then creates the cluster or adopts it
    (another run of the lease made it); while the last run to leave is still deleting it, it waits.
    A cluster another live run uses is never adopted by cluster_mode=create.
    """

    #: Seconds between checks while the cluster of a shared lease is being deleted.
    CLOSING_POLL_SECONDS = 30

    def execute(self, context: Any, event: Any = None, refusals: int = 0) -> None:
        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        if not config.creates_cluster:
            self.log.info(
                "cluster_mode is 'existing': using cluster %s, which this run will not delete", config.cluster_name
            )
            return
        hook = scope.gke
        if config.shares_cluster and not self._join_lease(context, hook):
            return
        try:
            operation = hook.create_cluster(gke.cluster_body(config, run, datetime.now(UTC)))
        except GkeRefusedError as refused:
            self.wait_out(refused, f"create cluster {config.cluster_name}", refusals)
        if operation is None:
            cluster = hook.get_cluster(config.cluster_name)
            if cluster is None:
                raise AirflowException(
                    f"GKE said cluster {config.cluster_name} exists, then that it does not (being "
                    "deleted?): a retry creates it"
                )
            self._check_adoptable(context, cluster)
            owner = cluster.resource_labels.get(GKE_LABEL_RUN_KEY, "none")
            if cluster.status.name == "ERROR" and owner == run.key and not config.shares_cluster:
                self._replace_failed_cluster(context, hook, cluster, refusals)
                return
            self.log.info(
                "Cluster %s already exists (status %s, created by run key %s; this run is %s): adopting it",
                config.cluster_name,
                cluster.status.name,
                owner,
                run.key,
            )
            return
        self.log.info("Creating cluster %s (operation %s)", gke.cluster_path(config), operation)
        self._await(config, operation)

    def submit(self, context: Any, step: int, refusals: int = 0, **wait: Any) -> None:
        """After the delete of a cluster whose create failed, or a refused create: creates it again."""
        self.execute(context, refusals=refusals)

    def _replace_failed_cluster(self, context: Any, hook: GkeApiHook, cluster: Any, refusals: int) -> None:
        """A cluster an earlier try of this run created and GKE left in ERROR (its create failed): GKE does not
        repair it and nothing can run on it, so it is deleted and created again (as Terraform re-creates a
        cluster created in an error state)."""
        config = self.scope.config
        self.log.warning(
            "Cluster %s, created by an earlier try of this run, is ERROR (%s): deleting it to create it again",
            config.cluster_name,
            cluster.status_message or "GKE gave no reason",
        )
        try:
            operation = hook.delete_cluster(config.cluster_name)
        except GkeRefusedError as refused:
            self.wait_out(refused, f"delete cluster {config.cluster_name}", refusals)
        if operation is None:  # gone meanwhile
            self.execute(context, refusals=refusals)
            return
        self.log.info("Deleting cluster %s (operation %s)", config.cluster_name, operation)
        self._await(config, operation, next_step=0)

    def _join_lease(self, context: Any, hook: GkeApiHook) -> bool:
        """Joins the shared cluster's lease; False (after deferring) while its last holder deletes it."""
        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        config = self.scope.config
        cluster_exists = hook.get_cluster(config.cluster_name) is not None
        if join_cluster_lease(self.scope, context["ti"], cluster_exists, self.log) is None:  # the lease is closing
            self.log.info(
                "Shared cluster %s is being deleted by the last run that used it: waiting %d s to create it again",
                config.cluster_name,
                self.CLOSING_POLL_SECONDS,
            )
            self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=self.CLOSING_POLL_SECONDS)), method_name="execute")
        return True

    def _check_adoptable(self, context: Any, cluster: Any) -> None:
        """Refuses a cluster this run must not use as its own: in shared mode one that is not shared; in create
        mode one that shared runs use, or one another live run created (it would delete it under them)."""
        config, run = self.scope.config, self.scope.run
        shared = cluster.resource_labels.get(GKE_LABEL_SHARED) == "true"
        if config.shares_cluster and not shared:
            drop_from_cluster_lease(self.scope)
            raise AirflowFailException(
                f"cluster_name: cluster {config.cluster_name} exists and is not a shared cluster (it is another "
                "run's, or not this package's); fix: use another cluster_name, or cluster_mode 'existing' to use "
                "it without deleting it."
            )
        if config.shares_cluster:
            recorded, mine = gke.cluster_lease_uri(cluster.description), gke.shared_lease_uri(config)
            if recorded and recorded != mine:
                drop_from_cluster_lease(self.scope)
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
        scope = self.bind_scope(context)
        config = scope.config
        if config.kubernetes_conn_id:
            version = scope.kubernetes.server_version()
            self.log.info("Cluster behind connection '%s' answers: Kubernetes %s", config.kubernetes_conn_id, version)
            return True
        cluster = scope.gke.get_cluster(config.cluster_name)
        if cluster is None:
            raise AirflowFailException(
                f"cluster_name: no cluster '{config.cluster_name}' in {config.project}/{config.region}; fix: "
                "set cluster_mode to 'create', or name an existing cluster."
            )
        status = cluster.status.name
        if status in ("ERROR", "DEGRADED", "STOPPING"):
            raise AirflowFailException(f"Cluster {config.cluster_name} is {status}: {cluster.status_message}")
        self.log.info("Cluster %s is %s", config.cluster_name, status)
        return status == "RUNNING"


class TpuPoolPass(_AwaitsGkeOperations):
    """Brings the run's TPU node pools (tpu_pool_mode=per_run) to RUNNING on a capacity candidate, deferred:
    ``create_tpu_pools`` runs it before training, ``train_rl`` again to move the pools after too many preemptions
    on one candidate. Once every pool is RUNNING there, :meth:`pools_ready` says what comes next.

    All pools at once: GKE runs operations on different node pools side by side ("Add and manage node
    pools"; xpk creates up to 100 at once), so N slices take about one create. Each pass brings every pool a
    step further and defers on one operation still in flight, then looks again: a missing pool is created; a
    RUNNING one adopted; one still PROVISIONING (or RECONCILING, STOPPING) waited for through its operation;
    one GKE created only partly or not at all (RUNNING_WITH_ERROR, ERROR: a stockout leaves either) deleted, to
    be created again. A quota shortfall fails at once, naming the quota (no wait brings quota).

    While GKE has no capacity for a pool it waits, deferred: through a create GKE still runs, until GKE ends it
    (a slow create and one GKE holds for capacity look alike; GKE ends a held one with a stockout after about
    35 minutes), and after a stockout, replacing the failed pool every ``capacity_retry_interval`` seconds
    until ``capacity_wait_minutes`` from the task's start have passed. A new try starts a new wait.

    With several ``capacity_candidates``, what would fail the task on one candidate (a stockout past its wait,
    missing quota) moves the run to the next (``tpu_rl.failover.next_candidate``): every pool not on the new
    candidate is deleted (a create GKE still runs on it is waited for first) and created there, with the new
    candidate's wait from then. The deferrals carry the candidate and the attempts (left out with one candidate,
    so its deferrals are those of earlier versions), and the run's training record keeps the attempts: a new try
    (or a cleared task) goes on from the candidate they lead to, or a later one the run's pools are on, adopting
    its RUNNING pools and waiting for those being created; a candidate left is not tried again in the run.

    :param capacity_retry_interval: seconds between a stockout and the next create of the pool.
    """

    def __init__(self, *, capacity_retry_interval: float = CAPACITY_RETRY_SECONDS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.capacity_retry_interval = capacity_retry_interval

    def pools_ready(self, context: Any, candidate: int, attempts: list[dict[str, Any]]) -> Any:
        """Every pool of the run is RUNNING on ``candidate``: says so (the log, XCom ``capacity``)."""
        self._report_candidates(context, candidate, attempts)

    def pass_from_resume_point(self, context: Any) -> Any:
        """A pass on the candidate the run is on (:meth:`_resume_point`); with one candidate, on it."""
        candidate, attempts = self._resume_point() if len(self.scope.config.candidates) > 1 else (0, [])
        return self.pass_on(context, candidate, attempts)

    def pass_on(self, context: Any, candidate: int, attempts: list[dict[str, Any]]) -> Any:
        """A pass that brings the pools to ``candidate`` (``attempts``: why the run left the others), its wait
        from now."""
        return self.submit(context, 0, **_arrival(self.scope.config, candidate, attempts))

    def _resume_point(self) -> tuple[int, list[dict[str, Any]]]:
        """Where this try goes on from (a retry, a cleared task): the candidate the run's recorded attempts lead
        to, or a later one its pools are already on (a record without attempts: the pools are the only memory).
        There the pass adopts the RUNNING pools and waits for those being created; a candidate the record says
        was left is not tried again. When every candidate was left, a new round starts: on the candidate the
        pools are RUNNING on (a training preempted too often on the last one: its slices are not moved back), else
        from the first."""
        config, scope = self.scope.config, self.scope
        attempts = recorded_capacity_attempts(scope.bucket, scope.layout.training_record_object)
        decision = next_candidate(config.candidates, attempts, config.max_preemptions_per_candidate)
        if isinstance(decision, GiveUp):
            self.log.warning(
                "Every capacity candidate was left by an earlier try (%s): trying them all again",
                "; ".join(decision.tried),
            )
            record_capacity_attempts(scope.bucket, scope.layout.training_record_object, [])
            return max(self._pools_candidates(running_only=True), default=0), []
        found = self._pools_candidates()
        start = max([decision.index, *found])
        for line in describe_attempts(config.candidates, attempts):
            self.log.info("Capacity %s (an earlier try)", line)
        if start:
            on = "the run's pools are on it" if start in found else decision.why
            self.log.info("Going on from candidate %d (%s): %s", start, config.candidates[start].describe(), on)
        return start, [attempt.to_json() for attempt in attempts]

    def _pools_candidates(self, running_only: bool = False) -> set[int]:
        """The candidates the run's existing pools (``running_only``: its RUNNING ones) are on, told by their zones,
        Spot, flex-start and reservation."""
        from google.api_core.exceptions import NotFound

        config, run, hook = self.scope.config, self.scope.run, self.scope.gke
        found = set()
        for index in range(config.cluster_nodepool_count):
            try:
                pool = hook.get_node_pool(config.cluster_name, run.tpu_pool_name(index))
            except NotFound:
                continue
            if running_only and pool.status.name != "RUNNING":
                continue
            found |= {
                number
                for number, candidate in enumerate(config.candidates)
                if self._on_candidate(config, pool, gke.tpu_node_pool(config, run, index, candidate))
            }
        return found

    def submit(
        self,
        context: Any,
        step: int = 0,
        *,
        capacity_deadline: float = 0.0,
        refusals: int = 0,
        candidate: int = 0,
        attempts: list[dict[str, Any]] | None = None,
    ) -> Any:
        """One pass over the run's pools (``step`` is read by nothing: every pass looks at all of them), with at
        most :data:`~tpu_rl.gke.CLUSTER_OPERATIONS_LIMIT` operations in flight (GKE refuses more on a cluster).
        ``capacity_deadline``: POSIX time until which a pool without capacity is waited for (0, as for a
        deferral made before capacity waits existed: not at all). A pool GKE refuses for now (throttling,
        another operation) waits for the next pass. ``candidate``: the index of the capacity candidate the pools
        are created on; ``attempts``: why the run left the earlier ones (``failover.Attempt.to_json``)."""
        from tpu_rl.triggers.gke import TpuPoolCreateTrigger

        scope = self.bind_scope(context)
        config, run, attempts = scope.config, scope.run, list(attempts or [])
        which = _which(candidate, attempts)
        in_flight: list[tuple[str, str]] = []
        refused: GkeRefusedError | None = None
        for index in range(config.cluster_nodepool_count):
            if len(in_flight) >= gke.CLUSTER_OPERATIONS_LIMIT:
                break  # GKE runs no more at once: the next pass goes on
            on = config.candidates[candidate]
            body = gke.tpu_node_pool(config, run, index, on)
            try:
                operation, pool = self._advance_pool(scope.gke, config, body, on)
            except GkeRefusedError as error:
                if error.refusal in (gke.Refusal.QUOTA, gke.Refusal.PERMISSION, gke.Refusal.CAPACITY):
                    return self._refused_at_once(context, error, body["name"], capacity_deadline, candidate, attempts)
                refused = error
                break  # GKE takes no more now: the next pass goes on
            if operation:
                in_flight.append((operation, pool))
        if not in_flight:
            if refused is not None:
                self.wait_out(
                    refused, "create the TPU node pools", refusals, capacity_deadline=capacity_deadline, **which
                )
            self.log.info("The run's %d TPU node pool(s) are RUNNING", config.cluster_nodepool_count)
            return self.pools_ready(context, candidate, attempts)
        operation, pool = in_flight[0]
        self.defer(
            trigger=TpuPoolCreateTrigger(
                **self._wait_for(config, operation),
                pool_path=f"{gke.cluster_path(config)}/nodePools/{pool}",
                capacity_deadline=capacity_deadline,
            ),
            method_name="operation_done",
            kwargs={"next_step": 0, "capacity_deadline": capacity_deadline, **which},
        )

    def _refused_at_once(
        self,
        context: Any,
        error: GkeRefusedError,
        pool: str,
        capacity_deadline: float,
        candidate: int,
        attempts: list[dict[str, Any]],
    ) -> Any:
        """GKE refused the create of ``pool`` for good on this candidate: missing quota leaves the candidate, a
        missing permission fails the task, capacity that is not there (a reservation with too few VMs left) is a
        stockout (the pool created again within the wait, the candidate left past it)."""
        config = self.scope.config
        if error.refusal is gke.Refusal.PERMISSION:
            raise AirflowFailException(f"GKE refused TPU node pool {pool}: {error.message}") from None
        if error.refusal is gke.Refusal.CAPACITY:
            return self._create_failed(context, pool, error.message, capacity_deadline, candidate, attempts)
        failure = f"GKE refused TPU node pool {pool}: {error.message}; "
        hint = gke.quota_hint(config.on_candidate(config.candidates[candidate]), error.message)
        return self._leave(context, Outcome.QUOTA, failure + hint, error.message, **_which(candidate, attempts))

    def _advance_pool(
        self, hook: GkeApiHook, config: RunConfig, body: dict[str, Any], candidate: Candidate
    ) -> tuple[str | None, str]:
        """Moves one pool towards RUNNING on ``candidate`` (``body``: its request there): (the operation to wait
        for, or None when it is RUNNING there; its name). Raises GKE's refusal (:class:`GkeRefusedError`)."""
        name, cluster = body["name"], config.cluster_name
        operation = hook.create_node_pool(cluster, body)
        if operation is not None:
            self.log.info(
                "Creating node pool %s (%s, %s: %s)",
                name,
                config.compute_type,
                candidate.describe(),
                gke.capacity_fields(config, candidate),
            )
            return operation, name
        pool = hook.get_node_pool(cluster, name)
        status, here = pool.status.name, self._on_candidate(config, pool, body)
        if status == "RUNNING" and here:
            self.log.info("Node pool %s already exists and is RUNNING: adopting it", name)
            return None, name
        # GKE may still be creating a pool it shows in ERROR (a slow create does, before RUNNING: NVIDIA/aicr 2065):
        # whatever its status, an operation GKE runs on it is waited for, never cut short by a delete.
        operation = hook.running_operation(cluster, name)
        if operation is not None:
            self.log.info(
                "Node pool %s is %s: waiting for GKE's operation %s (%s)",
                name,
                status,
                operation.name,
                operation.operation_type.name,
            )
            return operation.name, name
        if here and status in ("PROVISIONING", "RECONCILING", "STOPPING"):
            raise AirflowException(f"Node pool {name} is {status} and GKE lists no operation on it; try again")
        # RUNNING_WITH_ERROR (partly created, as after a stockout) or ERROR: it would never have all its hosts; or
        # a pool of a capacity candidate the run has left.
        self.log.warning(
            "Node pool %s is %s (%s): deleting it to create it again%s",
            name,
            status,
            "; ".join(c.message for c in pool.conditions) or pool.status_message,
            "" if here else f" on {candidate.describe()}",
        )
        deleting = hook.delete_node_pool(cluster, name)
        return (deleting, name) if deleting else self._advance_pool(hook, config, body, candidate)  # gone: create

    @staticmethod
    def _on_candidate(config: RunConfig, pool: Any, body: dict[str, Any]) -> bool:
        """Whether an existing pool is the one ``body`` asks for: always with one candidate (as before candidates
        existed); with several, when its zones and capacity fields are the candidate's."""
        if len(config.candidates) == 1:
            return True
        found = {
            "locations": list(pool.locations),
            "config": {
                "spot": pool.config.spot,
                "flex_start": pool.config.flex_start,
                "reservation_affinity": {"values": list(pool.config.reservation_affinity.values)},
            },
        }
        return gke.candidate_fields(found) == gke.candidate_fields(body)

    def operation_done(self, context: Any, event: dict[str, Any], next_step: int | None = None, **wait: Any) -> Any:
        which = _which(wait.get("candidate", 0), wait.get("attempts"))
        if event["status"] in ("quota", "capacity_timeout") and not self._failed_here(
            self.bind_scope(context).config, event["node_pool"], wait.get("candidate", 0)
        ):
            self._await_left_behind(event, wait)
            return
        if event["status"] == "quota":
            config = self.bind_scope(context).config
            on = config.on_candidate(config.candidates[wait.get("candidate", 0)])
            failure = (
                f"GKE cannot create TPU node pool {event['node_pool']}: {event['message']}; "
                f"{gke.quota_hint(on, event['message'])}"
            )
            return self._leave(context, Outcome.QUOTA, failure, event["message"], **which)
        if event["status"] == "capacity_timeout":
            config = self.bind_scope(context).config
            index = wait.get("candidate", 0)
            on = config.on_candidate(config.candidates[index])
            wait_field = (
                candidates.field_name(index, "wait_minutes") if config.capacity_candidates else "capacity_wait_minutes"
            )
            failure = (
                f"GKE had no capacity for TPU node pool {event['node_pool']} within {wait_field} "
                f"({on.capacity_wait_minutes}): {event['message']}; {self._capacity_hint(on)}."
            )
            return self._leave(context, Outcome.WAIT_EXPIRED, failure, event["message"], **which)
        return super().operation_done(context, event, next_step, **wait)

    def _await_left_behind(self, event: dict[str, Any], wait: dict[str, Any]) -> None:
        """The trigger gave up on a pool of a candidate the run has left (its create held for capacity): that is
        not the current candidate's doing. Its create is waited for until GKE ends it, then the pool is deleted."""
        from tpu_rl.triggers.gke import GkeOperationTrigger

        self.log.info(
            "Node pool %s, on a candidate the run has left: waiting for GKE to end its create", event["node_pool"]
        )
        self.defer(
            trigger=GkeOperationTrigger(**self._wait_for(self.scope.config, event["operation_name"])),
            method_name="operation_done",
            kwargs={"next_step": 0, **wait},
        )

    def operation_failed(
        self,
        context: Any,
        operation: Any,
        message: str,
        next_step: int | None,
        *,
        capacity_deadline: float = 0.0,
        candidate: int = 0,
        attempts: list[dict[str, Any]] | None = None,
    ) -> Any:
        config, which = self.bind_scope(context).config, _which(candidate, attempts)
        pool = (gke.operation_target(operation.target_link) or ("", "?"))[1]
        if operation.operation_type.name not in ("CREATE_NODE_POOL", "DELETE_NODE_POOL"):
            self.log.info(
                "GKE's operation %s (%s) ended (%s): looking at the pools again",
                operation.name,
                operation.operation_type.name,
                message,
            )
            return self.submit(context, 0, capacity_deadline=capacity_deadline, **which)
        if operation.operation_type.name != "CREATE_NODE_POOL":
            raise AirflowException(
                f"GKE operation {operation.name} ({operation.operation_type.name}) on node pool "
                f"{pool} failed: {message}"
            )
        if not self._failed_here(config, pool, candidate):
            self.log.info("The create of node pool %s on a candidate the run has left ended (%s)", pool, message)
            return self.submit(context, 0, capacity_deadline=capacity_deadline, **which)
        return self._create_failed(context, pool, message, capacity_deadline, candidate, attempts)

    def _failed_here(self, config: RunConfig, pool: str, candidate: int) -> bool:
        """Whether the pool whose create failed is on the current candidate (with one candidate: always)."""
        if len(config.candidates) == 1:
            return True
        from google.api_core.exceptions import NotFound

        body = gke.tpu_node_pool(config, self.scope.run, 0, config.candidates[candidate])
        try:
            return self._on_candidate(config, self.scope.gke.get_node_pool(config.cluster_name, pool), body)
        except NotFound:
            return False

    def _create_failed(
        self,
        context: Any,
        pool: str,
        message: str,
        capacity_deadline: float,
        candidate: int,
        attempts: list[dict[str, Any]] | None,
    ) -> Any:
        """A create on the current candidate ended with GKE's ``message``: quota leaves the candidate, a stockout
        creates the pool again later within the wait and leaves the candidate past it; anything else fails."""
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger

        config, which = self.scope.config, _which(candidate, attempts)
        on = config.on_candidate(config.candidates[candidate])
        if gke.is_quota_error(message):
            failure = f"GKE could not create TPU node pool {pool}: {message}; {gke.quota_hint(on, message)}"
            return self._leave(context, Outcome.QUOTA, failure, message, **which)
        if not gke.is_capacity_error(message):
            raise AirflowFailException(
                f"GKE could not create TPU node pool {pool}: {message}; fix: see the message; delete_tpu_pools "
                "removes the failed pool."
            )
        retry_at = time.time() + self.capacity_retry_interval
        if retry_at > capacity_deadline:
            outcome = Outcome.WAIT_EXPIRED if on.capacity_wait_minutes else Outcome.STOCKOUT
            failure = f"GKE could not create TPU node pool {pool}: {message}; {self._capacity_hint(on)}."
            return self._leave(context, outcome, failure, message, **which)
        self.log.warning(
            "No capacity for node pool %s (GKE: %s); creating it again in %.0f s (waiting until %s)",
            pool,
            message,
            self.capacity_retry_interval,
            datetime.fromtimestamp(capacity_deadline, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        )
        self.defer(
            trigger=DateTimeTrigger(moment=datetime.fromtimestamp(retry_at, UTC)),
            method_name="retry_after_stockout",
            kwargs={"step": 0, "capacity_deadline": capacity_deadline, **which},
        )

    def retry_after_stockout(
        self, context: Any, event: Any, *, step: int, capacity_deadline: float, **which: Any
    ) -> Any:
        return self.submit(context, step, capacity_deadline=capacity_deadline, **which)

    def _leave(
        self,
        context: Any,
        outcome: Outcome,
        failure: str,
        detail: str,
        candidate: int = 0,
        attempts: list | None = None,
    ) -> Any:
        """The run cannot have its slices on ``candidate`` (``failure``: the task's error with one candidate;
        ``detail``: GKE's words, kept with the attempt): with one candidate, or past the last, the task fails;
        else the pools go to the next candidate (a pass there, which defers, or finds them all RUNNING: the caller
        then has nothing left to do)."""
        config = self.scope.config
        if len(config.candidates) == 1:
            raise AirflowFailException(failure) from None
        attempts = [*(attempts or []), Attempt(candidate, outcome, detail, _now()).to_json()]
        made = [Attempt.from_json(a) for a in attempts]
        # Recorded before the pools move: a new try goes on from here, never back to a candidate left.
        record_capacity_attempts(self.scope.bucket, self.scope.layout.training_record_object, made)
        decision = next_candidate(config.candidates, made, config.max_preemptions_per_candidate)
        if isinstance(decision, GiveUp):
            raise AirflowFailException(f"{decision.message()}\nThe last candidate's failure: {failure}") from None
        self.log.warning("%s", decision.why)
        return self.pass_on(context, decision.index, attempts)

    def _report_candidates(self, context: Any, candidate: int, attempts: list[dict[str, Any]]) -> None:
        """With several candidates: which were tried, why each was left and which one the slices came from, in
        the log and as XCom ``capacity`` (for the summary and the Training tab)."""
        config = self.scope.config
        if len(config.candidates) == 1:
            return
        lines = describe_attempts(config.candidates, [Attempt.from_json(a) for a in attempts], serving=candidate)
        for line in lines:
            self.log.info("Capacity %s", line)
        context["ti"].xcom_push(key=XCOM_CAPACITY, value={"serving": candidate, "attempts": attempts, "lines": lines})

    @staticmethod
    def _capacity_hint(config: RunConfig) -> str:
        return (
            f"fix: there is no {config.tpu_type} capacity in {config.zone} now: trigger the run again later or "
            "with a longer capacity_wait_minutes, use another capacity_type (a reservation; flex_start waits "
            "for a slice without a reservation) or another zone; delete_tpu_pools removes the failed pool"
        )


class CreateTpuNodePoolsOperator(TpuPoolPass):
    """Creates the run's TPU node pools just before training (tpu_pool_mode=per_run: :class:`TpuPoolPass`, from
    the candidate the run is on); otherwise checks that the cluster has the slice's nodes, so a missing slice fails
    here and not as a pending JobSet."""

    def execute(self, context: Any) -> None:
        config = self.bind_scope(context).config
        if not config.tpu_pools_per_run:
            self._check_slice_nodes(config)
            return
        self.pass_from_resume_point(context)

    def _check_slice_nodes(self, config: RunConfig) -> None:
        selector = (
            f"{TPU_ACCELERATOR_LABEL}={config.slice.generation.accelerator},{TPU_TOPOLOGY_LABEL}={config.topology}"
        )
        nodes = self.scope.kubernetes.list_nodes(selector)
        needed = config.hosts_per_slice * config.cluster_nodepool_count
        self.log.info("Found %d nodes with %s (the training needs %d)", len(nodes), selector, needed)
        if len(nodes) < needed:
            raise AirflowFailException(
                f"tpu_pool_mode: the cluster has {len(nodes)} {config.tpu_type} {config.topology} hosts, the run needs "
                f"{needed}; fix: create the TPU node pool(s), or set tpu_pool_mode to 'per_run'."
            )


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

    def submit(self, context: Any, step: int = 0, refusals: int = 0) -> None:
        """One pass: asks GKE to delete every pool of the run at once (GKE runs operations on different pools
        side by side) and defers on one deletion still in flight, then looks again; once none is left, gives
        the capacity back and records the slices' TPU time. A pool GKE refuses to delete while another operation
        runs on it or the cluster (its create held for capacity after a timeout, GKE's own upgrade or repair) waits
        for that operation, deferred; one GKE refuses for throttling is asked again a little later. ``step`` is
        read by nothing: every pass looks at all the pools."""
        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        hook = scope.gke
        in_flight, refused = [], None
        for index in range(config.cluster_nodepool_count):
            pool = run.tpu_pool_name(index)
            name = hook.pool_path(config.cluster_name, pool)
            try:
                operation = hook.delete_node_pool(config.cluster_name, pool)
            except GkeRefusedError as error:
                if error.blocking is None:
                    refused = error
                    continue
                self.log.info(
                    "GKE refuses to delete node pool %s while operation %s (%s) runs (%s): waiting for it",
                    pool,
                    error.blocking.name,
                    error.blocking.operation_type.name,
                    error.message,
                )
                in_flight.append(error.blocking.name)
                continue
            if operation is None:
                self.log.info("Node pool %s does not exist (any more): nothing to delete", name)
            else:
                self.log.info("Deleting node pool %s", name)
                in_flight.append(operation)
        if in_flight:
            self._await(config, in_flight[0], next_step=0)
        if refused is not None:
            self.wait_out(refused, "delete the TPU node pools", refusals)
        release_capacity(scope, self.log)
        self._record_slice_times(context)

    def operation_failed(self, context: Any, operation: Any, message: str, next_step: int | None, **wait: Any) -> None:
        """A deletion that failed fails the task (its retries delete again); another operation the pool waited
        for (a create that ended in a stockout, say) is not ours to judge: look again."""
        if operation.operation_type.name == "DELETE_NODE_POOL":
            super().operation_failed(context, operation, message, next_step, **wait)
        self.log.info(
            "Operation %s (%s) ended (%s): deleting the pools again",
            operation.name,
            operation.operation_type.name,
            message,
        )
        self.submit(context, 0)

    def _record_slice_times(self, context: Any) -> None:
        """The TPU time is reported, never a reason to fail the teardown: an unreadable list is logged."""
        config, run = self.scope.config, self.scope.run
        pools = [run.tpu_pool_name(i) for i in range(config.cluster_nodepool_count)]
        try:
            listed = self.scope.gke.list_operations()
        except Exception as error:
            self.log.warning("Could not list GKE's operations to count the slices' TPU time: %s", error)
            return
        operations = [
            {
                "type": op.operation_type.name,
                "pool": target[1],
                "end": op.end_time,
                "failed": bool(op.error.code or op.status_message),
            }
            for op in listed
            if (target := gke.operation_target(op.target_link)) and target[0] == config.cluster_name and target[1]
        ]
        times = gke.slice_times(operations, pools)
        ti = context["ti"]
        capacity = next(
            (
                pushed
                for pull in (TRAINING_CAPACITY, CAPACITY_CANDIDATES)
                if (pushed := ti.xcom_pull(pull.task, key=pull.key))
            ),
            None,
        )
        if capacity is not None:  # each slice's candidate, for its cost at its price
            attempts = [Attempt.from_json(a) for a in capacity["attempts"]]
            for slice_ in times:
                slice_["candidate"] = candidate_at(attempts, parse_time(slice_["nodes_from"]), capacity["serving"])
        for slice_ in times:
            self.log.info(
                "TPU slice %s: nodes from %s to %s", slice_["pool"], slice_["nodes_from"], slice_["nodes_gone"]
            )
        context["ti"].xcom_push(key=XCOM_TPU_SLICES, value=times)


class DeleteClusterOperator(_AwaitsGkeOperations):
    """Teardown: deletes the cluster only if this run created it; in an existing cluster it removes the
    run's token Secret instead. GKE refuses a delete while another operation runs: it waits for that one."""

    def execute(self, context: Any) -> None:
        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        if not config.creates_cluster:
            self._delete_secret(config, run)
            return
        closing = not config.keep_cluster
        if config.shares_cluster and not leave_cluster_lease(scope, context["ti"], closing, self.log):
            self._delete_secret(config, run)
            return
        if config.keep_cluster:
            self.log.warning("keep_cluster is set: cluster %s stays up and keeps costing money", config.cluster_name)
            return
        hook = scope.gke
        cluster = hook.get_cluster(config.cluster_name)
        if cluster is None:
            self.log.info("Cluster %s does not exist: nothing to delete", config.cluster_name)
            return
        owner = cluster.resource_labels.get(GKE_LABEL_RUN_KEY)
        if config.shares_cluster and cluster.resource_labels.get(GKE_LABEL_SHARED) != "true":
            self.log.warning("Cluster %s is not a shared cluster: leaving it", config.cluster_name)
            return
        if owner != run.key and not config.shares_cluster:
            self.log.warning(
                "Cluster %s was created by run key %s, not by this run (%s): leaving it",
                config.cluster_name,
                owner,
                run.key,
            )
            return
        self.submit(context, 0)

    def submit(self, context: Any, step: int = 0, refusals: int = 0) -> None:
        """Asks GKE to delete the cluster (``execute`` found it this run's to delete) and waits for it; while
        GKE refuses (another operation runs on the cluster: the run's, or GKE's own upgrade or repair; throttling),
        waits, deferred, and asks again."""
        scope = self.bind_scope(context)
        config = scope.config
        try:
            operation = scope.gke.delete_cluster(config.cluster_name)
        except GkeRefusedError as refused:
            self.wait_out(refused, f"delete cluster {config.cluster_name}", refusals)
        if operation is None:
            self.log.info("Cluster %s does not exist (any more): nothing to delete", config.cluster_name)
            return
        self.log.info("Deleting cluster %s (operation %s)", config.cluster_name, operation)
        self._await(config, operation)

    def _delete_secret(self, config: RunConfig, run: RunIdentity) -> None:
        if self.scope.kubernetes.delete_secret(run.secret_name(), config.namespace):
            self.log.info("Deleted Secret %s/%s; the existing cluster stays", config.namespace, run.secret_name())
        else:
            self.log.info("No Secret %s to delete; the existing cluster stays", run.secret_name())
