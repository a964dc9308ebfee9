"""JobSetOperator against the simulated cluster: real apiserver, JobSet controller and webhooks,
scheduler, Job controller and pod GC; pods run on kwok nodes, with faults from pod annotations.

Each test drives the operator as Airflow does (execute, defer, the trigger rebuilt from its
serialized form, resume); see conftest.run_operator.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from jobset_helpers import (
    CONN_ID,
    REPO,
    SIM,
    _first_event,
    run_operator,
    tpu_jobset,
    unique,
)

from tpu_rl.operators.jobset import JobSetFailedError, JobSetOperator
from tpu_rl_testing import TaskInstanceStandIn, spare_tpu_pool, task_context

pytestmark = pytest.mark.jobset
HERE = Path(__file__).resolve().parent


def operator(manifest: dict, **kwargs) -> JobSetOperator:
    kwargs.setdefault("progress_interval", 10)
    return JobSetOperator(task_id="train", manifest=manifest, kubernetes_conn_id=CONN_ID, **kwargs)


def ti_for(name: str, try_number: int = 1) -> TaskInstanceStandIn:
    return TaskInstanceStandIn("jobset_tests", f"manual__{name}", "train", try_number)


def test_success_streams_log_and_a_retry_does_not_resubmit(sim, capfd):
    name = unique("ok")
    ti = ti_for(name)
    result = run_operator(operator(tpu_jobset(name, run_seconds=4)), task_context(ti))

    assert result["state"] == "Completed" and result["restarts"] == 0
    assert any("[simulated] workload-container started on" in line for line in result["log_tail"])
    assert f"[{name}-main-job-0-0-" in capfd.readouterr().out  # streamed live, from the index-0 pod
    (jobset,) = sim.jobsets(name)
    meta = jobset["metadata"]
    assert meta["labels"]["tpu-rl.dev/task-id"] == "train"
    assert meta["annotations"]["tpu-rl.dev/run-id"] == ti.run_id
    assert meta["annotations"]["tpu-rl.dev/submitted-try"] == "1"
    assert ti.pushed("jobset")["uid"] == meta["uid"]

    again = run_operator(operator(tpu_jobset(name)), task_context(ti_for(name, try_number=2)))
    assert again["uid"] == meta["uid"] and again["state"] == "Completed"
    assert len(sim.jobsets(name)) == 1


def test_failure_names_condition_exit_code_and_log(sim):
    name = unique("fail")
    manifest = tpu_jobset(name, annotations={f"{SIM}exit-code": "3"})
    with pytest.raises(JobSetFailedError) as failure:
        run_operator(operator(manifest), task_context(ti_for(name)))
    message = str(failure.value)
    assert f"JobSet default/{name} failed: Failed (" in message
    assert f"Failed replicated job: main-job (child Job {name}-main-job-0)" in message
    assert "workload-container exited 3 (Error)" in message
    assert "Last " in message and "[simulated] workload-container started on" in message

    # The same try never resubmits; a new try replaces the failed JobSet.
    uid = sim.jobsets(name)[0]["metadata"]["uid"]
    with pytest.raises(JobSetFailedError):
        run_operator(operator(manifest), task_context(ti_for(name)))
    assert sim.jobsets(name)[0]["metadata"]["uid"] == uid
    result = run_operator(operator(tpu_jobset(name)), task_context(ti_for(name, try_number=2)))
    assert result["state"] == "Completed" and result["uid"] != uid
    assert len(sim.jobsets(name)) == 1


def test_restart_within_max_restarts_then_success(sim, capfd):
    name = unique("restart")
    manifest = tpu_jobset(name, run_seconds=6, max_restarts=1, annotations={f"{SIM}fail-attempts": "1"})
    result = run_operator(operator(manifest), task_context(ti_for(name)))
    assert result["state"] == "Completed" and result["restarts"] == 1
    out = capfd.readouterr().out
    assert "restarted: restart 1" in out
    assert out.count("Following workload-container of pod") >= 2  # followed the new pod


def test_killed_while_waiting_reattaches_without_resubmitting(sim, capfd):
    name = unique("kill")
    child = subprocess.Popen(
        [sys.executable, str(HERE / "run_jobset_task.py"), name, "20"],
        env={**os.environ, "PYTHONPATH": f"{HERE}:{HERE.parent}"},
    )
    try:
        sim.wait_running(name)
        os.kill(child.pid, signal.SIGKILL)  # a worker crash: no on_kill, no cleanup
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    (before,) = sim.jobsets(name)
    result = run_operator(operator(tpu_jobset(name, run_seconds=20)), task_context(ti_for(name)))
    assert "Adopting running JobSet" in capfd.readouterr().out
    assert result["uid"] == before["metadata"]["uid"] and result["state"] == "Completed"
    assert len(sim.jobsets(name)) == 1


def run_with_action(op, context, action):
    """Run the operator; once deferred, call ``action()`` in a thread while the trigger waits."""
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    trigger = deferred.value.trigger

    async def main():
        waiting = asyncio.create_task(_first_event(trigger))
        await asyncio.to_thread(action)
        return await waiting

    event = asyncio.run(main())
    return op.resume_execution(deferred.value.method_name, {"event": event.payload}, context)


def test_jobset_deleted_from_outside_fails_clearly(sim):
    name = unique("gone")
    op = operator(tpu_jobset(name, run_seconds=60))

    def delete_when_running():
        sim.wait_running(name)
        sim.delete_jobset(name)

    with pytest.raises(JobSetFailedError, match=rf"JobSet default/{name} \(uid .*\) was deleted while the task waited"):
        run_with_action(op, task_context(ti_for(name)), delete_when_running)


def test_tpu_node_deleted_mid_run_is_host_loss(sim):
    """On two hosts of a pool of their own: a host of the standing slice deleted here would fail, meanwhile, the
    end-to-end scenarios that make test runs beside this test ("Found 15 nodes ... the training needs 16")."""
    name = unique("host")
    lost = {}

    def delete_node():
        pods = sim.wait_running(name)
        lost["node"] = pods[0].spec.node_name
        sim.core.delete_node(lost["node"])

    with spare_tpu_pool(sim.core) as (pool, _):
        manifest = tpu_jobset(name, run_seconds=300, node_selector={"cloud.google.com/gke-nodepool": pool})
        with pytest.raises(JobSetFailedError) as failure:
            run_with_action(operator(manifest), task_context(ti_for(name)), delete_node)
    message = str(failure.value)
    assert f"Cause: TPU host lost (node gone: {lost['node']})" in message
    assert "host lost (its node no longer exists) [DisruptionTarget DeletionByPodGC" in message


def test_execution_timeout_while_deferred_deletes_the_jobset(sim):
    from airflow.sdk.exceptions import TaskDeferralTimeout

    name = unique("timeout")
    op = operator(tpu_jobset(name, run_seconds=120), execution_timeout=timedelta(seconds=10))
    context = task_context(ti_for(name))
    with pytest.raises(TaskDeferralTimeout):
        run_operator(op, context)
    deferral = context["deferred"].timeout
    assert timedelta(seconds=5) < deferral <= timedelta(seconds=10)
    sim.wait("the JobSet and its pods to be deleted", lambda: not sim.jobsets(name) and not sim.pods(name), timeout=60)


class _TriggerOfATask:
    """The operator's trigger as the triggerer runs it, its task instance's state read from ``states`` in turn
    (the triggerer's supervisor answers it from the metadata database)."""

    def __init__(self, trigger, *states: str) -> None:
        self.trigger, self.states = trigger, list(states)
        trigger._task_state = self._state

    async def _state(self) -> str:
        return self.states.pop(0)

    async def cancel_after(self, seconds: float) -> None:
        """Runs the trigger and cancels it, as the triggerer does, once the trainer has run a while."""
        waiting = asyncio.ensure_future(anext(self.trigger.run()))
        await asyncio.sleep(seconds)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting


def test_kill_from_the_worker_deletes_the_jobset(sim):
    """The worker's on_kill (SIGTERM while the task executes)."""
    from airflow.sdk.exceptions import TaskDeferred

    name = unique("kill-worker")
    op = operator(tpu_jobset(name, run_seconds=120))
    with pytest.raises(TaskDeferred):
        op.execute(task_context(ti_for(name)))
    op.on_kill()
    sim.wait("JobSet deleted by the worker's kill", lambda: not sim.jobsets(name), timeout=60)


@pytest.mark.parametrize("start_delay", [30.0, 0.0], ids=["before-the-wait-started", "while-it-waits"])
def test_a_trigger_cancelled_once_its_task_left_the_wait_deletes_the_jobset(sim, monkeypatch, start_delay):
    """The trigger cancelled because its task left the deferral (a user marked it failed: its state is
    ``failed``), whether the wait had started (its JobSet watched) or was still in its random start delay."""
    from airflow.sdk.exceptions import TaskDeferred

    from tpu_rl.triggers import jobset as jobset_trigger

    monkeypatch.setattr(jobset_trigger.random, "uniform", lambda low, high: start_delay)
    name = unique("kill-trigger")
    op = operator(tpu_jobset(name, run_seconds=120))
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(task_context(ti_for(name)))
    asyncio.run(_TriggerOfATask(deferred.value.trigger, "failed").cancel_after(3))
    sim.wait("JobSet deleted by the trigger's kill", lambda: not sim.jobsets(name), timeout=60)


def test_a_trigger_cancelled_while_its_task_waits_keeps_the_jobset(sim):
    """Airflow cancels a trigger also when its wait went to another triggerer (this one's heartbeat lapsed: paused,
    throttled) or the triggerer stops; Airflow 3.3 then calls on_kill as for a user's kill. The task is still
    deferred: the training goes on, its JobSet untouched."""
    from airflow.sdk.exceptions import TaskDeferred

    name = unique("handover")
    op = operator(tpu_jobset(name, run_seconds=120))
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(task_context(ti_for(name)))
    uid = sim.jobsets(name)[0]["metadata"]["uid"]
    asyncio.run(_TriggerOfATask(deferred.value.trigger, "deferred").cancel_after(3))
    asyncio.run(deferred.value.trigger.on_kill())  # what Airflow 3.3 calls next
    time.sleep(2)
    (jobset,) = sim.jobsets(name)
    assert jobset["metadata"]["uid"] == uid and "deletionTimestamp" not in jobset["metadata"]


def test_delete_on_kill_false_keeps_the_jobset(sim):
    from airflow.sdk.exceptions import TaskDeferred

    name = unique("keep")
    op = operator(tpu_jobset(name, run_seconds=5), delete_on_kill=False)
    with pytest.raises(TaskDeferred):
        op.execute(task_context(ti_for(name)))
    op.on_kill()
    time.sleep(1)
    assert len(sim.jobsets(name)) == 1


def test_suspended_jobset_is_reported_then_runs_when_admitted(sim, capfd):
    """Kueue admits by flipping spec.suspend; the sim has no Kueue, so the test admits by hand (and the
    trigger's Kueue lookup meets a cluster without the Workload API)."""
    name = unique("susp")
    manifest = tpu_jobset(name, run_seconds=2)
    manifest["spec"]["suspend"] = True

    def admit():
        sim.wait(
            "the suspension to be reported",
            lambda: "suspended (waiting for Kueue admission" in capfd.readouterr().out,
            timeout=30,
        )
        sim.custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", name, {"spec": {"suspend": False}}
        )

    result = run_with_action(operator(manifest, progress_interval=5), task_context(ti_for(name)), admit)
    assert result["state"] == "Completed"


def pathways_jobset(name: str) -> dict:
    """Pathways-shaped: a head whose workload-container decides success, and TPU workers that never end."""
    head = tpu_jobset(name, hosts=1, run_seconds=3, replicated_job="pathways-head")["spec"]["replicatedJobs"][0]
    head["template"]["spec"]["template"]["spec"]["nodeSelector"] = {"cloud.google.com/gke-nodepool": "cpu-np"}
    del head["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    worker = tpu_jobset(name, hosts=2, replicated_job="worker")["spec"]["replicatedJobs"][0]
    pod = worker["template"]["spec"]["template"]["spec"]
    pod["restartPolicy"] = "OnFailure"
    pod["containers"][0]["name"] = "pathways-worker"
    manifest = tpu_jobset(name)
    manifest["spec"].update(
        replicatedJobs=[head, worker],
        successPolicy={"operator": "All", "targetReplicatedJobs": ["pathways-head"]},
        startupPolicy={"startupPolicyOrder": "InOrder"},
    )
    return manifest


def test_pathways_jobset_follows_the_head_and_completes_with_it(sim, capfd):
    name = unique("pw")  # well under the 22 characters a Pathways name may have
    result = run_operator(operator(pathways_jobset(name)), task_context(ti_for(name)))
    assert result["state"] == "Completed"
    assert f"Following workload-container of pod {name}-pathways-head-0-0-" in capfd.readouterr().out
    assert any("[simulated] workload-container started on" in line for line in result["log_tail"])


def test_a_jobsets_log_cursor_is_an_annotation_of_that_incarnation_only(sim):
    """How far a trigger logged is recorded as the real apiserver and JobSet webhooks take a patch of one
    annotation: set, replaced only where it still reads the value the writer holds (compare and swap, so a
    stalled trigger cannot overwrite the record of the one that took its wait over), and refused for a replaced
    incarnation (another uid under the same name)."""
    from tpu_rl.hooks.kubernetes import AsyncKubernetesApiHook, ClusterTarget, KubernetesApiHook

    name = unique("cursor")
    key = "tpu-rl.dev/log-cursor"
    target = ClusterTarget(kubernetes_conn_id=CONN_ID)
    created = KubernetesApiHook(target).create_jobset(tpu_jobset(name, run_seconds=60), "default")
    uid, hook = created["metadata"]["uid"], AsyncKubernetesApiHook(target)

    def annotate(value: str, uid: str = uid, replacing: str | None = None) -> bool:
        return asyncio.run(hook.annotate_jobset(name, "default", uid, key, value, replacing=replacing))

    try:
        assert annotate('{"pod":"p"}')
        (jobset,) = sim.jobsets(name)
        assert jobset["metadata"]["annotations"][key] == '{"pod":"p"}'
        assert jobset["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"]  # the others stay
        assert annotate('{"pod":"q"}', replacing='{"pod":"p"}')
        assert not annotate('{"pod":"stale"}', replacing='{"pod":"p"}')  # another writer replaced it meanwhile
        assert not annotate("{}", uid="another-uid")
        assert not annotate("{}", uid="another-uid", replacing='{"pod":"q"}')
        assert sim.jobsets(name)[0]["metadata"]["annotations"][key] == '{"pod":"q"}'
    finally:
        sim.delete_jobset(name)


def test_a_jobset_create_that_meets_its_own_earlier_create_returns_that_jobset(sim):
    """A create the API server applied but whose answer was lost is made again (the hooks retry a reset
    connection) and meets itself (409): the JobSet carrying every annotation of the submission is that create's;
    one of the same name without them is a real conflict."""
    import copy

    from kubernetes.client.exceptions import ApiException

    from tpu_rl.hooks.kubernetes import ClusterTarget, KubernetesApiHook

    name = unique("twice")
    hook = KubernetesApiHook(ClusterTarget(kubernetes_conn_id=CONN_ID))
    body = tpu_jobset(name, run_seconds=60)
    body["metadata"].setdefault("annotations", {})["tpu-rl.dev/submitted-try"] = "1"
    first = hook.create_jobset(copy.deepcopy(body), "default")
    try:
        assert hook.create_jobset(copy.deepcopy(body), "default")["metadata"]["uid"] == first["metadata"]["uid"]
        body["metadata"]["annotations"]["tpu-rl.dev/submitted-try"] = "2"
        with pytest.raises(ApiException) as conflict:
            hook.create_jobset(body, "default")
        assert conflict.value.status == 409
    finally:
        sim.delete_jobset(name)


def test_a_retry_that_adopts_a_completed_jobset_has_the_evaluation_its_trigger_recorded(sim):
    """Nothing watches a Completed JobSet a new try adopts, and its pods' logs may be gone: the lines the run reads
    after the training come from the record the trigger kept on the JobSet."""
    from tpu_rl.hooks.kubernetes import AsyncKubernetesApiHook, ClusterTarget

    class Recording(JobSetOperator):
        def after_completed(self, context, event):
            self.completed_event = event

    name = unique("adopt-eval")
    ti = ti_for(name)
    first = run_operator(operator(tpu_jobset(name, run_seconds=2)), task_context(ti))
    post = "Post RL Training: corr=9, total=20, accuracy=45.0%"
    record = json.dumps({"pod": "p", "last_ts": "", "at_last_ts": [], "kept": {"Post": post}})
    hook = AsyncKubernetesApiHook(ClusterTarget(kubernetes_conn_id=CONN_ID))
    assert asyncio.run(hook.annotate_jobset(name, "default", first["uid"], "tpu-rl.dev/log-cursor", record))
    retry = Recording(task_id="train", manifest=tpu_jobset(name), kubernetes_conn_id=CONN_ID)
    assert retry.execute(task_context(ti_for(name, try_number=2)))["uid"] == first["uid"]
    assert retry.completed_event == {"evaluation_lines": [post]}


def test_a_flooded_log_the_kubelet_rotates_leaves_a_task_log_one_can_read(sim, capfd):
    """A trainer that logs every rollout (the emulator's ``flood=12``: 12 MiB of Tunix's rollout lines over the pod's
    run) has the kubelet rotate its log (10 MiB): the task log gets a minute's share of those lines, a line saying
    how many it left out, and the end of the log; the follower reads on across the rotation."""

    class Recorded(JobSetOperator):
        def trigger_kwargs(self):
            return {"log_cursor": True}

    name = unique("flood")
    manifest = tpu_jobset(name, run_seconds=25, annotations={f"{SIM}maxtext-fault": "flood=12"})
    op = Recorded(task_id="train", manifest=manifest, kubernetes_conn_id=CONN_ID, progress_interval=10)
    result = run_operator(op, task_context(ti_for(name)))

    assert result["state"] == "Completed"
    pod_logs = REPO / ".sim" / "podlogs" / "default"
    assert list(pod_logs.glob(f"{name}-main-job-0-0-*/workload-container.log.*")), "the log was not rotated"
    out = capfd.readouterr().out
    assert len(out) < 2**20, f"{len(out)} characters of task log"
    assert "of the workload's log not copied here in the last" in out
    assert "(step 0, prompt " in result["log_tail"][-1]  # the failure report's tail is the log's own end


class Watched(JobSetOperator):
    """A stage whose trigger runs the watchdog with a start window of ``START_WINDOW`` seconds."""

    def trigger_kwargs(self):
        from tpu_rl.watchdog import Windows

        return {"log_cursor": True, "watchdog": Windows(start_seconds=START_WINDOW, bound_scheduling=True).to_dict()}


START_WINDOW = 20
#: The window, then one look of the watchdog (15 s) and the deletion.
WATCHDOG_BOUND = START_WINDOW + 15 + 45


def run_watched(manifest: dict, name: str) -> str:
    """The stage's failure message, once its wait ended on the watchdog; checks that it ended within the bound and
    that the JobSet went with it (its pods free their nodes)."""
    started = time.monotonic()
    with pytest.raises(JobSetFailedError) as failure:
        run_operator(
            Watched(task_id="train", manifest=manifest, kubernetes_conn_id=CONN_ID, progress_interval=10),
            task_context(ti_for(name)),
        )
    assert time.monotonic() - started < WATCHDOG_BOUND
    return str(failure.value)


def test_pods_that_cannot_pull_their_image_end_the_stage_at_its_start_window_and_free_their_nodes(sim):
    """Before the watchdog the wait went on until the task's timeout (72 hours for the training, on each try)."""
    name = unique("pull")
    message = run_watched(tpu_jobset(name, run_seconds=600, annotations={f"{SIM}waiting": "ImagePullBackOff"}), name)
    assert f"JobSet default/{name} was deleted by the watchdog" in message
    assert "did not all run within 20 s (0 of 2 running)" in message
    # Each pod counts its window from its node: on a loaded machine the second may be placed seconds after the first,
    # and the watchdog ends the stage once the first is late.
    assert re.search(r"[12] pod\(s\) of main-job \(e\.g\. ", message), message
    assert "ImagePullBackOff: Back-off pulling image" in message
    assert "fix: check that the image exists" in message
    sim.wait("the JobSet gone", lambda: not sim.jobsets(name), timeout=60)


def test_workers_that_never_join_the_pathways_head_end_the_training_at_its_start_window(sim):
    """The head runs, waiting for its TPU workers; a fault rule (the emulator's path, as on a created cluster) keeps
    the workers' containers from starting."""
    from sim import faults

    name = unique("nojoin")
    with faults.rules_removed_after(sim.core) as api:
        manifest = pathways_jobset(name)
        head = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        head["metadata"]["annotations"][f"{SIM}run-seconds"] = "600"  # a trainer would wait for its workers that long
        faults.set_fault(api, f"{name}-workers", prefix=name, replicated_job="worker", waiting="ContainerCreating")
        message = run_watched(manifest, name)
    # The head runs; each worker counts its window from its node, so the first late one may end the stage alone.
    assert "(1 of 3 running)" in message and re.search(r"[12] pod\(s\) of worker \(e\.g\. ", message), message
    assert "pathways-worker waiting: ContainerCreating" in message
    sim.wait("the JobSet gone", lambda: not sim.jobsets(name), timeout=60)
