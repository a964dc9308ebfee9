"""create_tpu_pools with several capacity candidates: a stockout past a candidate's wait or missing quota moves the
run's pools to the next candidate, past the last the task fails saying why each was left. GKE is replaced by a
scripted stand-in that keeps the run's pools (real ``NodePool`` objects, as the client returns them) and answers each
create by the candidate's zone and capacity type, and the run's training record by a JSON document in memory; the
GKE emulator's faults exercise the real clients (tests/sim)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from google.api_core.exceptions import NotFound
from google.cloud.container_v1 import NodePool, Operation

from tpu_rl import gke, preemption
from tpu_rl.compat import AirflowFailException
from tpu_rl.config import RunConfig
from tpu_rl.contract import XCOM_CAPACITY
from tpu_rl.hooks.gcs import GcsBucketHook, StoredJson
from tpu_rl.hooks.gke import GkeApiHook, GkeRefusedError
from tpu_rl.operators import tpu_pools
from tpu_rl.run import RunIdentity

try:  # Airflow >= 3.1 task SDK
    from airflow.sdk.exceptions import TaskDeferred
except ImportError:  # pragma: no cover
    from airflow.exceptions import TaskDeferred

from tpu_rl_testing import TUTORIAL_CONF, TaskInstanceStandIn, task_context

CLUSTER = "projects/my-project/locations/us-east5/clusters/qwen-rl"
STOCKOUT = (
    "Google Compute Engine: Not all instances running in IGM. Current errors: [GCE_STOCKOUT]: Instance 'gke-x' "
    "creation failed: The zone 'projects/my-project/zones/us-east5-b' does not have enough resources available."
)
QUOTA = (
    'Insufficient regional quota to satisfy request: resource "TPUS_PER_TPU_FAMILY": request requires '
    "'64.0' and is short '64.0'. project has a quota of '0.0' with '0.0' available in region us-east5."
)
RESERVATION_SHORT = (
    'Reservation does not have enough resources for the request: specific reservation "my-v6e" is insufficient for '
    'node pool "tpu-0" at zone "us-east5-a": required 16 and short of 4 VM count of machine type ct6e-standard-4t.'
)
ON_DEMAND = {"zone": "us-east5-b", "capacity_type": "on_demand"}
SPOT = {"zone": "us-east5-b", "capacity_type": "spot", "price_per_chip_hour": 1.1}
RUN = ("maxtext_rl_tpu", "manual__failover")
RESERVED = {"zone": "us-east5-a", "capacity_type": "reservation", "reservation": "my-v6e"}


class ScriptedGke:
    """The run's pools and operations in GKE. ``answers``: (zone, capacity type) -> "stockout" (the create runs,
    then ends with GKE's stockout, the pool in ERROR), "quota" (refused at once) or "ok" (the pool RUNNING)."""

    def __init__(self, answers: dict[tuple[str, str], str]):
        self.answers, self.pools, self.operations, self.creates = answers, {}, {}, []

    def create(self, cluster: str, body: dict) -> str | None:
        if body["name"] in self.pools:
            return None
        config = body["config"]
        kind = (
            "spot"
            if config.get("spot")
            else "reservation"
            if config.get("reservation_affinity", {}).get("values")
            else "on_demand"
        )
        answer = self.answers[body["locations"][0], kind]
        self.creates.append((body["name"], body["locations"][0], kind))
        if answer == "quota":
            raise GkeRefusedError(gke.Refusal.QUOTA, QUOTA)
        if answer == "reservation-short":
            raise GkeRefusedError(gke.Refusal.CAPACITY, RESERVATION_SHORT)
        pool = NodePool.from_json(json.dumps(body))
        pool.status = NodePool.Status.RUNNING if answer == "ok" else NodePool.Status.ERROR
        self.pools[body["name"]] = pool
        return self._operation("CREATE_NODE_POOL", body["name"], STOCKOUT if answer == "stockout" else "")

    def delete(self, cluster: str, name: str) -> str | None:
        if self.pools.pop(name, None) is None:
            return None
        return self._operation("DELETE_NODE_POOL", name, "")

    def get(self, cluster: str, name: str) -> NodePool:
        if name not in self.pools:
            raise NotFound(name)
        return self.pools[name]

    def _operation(self, kind: str, pool: str, error: str) -> str:
        name = f"operation-{len(self.operations)}"
        self.operations[name] = SimpleNamespace(
            name=name,
            error=SimpleNamespace(code=8 if error else 0, message=error),
            status_message=error,
            operation_type=getattr(Operation.Type, kind),
            target_link=f"https://container.googleapis.com/v1/{CLUSTER}/nodePools/{pool}",
        )
        return name


class RecordInMemory:
    """The run's training record (``GcsJsonObject``'s read and update), as check_training_record left it."""

    def __init__(self):
        self.document = {"parameters": {}}

    def read(self):
        return StoredJson(json.dumps(self.document).encode(), 1, datetime.now(UTC))

    def update(self, change):
        self.document = change(json.loads(json.dumps(self.document)))
        return self.document


@pytest.fixture
def scripted(monkeypatch):
    def install(answers):
        fake = ScriptedGke(answers)
        fake.record = RecordInMemory()
        monkeypatch.setattr(GcsBucketHook, "json_object", lambda self, name: fake.record)
        monkeypatch.setattr(GkeApiHook, "create_node_pool", lambda self, cluster, body: fake.create(cluster, body))
        monkeypatch.setattr(GkeApiHook, "delete_node_pool", lambda self, cluster, name: fake.delete(cluster, name))
        monkeypatch.setattr(GkeApiHook, "get_node_pool", lambda self, cluster, name: fake.get(cluster, name))
        fake.running = None
        monkeypatch.setattr(GkeApiHook, "running_operation", lambda self, cluster, pool=None: fake.running)
        monkeypatch.setattr(GkeApiHook, "get_operation", lambda self, name: fake.operations[name])
        return fake

    return install


def run_to_the_end(params: dict) -> tuple[TaskInstanceStandIn, list[str]]:
    """Runs a try of create_tpu_pools as Airflow would (:func:`drive`); returns the task instance and the
    deferrals' method names."""
    ti = TaskInstanceStandIn(*RUN, "create_tpu_pools")  # a new try: no XCom
    context = task_context(ti, {**TUTORIAL_CONF, **params})
    operator = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", capacity_retry_interval=0)
    return ti, drive(operator, context, lambda: operator.execute(context))


def drive(operator, context, first) -> list[str]:
    """Calls ``first``, then each deferral's method at once with its operation DONE (GKE's answer is read from the
    operation, as the trigger reports every DONE one as a success), until one returns; returns their names."""
    step, resumed = first, []
    for _ in range(30):
        try:
            step()
            return resumed
        except TaskDeferred as deferred:
            resumed.append(deferred.method_name)
            kwargs = dict(deferred.kwargs or {})
            method = getattr(operator, deferred.method_name)
            event = {"status": "success", "operation_name": getattr(deferred.trigger, "operation_name", "")}
            step = lambda method=method, event=event, kwargs=kwargs: method(context, event, **kwargs)  # noqa: E731
    raise AssertionError(f"{operator.task_id} never ended: {resumed}")


def _pool_operation(kind, end, pool):
    """A finished GKE operation of ``kind`` on the run's pool ``pool``, as GKE lists it."""
    return SimpleNamespace(
        operation_type=getattr(Operation.Type, kind),
        target_link=f"https://container.googleapis.com/v1/{CLUSTER}/nodePools/{pool}",
        end_time=end,
        error=SimpleNamespace(code=0),
        status_message="",
    )


def test_a_stockout_then_missing_quota_move_the_pool_to_the_third_candidate(scripted):
    fake = scripted(
        {("us-east5-b", "on_demand"): "stockout", ("us-east5-b", "spot"): "quota", ("us-east5-a", "reservation"): "ok"}
    )
    ti, _ = run_to_the_end({"capacity_candidates": [ON_DEMAND, SPOT, RESERVED]})
    pool = next(iter(fake.pools.values()))
    assert list(pool.locations) == ["us-east5-a"] and pool.status == NodePool.Status.RUNNING
    assert [(zone, kind) for _, zone, kind in fake.creates] == [
        ("us-east5-b", "on_demand"),
        ("us-east5-b", "spot"),
        ("us-east5-a", "reservation"),
    ]
    report = ti.pushed(XCOM_CAPACITY)
    assert report["serving"] == 2
    assert [a["outcome"] for a in report["attempts"]] == ["stockout", "quota"]
    assert report["lines"][0].startswith("candidate 0 (on_demand in us-east5-b): left, stockout (Google Compute Engine")
    assert report["lines"][1].startswith("candidate 1 (spot in us-east5-b): left, quota (Insufficient regional quota")
    assert report["lines"][2] == "candidate 2 (reservation 'my-v6e' in us-east5-a): the slices came from it"


def test_a_new_try_adopts_the_pools_running_on_the_candidate_the_run_reached(scripted):
    """A retried or cleared create_tpu_pools neither goes back to the candidates left nor moves the pools."""
    three = {"capacity_candidates": [ON_DEMAND, SPOT, RESERVED]}
    fake = scripted(
        {("us-east5-b", "on_demand"): "stockout", ("us-east5-b", "spot"): "quota", ("us-east5-a", "reservation"): "ok"}
    )
    run_to_the_end(three)
    creates, operations = len(fake.creates), len(fake.operations)
    ti, deferrals = run_to_the_end(three)
    assert (len(fake.creates), len(fake.operations), deferrals) == (creates, operations, [])
    assert list(next(iter(fake.pools.values())).locations) == ["us-east5-a"]
    report = ti.pushed(XCOM_CAPACITY)
    assert report["serving"] == 2
    assert [a["outcome"] for a in report["attempts"]] == ["stockout", "quota"]


def test_a_new_try_waits_for_the_create_on_the_candidate_the_run_reached(scripted):
    """The try ended while candidate 1's create ran (its pool PROVISIONING): the new try waits for that create,
    it does not delete the pool to create it on candidate 0 again."""
    fake = scripted({("us-east5-b", "on_demand"): "stockout", ("us-east5-a", "reservation"): "ok"})
    two = {"capacity_candidates": [ON_DEMAND, RESERVED]}
    run_to_the_end(two)
    pool = next(iter(fake.pools.values()))
    pool.status = NodePool.Status.PROVISIONING
    creating = SimpleNamespace(name="operation-creating", operation_type=Operation.Type.CREATE_NODE_POOL)
    fake.running = creating
    creates = len(fake.creates)
    ti = TaskInstanceStandIn("maxtext_rl_tpu", "manual__failover", "create_tpu_pools")
    operator = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools")
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(task_context(ti, {**TUTORIAL_CONF, **two}))
    assert deferred.value.trigger.operation_name == "operation-creating"
    assert deferred.value.kwargs["candidate"] == 1
    assert len(fake.creates) == creates and list(pool.locations) == ["us-east5-a"]


def test_a_new_try_with_pools_on_a_later_candidate_and_no_attempts_recorded_adopts_them(scripted):
    """A record without attempts (written before candidates existed, say): the pools are the memory."""
    fake = scripted({("us-east5-a", "reservation"): "ok"})
    three = {"capacity_candidates": [ON_DEMAND, SPOT, RESERVED]}
    config = RunConfig.from_params({**TUTORIAL_CONF, **three})
    fake.create(CLUSTER, gke.tpu_node_pool(config, RunIdentity(*RUN), 0, config.candidates[2]))
    fake.creates.clear()
    ti, _ = run_to_the_end(three)
    assert fake.creates == [] and ti.pushed(XCOM_CAPACITY)["serving"] == 2


def test_after_every_candidate_was_left_a_new_try_starts_a_new_round(scripted):
    """The task failed past the last candidate; clearing it tries the candidates again from the first."""
    fake = scripted({("us-east5-b", "on_demand"): "stockout", ("us-east5-b", "spot"): "quota"})
    two = {"capacity_candidates": [ON_DEMAND, SPOT]}
    with pytest.raises(AirflowFailException):
        run_to_the_end(two)
    fake.answers["us-east5-b", "on_demand"] = "ok"
    ti, _ = run_to_the_end(two)
    assert fake.creates[-1][1:] == ("us-east5-b", "on_demand")
    assert ti.pushed(XCOM_CAPACITY)["serving"] == 0


def test_a_preemption_on_the_candidate_is_counted_in_the_record_a_new_try_reads(scripted):
    """train_rl keeps each preemption with the candidate the slices came from, among the run's capacity attempts:
    a later create_tpu_pools try stays on that candidate and reports it."""
    from tpu_rl.operators.workloads import TrainRlOperator

    fake = scripted({("us-east5-b", "on_demand"): "stockout", ("us-east5-a", "reservation"): "ok"})
    two = {"capacity_candidates": [ON_DEMAND, RESERVED]}
    ti, _ = run_to_the_end(two)
    train = TrainRlOperator(task_id="train_rl")
    context = task_context(ti, {**TUTORIAL_CONF, **two})
    train.bind_scope(context)
    decision = preemption.decide(
        steps=[],
        committed_at=None,
        last_step=12,
        attempt_started=None,
        trainer_completed=False,
        recorded=0,
        cause={"reason": "DisruptionTarget TerminationByKubelet", "pod": "head-0"},
        now=datetime(2026, 12, 5, 10, 0, tzinfo=UTC),
        train_steps=50,
        checkpoint_period=10,
        max_preemptions=3,
        set_aside_root="gs://b/",
        candidate=train._serving_candidate(context),
    )
    train._count_on_candidate(decision.record)
    assert decision.record.candidate == 1
    assert [a["outcome"] for a in fake.record.document["capacity_attempts"]] == ["stockout", "preempted"]
    creates = len(fake.creates)
    again, _ = run_to_the_end(two)
    assert len(fake.creates) == creates
    lines = again.pushed(XCOM_CAPACITY)["lines"]
    assert lines[1] == "candidate 1 (reservation 'my-v6e' in us-east5-a): the slices came from it after 1 preemption(s)"


def test_past_its_preemptions_on_a_candidate_the_training_moves_to_the_next_and_is_resubmitted(scripted, monkeypatch):
    """max_preemptions_per_candidate 2: the first preemption on Spot resumes on the same pools, untouched; the
    second moves the pools to the reservation (deleted, created there) and the training is resubmitted on them,
    resuming from its newest complete checkpoint."""
    from tpu_rl.hooks.gcs import TrainingState
    from tpu_rl.operators.workloads import TrainRlOperator

    fake = scripted({("us-east5-b", "spot"): "ok", ("us-east5-a", "reservation"): "ok"})
    params = {"capacity_candidates": [SPOT, RESERVED], "max_preemptions_per_candidate": 2}
    created, _ = run_to_the_end(params)
    submitted_on = []

    def submit(self, context):  # the real one submits the JobSet and defers on it
        submitted_on.append([list(p.locations)[0] for p in fake.pools.values()])
        return {"state": "submitted"}

    monkeypatch.setattr(TrainRlOperator, "run_jobset", submit)
    monkeypatch.setattr(TrainRlOperator, "_training_state", lambda self: TrainingState([], None, 12))
    ti = TaskInstanceStandIn(*RUN, "train_rl", xcoms=created.xcoms)
    context = task_context(ti, {**TUTORIAL_CONF, **params})
    train = TrainRlOperator(task_id="train_rl")
    assert drive(train, context, lambda: train.execute(context)) == []  # the pools adopted, the JobSet submitted
    assert submitted_on == [["us-east5-b"]] and ti.pushed(XCOM_CAPACITY)["serving"] == 0
    creates, operations = len(fake.creates), len(fake.operations)

    train.__dict__["hook"] = SimpleNamespace(delete_jobset=lambda *a, **k: None, wait_until_gone=lambda *a: None)
    preempted = {
        "status": "failed",
        "preemption": {"reason": "DisruptionTarget TerminationByKubelet", "pod": "head-0"},
        "message": "preempted",
        **{"name": "train", "namespace": "default", "uid": "u-1"},
    }
    assert drive(train, context, lambda: train.execute_complete(context, preempted)) == []
    assert submitted_on == [["us-east5-b"], ["us-east5-b"]] and len(fake.operations) == operations
    assert ti.pushed(XCOM_CAPACITY)["lines"][0].endswith("the slices came from it after 1 preemption(s)")
    drive(train, context, lambda: train.execute_complete(context, preempted))
    assert submitted_on == [["us-east5-b"], ["us-east5-b"], ["us-east5-a"]]
    assert fake.creates[creates:] == [(RunIdentity(*RUN).tpu_pool_name(0), "us-east5-a", "reservation")]
    report = ti.pushed(XCOM_CAPACITY)
    assert report["serving"] == 1
    assert report["lines"][0].startswith("candidate 0 (spot in us-east5-b): left, preempted (DisruptionTarget")
    assert fake.record.document["preemptions"][0]["candidate"] == 0


def test_past_the_last_candidates_preemptions_the_training_stops_keeping_its_checkpoints(scripted, monkeypatch):
    """Preempted once on the last candidate with max_preemptions_per_candidate 1: nowhere to move, the task fails
    saying why each candidate was left, and a clear resumes from the checkpoints on the pools there."""
    from tpu_rl.hooks.gcs import TrainingState
    from tpu_rl.operators.workloads import TrainRlOperator

    scripted({("us-east5-b", "spot"): "ok"})
    params = {"capacity_candidates": [ON_DEMAND, SPOT], "max_preemptions_per_candidate": 1}
    ti = TaskInstanceStandIn(*RUN, "train_rl", xcoms={("create_tpu_pools", XCOM_CAPACITY): {"serving": 1}})
    monkeypatch.setattr(TrainRlOperator, "_training_state", lambda self: TrainingState([], None, 12))
    context = task_context(ti, {**TUTORIAL_CONF, **params})
    train = TrainRlOperator(task_id="train_rl")
    train.bind_scope(context)
    train.__dict__["hook"] = SimpleNamespace(delete_jobset=lambda *a, **k: None, wait_until_gone=lambda *a: None)
    preempted = {
        "status": "failed",
        "preemption": {"reason": "DisruptionTarget TerminationByKubelet", "pod": "head-0"},
        "message": "preempted",
        **{"name": "train", "namespace": "default", "uid": "u-1"},
    }
    with pytest.raises(AirflowFailException) as failed:
        train.execute_complete(context, preempted)
    assert str(failed.value).startswith("no capacity candidate gave the run its slices")
    assert "candidate 1 (spot in us-east5-b): left, preempted" in str(failed.value)
    assert "clearing train_rl resumes from its newest complete step" in str(failed.value)


def test_a_slice_moved_on_preemption_is_counted_on_each_candidate_for_its_time_there(monkeypatch):
    """Created on candidate 0 at 10:00, moved at 11:00 after a preemption, on candidate 1 from 11:10 to 12:10: an
    hour on each, at each one's price."""
    from tpu_rl import training_metrics

    ti = TaskInstanceStandIn(*RUN, "delete_tpu_pools")
    pool = RunIdentity(*RUN).tpu_pool_name(0)

    listed = [
        _pool_operation("CREATE_NODE_POOL", "2026-12-05T10:00:00Z", pool),
        _pool_operation("DELETE_NODE_POOL", "2026-12-05T11:00:00Z", pool),
        _pool_operation("CREATE_NODE_POOL", "2026-12-05T11:10:00Z", pool),
        _pool_operation("DELETE_NODE_POOL", "2026-12-05T12:10:00Z", pool),
    ]
    monkeypatch.setattr(GkeApiHook, "list_operations", lambda self: listed)
    preempted = {"candidate": 0, "outcome": "preempted", "detail": "", "at": "2026-12-05T10:58:00+00:00"}
    ti.xcoms["create_tpu_pools", XCOM_CAPACITY] = {"serving": 0, "attempts": [], "lines": []}
    ti.xcoms["train_rl", XCOM_CAPACITY] = {"serving": 1, "attempts": [preempted], "lines": []}
    params = {**TUTORIAL_CONF, "capacity_candidates": [SPOT, RESERVED], "max_preemptions_per_candidate": 1}
    operator = tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools")
    operator.bind_scope(task_context(ti, params))
    operator._record_slice_times(task_context(ti, params))
    slices = ti.pushed("tpu_slices")
    assert [(s["nodes_from"][11:16], s["candidate"]) for s in slices] == [("10:00", 0), ("11:10", 1)]
    cost = training_metrics.tpu_cost(slices, RunConfig.from_params(params))
    assert [(c["candidate"], c["chip_hours"]) for c in cost["by_candidate"]] == [(0, 64.0), (1, 64.0)]


def test_a_reservation_too_small_for_the_slice_is_left_as_a_stockout_not_waited_out_as_throttling(scripted):
    """GKE refuses a pool its reservation cannot hold with a 429 (too few VMs left): with no wait, the run moves on
    at once instead of asking again for 20 minutes as it does when GKE throttles."""
    fake = scripted({("us-east5-a", "reservation"): "reservation-short", ("us-east5-b", "spot"): "ok"})
    ti, deferrals = run_to_the_end({"capacity_candidates": [RESERVED, SPOT]})
    assert [kind for _, _, kind in fake.creates] == ["reservation", "spot"] and "resubmit" not in deferrals
    report = ti.pushed(XCOM_CAPACITY)
    assert report["lines"][0].startswith("candidate 0 (reservation 'my-v6e' in us-east5-a): left, stockout (Reserv")


def test_every_slice_moves_with_the_candidate(scripted):
    """Two slices: the first created on candidate 0, the second stocked out there; both end on candidate 1, one zone."""
    fake = scripted({("us-east5-b", "on_demand"): "ok", ("us-east5-a", "reservation"): "ok"})
    original = fake.create

    def second_stocks_out(cluster, body):
        if body["name"].endswith("-1") and body["locations"] == ["us-east5-b"]:
            fake.answers["us-east5-b", "on_demand"] = "stockout"
        operation = original(cluster, body)
        fake.answers["us-east5-b", "on_demand"] = "ok"
        return operation

    fake.create = second_stocks_out
    two = {"cluster_nodepool_count": 2, "ici_expert_parallelism": 1, "capacity_candidates": [ON_DEMAND, RESERVED]}
    run_to_the_end(two)
    assert sorted((name[-1], list(p.locations)[0]) for name, p in fake.pools.items()) == [
        ("0", "us-east5-a"),
        ("1", "us-east5-a"),
    ]


def test_past_the_last_candidate_the_task_fails_saying_why_each_was_left(scripted):
    scripted({("us-east5-b", "on_demand"): "stockout", ("us-east5-b", "spot"): "quota"})
    with pytest.raises(AirflowFailException) as failed:
        run_to_the_end({"capacity_candidates": [ON_DEMAND, SPOT]})
    message = str(failed.value)
    assert message.startswith("no capacity candidate gave the run its slices: candidate 0 (on_demand in us-east5-b)")
    assert "candidate 1 (spot in us-east5-b): left, quota" in message
    # The last failure's own fix: the Spot candidate's quota, though the run's capacity_type is on_demand.
    assert "The last candidate's failure: GKE refused TPU node pool" in message
    assert "the preemptible TPU v6e quota" in message


def test_one_candidate_fails_as_before_and_carries_nothing_new(scripted):
    scripted({("us-east5-b", "spot"): "quota"})
    with pytest.raises(AirflowFailException) as failed:
        run_to_the_end({"capacity_type": "spot"})
    assert str(failed.value).startswith("GKE refused TPU node pool tpu-")
    assert "the preemptible TPU v6e quota" in str(failed.value)


def test_a_pool_left_behind_on_a_held_create_is_waited_for_not_blamed_on_the_new_candidate(scripted):
    """The trigger gives up on a held create at the deadline it was given: after a move, that is the new candidate's
    deadline, but the pool is the old candidate's. Its create is waited for until GKE ends it (then deleted)."""
    from tpu_rl.triggers.gke import GkeOperationTrigger

    fake = scripted({("us-east5-b", "on_demand"): "stockout", ("us-east5-a", "reservation"): "ok"})
    ti = TaskInstanceStandIn("maxtext_rl_tpu", "manual__failover", "create_tpu_pools")
    context = task_context(ti, {**TUTORIAL_CONF, "capacity_candidates": [ON_DEMAND, RESERVED]})
    operator = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools")
    with pytest.raises(TaskDeferred):
        operator.execute(context)  # the create on candidate 0, which GKE holds
    name, operation = next(iter(fake.pools)), next(iter(fake.operations))
    attempts = [{"candidate": 0, "outcome": "stockout", "detail": "", "at": ""}]
    event = {"status": "capacity_timeout", "operation_name": operation, "node_pool": name, "message": "no capacity"}
    with pytest.raises(TaskDeferred) as deferred:
        operator.operation_done(context, event, next_step=0, capacity_deadline=0.0, candidate=1, attempts=attempts)
    assert type(deferred.value.trigger) is GkeOperationTrigger
    assert deferred.value.kwargs == {"next_step": 0, "capacity_deadline": 0.0, "candidate": 1, "attempts": attempts}


def test_the_slices_times_name_the_candidate_they_came_from(monkeypatch):
    """delete_tpu_pools records each slice's time with the candidate create_tpu_pools created it on, for its cost at
    that candidate's price; a one-candidate run's records are as before."""

    ti = TaskInstanceStandIn("maxtext_rl_tpu", "manual__failover", "delete_tpu_pools")
    pool = RunIdentity(ti.dag_id, ti.run_id).tpu_pool_name(0)
    listed = [
        _pool_operation("CREATE_NODE_POOL", "2026-12-05T10:00:00Z", pool),
        _pool_operation("DELETE_NODE_POOL", "2026-12-05T11:00:00Z", pool),
    ]
    monkeypatch.setattr(GkeApiHook, "list_operations", lambda self: listed)
    operator = tpu_pools.DeleteTpuNodePoolsOperator(task_id="delete_tpu_pools")
    single = task_context(ti, TUTORIAL_CONF)
    operator.bind_scope(single)
    operator._record_slice_times(single)
    assert "candidate" not in ti.pushed("tpu_slices")[0]
    ti.xcoms["create_tpu_pools", XCOM_CAPACITY] = {"serving": 2, "attempts": [], "lines": []}
    several = task_context(ti, {**TUTORIAL_CONF, "capacity_candidates": [ON_DEMAND, SPOT, RESERVED]})
    operator.bind_scope(several)
    operator._record_slice_times(several)
    assert ti.pushed("tpu_slices")[0]["candidate"] == 2
