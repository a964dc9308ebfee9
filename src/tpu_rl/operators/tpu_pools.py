"""The run's TPU node pools: created just before training on a capacity candidate, moved to the next
candidate when one has no capacity or quota (``TpuPoolPass``, which ``train_rl`` also runs to move them after too
many preemptions), and deleted right after training, with the slices' TPU time.

Every create adopts what exists; the delete removes only the pools named with this run's key, so a retried or
cleared task never creates a pool twice and never deletes one another run made.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from tpu_rl import candidates, gke
from tpu_rl.candidates import Candidate
from tpu_rl.compat import AirflowException, AirflowFailException
from tpu_rl.config import RunConfig
from tpu_rl.contract import (
    CAPACITY_CANDIDATES,
    PREFLIGHT_RESULT,
    TRAINING_CAPACITY,
    XCOM_CAPACITY,
    XCOM_TPU_SLICES,
)
from tpu_rl.failover import Attempt, GiveUp, Outcome, candidate_at, describe_attempts, next_candidate
from tpu_rl.hooks.gke import GkeApiHook, GkeRefusedError
from tpu_rl.operators.gke_operations import AwaitsGkeOperations
from tpu_rl.operators.leases import release_capacity
from tpu_rl.operators.training_record import record_capacity_attempts, recorded_capacity_attempts
from tpu_rl.timestamps import parse_time
from tpu_rl.vocabulary import TPU_ACCELERATOR_LABEL, TPU_TOPOLOGY_LABEL


def preflight_attempts(context: Any) -> list[Attempt]:
    """The capacity candidates the run's preflight left out, as attempts that were never made."""
    pushed = context["ti"].xcom_pull(task_ids=PREFLIGHT_RESULT.task, key=PREFLIGHT_RESULT.key) or {}
    skipped = pushed.get("skipped") or {}
    return [
        Attempt(int(index), Outcome.PREFLIGHT, why) for index, why in sorted(skipped.items(), key=lambda i: int(i[0]))
    ]


#: After a stockout ended a pool's create, how long to wait before creating it again.
CAPACITY_RETRY_SECONDS = 120


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


class TpuPoolPass(AwaitsGkeOperations):
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
        candidate, attempts = self._resume_point(context) if len(self.scope.config.candidates) > 1 else (0, [])
        return self.pass_on(context, candidate, attempts)

    def pass_on(self, context: Any, candidate: int, attempts: list[dict[str, Any]]) -> Any:
        """A pass that brings the pools to ``candidate`` (``attempts``: why the run left the others), its wait
        from now."""
        return self.submit(context, 0, **_arrival(self.scope.config, candidate, attempts))

    def _resume_point(self, context: Any) -> tuple[int, list[dict[str, Any]]]:
        """Where this try goes on from (a retry, a cleared task): the candidate the run's recorded attempts lead
        to, or a later one its pools are already on (a record without attempts: the pools are the only memory).
        There the pass adopts the RUNNING pools and waits for those being created; a candidate the record says
        was left is not tried again. When every candidate was left, a new round starts: on the candidate the
        pools are RUNNING on (a training preempted too often on the last one: its slices are not moved back), else
        from the first. The candidates the preflight left out come first in the attempts: never tried."""
        config, scope = self.scope.config, self.scope
        left_out = preflight_attempts(context)
        recorded = recorded_capacity_attempts(scope.bucket, scope.layout.training_record_object)
        attempts = left_out + [a for a in recorded if a.outcome is not Outcome.PREFLIGHT]
        decision = next_candidate(config.candidates, attempts, config.max_preemptions_per_candidate)
        if isinstance(decision, GiveUp):
            self.log.warning(
                "Every capacity candidate was left by an earlier try (%s): trying them all again",
                "; ".join(decision.tried),
            )
            record_capacity_attempts(scope.bucket, scope.layout.training_record_object, [])
            first = next_candidate(config.candidates, left_out, config.max_preemptions_per_candidate)
            first_index = first.index if not isinstance(first, GiveUp) else 0
            running = self._pools_candidates(running_only=True)
            return max(running, default=first_index), [a.to_json() for a in left_out]
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


class DeleteTpuNodePoolsOperator(AwaitsGkeOperations):
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
