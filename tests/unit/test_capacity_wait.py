"""Waiting for TPU capacity in create_tpu_pools: what the trigger reports while GKE holds a pool for want of
capacity, and what the operator decides when a create ends in a stockout. GKE is replaced by scripted
answers (operation states, pool conditions); the GKE emulator's capacity faults exercise the real clients."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from google.cloud.container_v1 import Operation

from tpu_rl.compat import AirflowFailException
from tpu_rl.hooks.gke import GkeApiHook
from tpu_rl.operators import tpu_pools
from tpu_rl.triggers.gke import TpuPoolCreateTrigger

try:  # Airflow >= 3.1 task SDK
    from airflow.sdk.exceptions import TaskDeferred
except ImportError:  # pragma: no cover
    from airflow.exceptions import TaskDeferred

from tpu_rl_testing import TUTORIAL_CONF, TaskInstanceStandIn, task_context

POOL_PATH = "projects/my-project/locations/us-east5/clusters/qwen-rl/nodePools/tpu-1a2b3c4d-0"
STOCKOUT = {
    "code": "GCE_STOCKOUT",
    "canonical_code": "RESOURCE_EXHAUSTED",
    "message": "The zone 'projects/my-project/zones/us-east5-b' does not have enough resources available "
    "to fulfill the request.",
}


def scripted_trigger(monkeypatch, answers, deadline, started="", create_seconds=900):
    """A trigger whose GKE answers (operation status, pool conditions) are taken from ``answers`` in turn; the
    operation started at ``started`` (RFC 3339)."""
    answers = iter(answers)
    current = {}

    class Hook:  # AsyncGkeApiHook
        async def get_operation(self, name):
            current["status"], current["conditions"] = next(answers)
            if isinstance(current["status"], Exception):
                raise current["status"]
            return SimpleNamespace(
                name=name,
                status=current["status"],
                start_time=started,
                operation_type=Operation.Type.CREATE_NODE_POOL,
            )

        async def node_pool_conditions(self, pool_path):
            assert pool_path == POOL_PATH
            return current["conditions"]

    trigger = TpuPoolCreateTrigger(
        operation_name="operation-1",
        project_id="my-project",
        location="us-east5",
        poll_interval=0,
        pool_path=POOL_PATH,
        capacity_deadline=deadline,
        create_seconds=create_seconds,
    )
    monkeypatch.setattr(trigger, "gke_api", lambda: Hook())
    return trigger


def first_event(trigger):
    async def run():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(run())


RUNNING, DONE = Operation.Status.RUNNING, Operation.Status.DONE


def test_a_pool_held_for_capacity_is_waited_for_with_gkes_reason_in_the_log(monkeypatch, capsys):
    trigger = scripted_trigger(
        monkeypatch,
        [(RUNNING, []), (RUNNING, [STOCKOUT]), (RUNNING, [STOCKOUT]), (RUNNING, [STOCKOUT]), (DONE, [])],
        deadline=time.time() + 3600,
    )
    assert first_event(trigger) == {"status": "success", "operation_name": "operation-1"}
    waits = [line for line in capsys.readouterr().out.splitlines() if "waits for TPU capacity" in line]
    assert len(waits) == 1  # three polls within a minute: one line
    assert (
        "Node pool tpu-1a2b3c4d-0 waits for TPU capacity (GKE: The zone 'projects/my-project/zones/us-east5-b' "
        "does not have enough resources"
    ) in waits[0]


def test_the_wait_ends_at_the_capacity_deadline_with_gkes_reason(monkeypatch):
    trigger = scripted_trigger(monkeypatch, [(RUNNING, [STOCKOUT]), (RUNNING, [STOCKOUT])], deadline=time.time() - 1)
    assert first_event(trigger) == {
        "status": "capacity_timeout",
        "operation_name": "operation-1",
        "node_pool": "tpu-1a2b3c4d-0",
        "message": STOCKOUT["message"],
    }


def test_a_create_gke_ended_while_the_pool_was_read_is_reported_done_for_its_error_to_be_read(monkeypatch):
    """The pool's stockout condition and the operation's end come together: read between the two, the operation's
    own error (a stockout, or something else) is what the task reports."""
    trigger = scripted_trigger(monkeypatch, [(RUNNING, [STOCKOUT]), (DONE, [STOCKOUT])], deadline=time.time() - 1)
    assert first_event(trigger) == {"status": "success", "operation_name": "operation-1"}


def test_the_wait_asks_again_when_gke_does_not_answer_for_a_while_and_fails_when_it_never_does(monkeypatch):
    """A 503 (UNAVAILABLE), a passed deadline or a 429 is GKE's front end, not the create: the wait asks again; ten
    in a row end it with the error, which fails the task (its retry waits on the same operation)."""
    from google.api_core.exceptions import DeadlineExceeded, PermissionDenied, ServiceUnavailable, TooManyRequests

    blips = [(ServiceUnavailable("The service is currently unavailable."), []), (DeadlineExceeded("late"), [])]
    blips.append((TooManyRequests("Quota exceeded for quota metric 'Requests'"), []))
    trigger = scripted_trigger(monkeypatch, [*blips, (RUNNING, []), *blips, (DONE, [])], deadline=time.time() + 3600)
    assert first_event(trigger) == {"status": "success", "operation_name": "operation-1"}
    outage = scripted_trigger(monkeypatch, blips * 4, deadline=time.time() + 3600)
    expected = {
        "status": "error",
        "message": "503 The service is currently unavailable.",
        "operation_name": "operation-1",
    }
    assert first_event(outage) == expected  # the tenth error in a row
    refused = scripted_trigger(monkeypatch, [(PermissionDenied("no"), [])], deadline=time.time() + 3600)
    assert first_event(refused) == {"status": "error", "message": "403 no", "operation_name": "operation-1"}


QUOTA = {
    "code": "GCE_QUOTA_EXCEEDED",
    "canonical_code": "RESOURCE_EXHAUSTED",
    "message": "Quota 'TPUS_PER_TPU_FAMILY' exceeded. Limit: 0.0 in region us-east5.",
}


def test_quota_is_not_a_stockout_the_wait_ends_at_once(monkeypatch):
    """RESOURCE_EXHAUSTED can mean quota: waiting capacity_wait_minutes for quota that will not come wastes it."""
    trigger = scripted_trigger(monkeypatch, [(RUNNING, [QUOTA]), (DONE, [])], deadline=time.time() + 3600)
    assert first_event(trigger) == {
        "status": "quota",
        "operation_name": "operation-1",
        "node_pool": "tpu-1a2b3c4d-0",
        "message": QUOTA["message"],
    }


def quota_failure() -> str:
    """The message of the pool create's failure once GKE ended the create for quota, with an hour of wait left."""
    operator = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", capacity_retry_interval=120)
    with pytest.raises(AirflowFailException) as failed:
        operator.operation_done(
            context(),
            {"status": "success", "operation_name": "operation-2"},
            next_step=0,
            capacity_deadline=time.time() + 3600,
        )
    return str(failed.value)


def test_a_quota_failure_names_the_compute_engine_quota_and_what_to_request(monkeypatch):
    stocked_out_operation(
        monkeypatch,
        "Insufficient regional quota to satisfy request: "
        'resource "TPUS_PER_TPU_FAMILY": '
        "request requires '64.0' and is short '64.0'. [GCE_QUOTA_EXCEEDED]",
    )
    message = quota_failure()  # plenty of wait left: still fails at once
    assert (
        "Compute Engine quota for 64 v6e-64 chips in us-east5: TPUS_PER_TPU_FAMILY (dimension tpu_family CT6E)"
        in message
    )
    assert "not the Cloud TPU API's" in message and "Waiting does not help" in message


@pytest.mark.parametrize(
    ("message", "named"),
    [
        (
            "Insufficient regional quota to satisfy request: resource \"IN_USE_ADDRESSES\": request requires '16.0' "
            "and is short '8.0'. project has a quota of '8.0' with '8.0' available. [GCE_QUOTA_EXCEEDED]",
            "IN_USE_ADDRESSES in us-east5 (in-use IP addresses",
        ),
        ("Quota 'C4D_CPUS' exceeded.  Limit: 96.0 in region us-east5. [GCE_QUOTA_EXCEEDED]", "C4D_CPUS in us-east5"),
    ],
)
def test_a_quota_failure_that_is_not_tpu_chips_names_the_quota_gke_named(monkeypatch, message, named):
    """A run's nodes also draw IP address, CPU and disk quota: the hint said TPU chips whatever GKE named."""
    stocked_out_operation(monkeypatch, message)
    message = quota_failure()
    assert f"fix: the project lacks Compute Engine quota {named}" in message and ", not TPU chips." in message
    assert "v6e-64 chips" not in message and "Quotas a run needs" in message


def test_a_create_longer_than_one_with_capacity_is_waited_for_until_gke_ends_it(monkeypatch, capsys):
    """A create still running long after the run's capacity deadline, GKE naming no reason, may be slow (GKE made
    one RUNNING after about 35 minutes, showing ERROR meanwhile: NVIDIA/aicr 2065) or held for capacity (GKE then
    ends it with GCE_STOCKOUT, which the operator reads): the wait goes on until GKE says which, and says why."""
    long_ago = datetime.fromtimestamp(time.time() - 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    trigger = scripted_trigger(
        monkeypatch, [(RUNNING, []), (RUNNING, []), (DONE, [])], deadline=time.time() - 1, started=long_ago
    )
    assert first_event(trigger) == {"status": "success", "operation_name": "operation-1"}
    out = capsys.readouterr().out
    assert (
        "Node pool tpu-1a2b3c4d-0: GKE has been creating the pool for 17 minutes and names no reason: a slow create, "
        "or GKE retrying for capacity"
    ) in out
    assert "waiting for GKE to end it" in out and "waits for TPU capacity" not in out


def test_a_slow_create_without_a_capacity_condition_is_not_given_up(monkeypatch):
    trigger = scripted_trigger(monkeypatch, [(RUNNING, []), (RUNNING, []), (DONE, [])], deadline=time.time() - 1)
    assert first_event(trigger)["status"] == "success"


def test_the_trigger_survives_serialization():
    trigger = TpuPoolCreateTrigger(
        operation_name="operation-1",
        project_id="p",
        location="us-east5",
        pool_path=POOL_PATH,
        capacity_deadline=123.0,
        create_seconds=60.0,
    )
    path, kwargs = trigger.serialize()
    assert path == "tpu_rl.triggers.gke.TpuPoolCreateTrigger"
    assert TpuPoolCreateTrigger(**kwargs).serialize() == (path, kwargs)
    # A wait deferred under 2.1.1, whose trigger extended the provider's and serialised its keywords, resumes.
    older = {**kwargs, "use_dns_endpoint": False}
    assert TpuPoolCreateTrigger(**older).serialize() == (path, kwargs)


# The operator's decisions.


def context():
    return task_context(
        TaskInstanceStandIn("maxtext_rl_tpu", "manual__capacity", "create_tpu_pools"),
        {**TUTORIAL_CONF, "capacity_wait_minutes": 30},
    )


STOCKOUT_ERROR = (
    "Google Compute Engine: Not all instances running in IGM. Current errors: [GCE_STOCKOUT]: "
    "Instance 'gke-x' creation failed: The zone 'projects/my-project/zones/us-east5-b' does not have "
    "enough resources available to fulfill the request."
)


def stocked_out_operation(monkeypatch, message=STOCKOUT_ERROR):
    operation = SimpleNamespace(
        name="operation-2",
        error=SimpleNamespace(code=8, message=message),
        status_message=message,
        operation_type=Operation.Type.CREATE_NODE_POOL,
        target_link=f"https://container.googleapis.com/v1/{POOL_PATH}".replace("my-project", "123456"),
    )
    monkeypatch.setattr(GkeApiHook, "get_operation", lambda self, name: operation)


def test_a_stockout_within_the_wait_creates_the_pool_again_later_deferred(monkeypatch):
    stocked_out_operation(monkeypatch)
    operator = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", capacity_retry_interval=120)
    deadline = time.time() + 1800
    with pytest.raises(TaskDeferred) as deferred:
        operator.operation_done(
            context(), {"status": "success", "operation_name": "operation-2"}, next_step=1, capacity_deadline=deadline
        )
    assert deferred.value.method_name == "retry_after_stockout"
    assert deferred.value.kwargs == {"step": 0, "capacity_deadline": deadline}
    assert 110 < deferred.value.trigger.moment.timestamp() - time.time() <= 120


def test_a_stockout_past_the_wait_fails_with_what_to_do(monkeypatch):
    stocked_out_operation(monkeypatch)
    operator = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools", capacity_retry_interval=120)
    with pytest.raises(AirflowFailException) as failed:
        operator.operation_done(
            context(),
            {"status": "success", "operation_name": "operation-2"},
            next_step=1,
            capacity_deadline=time.time() + 60,
        )
    assert str(failed.value).startswith("GKE could not create TPU node pool tpu-1a2b3c4d-0: Google Compute Engine")
    assert "fix: there is no v6e-64 capacity in us-east5-b now" in str(failed.value)
    assert "a longer capacity_wait_minutes" in str(failed.value)


def test_a_pool_held_past_the_wait_fails_naming_the_pool_and_gkes_reason():
    operator = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools")
    event = {
        "status": "capacity_timeout",
        "operation_name": "operation-1",
        "node_pool": "tpu-1a2b3c4d-0",
        "message": STOCKOUT["message"],
    }
    with pytest.raises(AirflowFailException) as failed:
        operator.operation_done(context(), event, next_step=1, capacity_deadline=time.time())
    assert str(failed.value).startswith(
        "GKE had no capacity for TPU node pool tpu-1a2b3c4d-0 within capacity_wait_minutes (30): The zone "
    )


def test_pool_conditions_are_read_with_their_enum_names():
    """canonical_code is a google.rpc.Code number in the API types, code a proto-plus enum."""
    from google.cloud.container_v1 import NodePool, StatusCondition

    from tpu_rl.hooks.gke import AsyncGkeApiHook

    pool = NodePool(
        name="tpu-1a2b3c4d-0",
        conditions=[
            StatusCondition(code=StatusCondition.Code.GCE_STOCKOUT, canonical_code=8, message=STOCKOUT["message"])
        ],
    )

    class Client:
        def get_node_pool(self, name, timeout):
            assert name == POOL_PATH
            return pool

    class ProviderHook:  # the provider's GKEAsyncHook: its sync hook holds the client
        async def get_sync_hook(self):
            return SimpleNamespace(get_cluster_manager_client=Client)

    hook = AsyncGkeApiHook("google_cloud_default", "my-project", "us-east5")
    hook._provider_hook = ProviderHook()
    assert asyncio.run(hook.node_pool_conditions(POOL_PATH)) == [STOCKOUT]


@pytest.mark.parametrize(
    "link, target",
    [
        # GKE's operation links name the project by number (API reference Operation.target_link)
        (
            "https://container.googleapis.com/v1/projects/805818759045/locations/us-east5/clusters/qwen-rl",
            ("qwen-rl", None),
        ),
        (
            "https://container.googleapis.com/v1/projects/805818759045/locations/us-east5/clusters/qwen-rl/nodePools/tpu-0",
            ("qwen-rl", "tpu-0"),
        ),
        (
            "https://container.googleapis.com/v1/projects/123/zones/us-east5-b/clusters/qwen-rl/nodePools/tpu-0/node/n-1",
            ("qwen-rl", "tpu-0"),
        ),
        (
            "https://container.googleapis.com/v1/projects/123/locations/us-east5/clusters/qwen-rl-2/nodePools/tpu-0",
            ("qwen-rl-2", "tpu-0"),
        ),
    ],
)
def test_an_operations_target_is_read_whatever_names_the_project(link, target):
    from tpu_rl.gke import operation_target

    assert operation_target(link) == target
