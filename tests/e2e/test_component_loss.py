"""Losing a part of Airflow in the middle of a run, on the stack laid out as Composer runs it
(scripts/airflow-stack.sh: two Celery workers that share no disk but the logs, two schedulers, two triggerers).

One run (its own cluster and TPU pool, created by the run) meets every loss in turn:

1. ``create_tpu_pools``: GKE has applied the pool create and not yet answered (the GKE emulator's ``slow-reply``
   fault) when the Celery worker that sent it is SIGKILLed. The scheduler fails the try when its heartbeat stops;
   the retry finds the pool and waits on its operation: one create was ever sent.
2. ``train_rl``, once deferred: the worker that ran its first part stops taking work (Celery's
   ``cancel_consumer``), so its resumption runs on the other worker, which has none of the first one's HOME,
   temporary or working directory.
3. While the trainer runs, the triggerer that holds ``train_rl``'s trigger is SIGKILLed: the other triggerer
   takes the trigger over. The stack has remote logging on (to the simulation's Cloud Storage, as Composer's
   bucket), and Airflow uploads a trigger's log only when the trigger ends: what the killed triggerer logged is
   never uploaded, so the trigger that took over logs those lines again.
4. Then the triggerer that holds it now stalls (SIGSTOP, as a long pause, CPU throttling or a network cut leave a
   process alive and silent) until the first one, started again, has taken its triggers over, and comes back
   (SIGCONT) and cancels the triggers it lost. Airflow 3.3 calls their ``on_kill`` as for a user's kill: the
   training goes on, untouched, and the stalled trigger logs no more of it. One training JobSet ran, the task log
   holds each trainer line once and says where each new trigger went on, and the evaluation is right. (In this
   order no triggerer job holds the wait twice: Airflow 3.3 truncates a triggerer's log of a trigger when the same
   triggerer job starts it again, ``TriggerLoggingFactory`` opening it with "wb", and the lines it logged the first
   time would be lost from the task log.)
5. One scheduler is SIGKILLed during the run; the other carries it to the end.

Every component killed is started again (as Composer replaces a machine), so the scenarios that run beside this
one on the same stack keep two of each. The run starts at the start of the e2e session (a test marked ``e2e_start``)
and is checked by a test ordered last (``e2e_last``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import traceback
import uuid
from pathlib import Path

import pytest
from celery import Celery

from sim import faults
from tpu_rl.run import RunIdentity
from tpu_rl_testing import GKE_PARENT, SIM_CREATE_CONF, SMALL_SLICE, cluster_or_none, stack_answer, wait_until

pytestmark = pytest.mark.e2e

DAG_ID = "maxtext_rl_tpu"
STACK = Path(stack_answer("state"))  # the pid files and the components' logs
TOKEN = uuid.uuid4().hex[:6]
CLUSTER = f"e2e-loss-{TOKEN}"
RUN_ID = f"e2e__component_loss__{TOKEN}"
CONF = {**SIM_CREATE_CONF, **SMALL_SLICE, "cluster_name": CLUSTER}
#: Long enough for a triggerer to stall and another to die, each noticed (30 s) and their trigger started elsewhere
#: while the trainer runs. On the 3.1.7 stack, which make test runs beside the main session on two cores, a takeover
#: takes minutes: there the trainer once ended before the stall came, which then found no trigger to stall.
TRAINING_SECONDS = 600 if os.environ.get("TPU_RL_STACK") == "af31" else 330
#: How late GKE answers the pool create: the worker is killed meanwhile (the client's own deadline is 45 s).
SLOW_REPLY_SECONDS = 40
WORKERS = ("worker-a", "worker-b")
#: The stack's Celery broker (scripts/airflow-stack.sh), for control commands to its workers.
CONTROL = Celery(broker=f"redis://127.0.0.1:{stack_answer('redis-port')}/0")


def executions(task_id: str) -> list[str]:
    """The workers that started a workload of this run's task, in order (each worker's own log)."""
    seen = []
    for worker in WORKERS:
        for line in (STACK / f"{worker}.log").read_text(errors="replace").splitlines():
            if "Executing workload in Celery" in line and f"task_id='{task_id}'" in line and RUN_ID in line:
                seen.append((line[:27], worker))
    return [worker for _, worker in sorted(seen)]


class ComponentLoss:
    """The run and its losses, driven from a thread while the other scenarios run; ``notes`` is what it saw."""

    def __init__(self, stack, gke) -> None:
        self.stack, self.gke = stack, gke
        self.notes: dict = {}
        self.error = ""
        self.thread = threading.Thread(target=self._drive, daemon=True)

    def task(self, task_id: str) -> dict:
        return self.stack.task_instances(DAG_ID, RUN_ID)[task_id]

    @staticmethod
    def consume(node: str, taking_work: bool) -> None:
        """Celery's ``add_consumer``/``cancel_consumer`` of the default queue, sent through the broker from this
        process (the celery command takes half a minute to start on a loaded machine)."""
        change = CONTROL.control.add_consumer if taking_work else CONTROL.control.cancel_consumer
        change("default", destination=[node], reply=True, timeout=10)

    @staticmethod
    def active_tasks(node: str) -> int:
        """How many tasks the worker runs now (Celery's ``inspect active``)."""
        replies = CONTROL.control.inspect(destination=[node], timeout=10).active() or {}
        return sum(len(tasks) for tasks in replies.values())

    def _drive(self) -> None:
        host = socket.gethostname()
        cancelled = None
        try:
            self._lose_the_worker_mid_request()
            # 2. The resumption of train_rl must run on the other worker.
            wait_until("train_rl to defer", lambda: self.task("train_rl")["state"] == "deferred", 900)
            first = executions("train_rl")[0]
            cancelled = f"{first}@{host}"
            self.consume(cancelled, taking_work=False)
            self.notes["train_rl first part on"] = first
            self._lose_the_triggerer()
            self._stall_the_triggerer()
            # 5. A scheduler goes while the training runs, and stays away until the run ended.
            self.stack.script("stop", "--kill", "scheduler")
            self.notes["scheduler killed"] = True
            wait_until("train_rl to resume", lambda: len(executions("train_rl")) > 1, 900)
            self.notes["train_rl resumed on"] = executions("train_rl")[1]
            self.consume(cancelled, taking_work=True)
            cancelled = None
            self.notes["final state"] = self.stack.wait_for_run(DAG_ID, RUN_ID, 1500)
        except Exception:
            self.error = traceback.format_exc()
        finally:
            if cancelled:
                self.consume(cancelled, taking_work=True)
            self.stack.script("start")

    def _lose_the_worker_mid_request(self) -> None:
        """1. The worker sending the pool create dies before GKE's reply comes."""
        wait_until("create_tpu_pools to run", lambda: executions("create_tpu_pools"), 900)
        worker = executions("create_tpu_pools")[0]
        node = f"{worker}@{socket.gethostname()}"
        # It takes no more work, so that the scenarios beside this one lose no task with it (a moment to finish
        # what it runs, while this task prepares its request).
        self.consume(node, taking_work=False)
        with contextlib.suppress(AssertionError):
            wait_until("the worker's other tasks to end", lambda: self.active_tasks(node) <= 1, 15)

        def pool_applied():
            cluster = cluster_or_none(self.gke, CLUSTER)
            return cluster and any(p.name.startswith("tpu-") for p in cluster.node_pools)

        # The task reads the cluster and its pools first: on a loaded machine its request can come a while after
        # it started. From the moment GKE applied it, the reply is SLOW_REPLY_SECONDS away.
        wait_until("GKE to apply the pool create", pool_applied, 300, 0.5)
        running = self.task("create_tpu_pools")["state"] == "running"
        assert running and executions("create_tpu_pools") == [worker], "GKE answered before the worker was killed"
        self.stack.script("stop", "--kill", worker)
        self.notes["worker killed mid-request"] = worker
        self.stack.script("start", worker)  # a new machine in its place

    def _stall_the_triggerer(self) -> None:
        """4. SIGSTOP the triggerer holding train_rl's trigger until the other one took it over, then SIGCONT."""
        holder, component = self._trigger_holder()
        self.stack.script("pause", component)
        try:
            taker = self._taken_over_from(holder)
        finally:
            self.stack.script("resume", component)
        self.notes["triggerer stalled"] = component
        self.notes["trigger taken over from the stalled one by"] = taker["unixname"]
        wait_until(
            "the stalled triggerer to heartbeat again", lambda: component in self._alive_triggerers().values(), 120
        )

    def _lose_the_triggerer(self) -> None:
        """3. SIGKILL the triggerer holding train_rl's trigger."""
        holder, component = self._trigger_holder()
        self.stack.script("stop", "--kill", component)
        self.notes["triggerer killed"] = component
        self.notes["trigger taken over by"] = self._taken_over_from(holder)["unixname"]
        self.stack.script("start", component)

    def _trigger_holder(self) -> tuple[int, str]:
        """The live triggerer job holding train_rl's trigger once it has logged the trainer a while, and its
        component. Waited for: after a takeover, on a loaded machine, the task may show no triggerer for a while (seen
        on the 3.1.7 stack: ``triggerer_job`` null once the trainer had logged), and a holder that stopped
        heartbeating is not the one to stall."""
        trainer_started = "[simulated] python3 -m maxtext"
        wait_until("the trainer's lines in the task log", lambda: trainer_started in self._train_log(), 300, 1)

        def live_holder():
            job = self.task("train_rl").get("triggerer_job") or {}
            alive = self._alive_triggerers()
            return job.get("id") in alive and (job["id"], alive[job["id"]])

        return wait_until("a live triggerer to hold train_rl's trigger", live_holder, 240, 1)

    def _alive_triggerers(self) -> dict[int, str]:
        jobs = self.stack.request("GET", "/api/v2/jobs?job_type=TriggererJob&is_alive=true&limit=100")["jobs"]
        return {job["id"]: job["unixname"] for job in jobs}

    def _taken_over_from(self, holder: int) -> dict:
        def taken_over():
            job = self.task("train_rl").get("triggerer_job") or {}
            return job.get("id") not in (None, holder) and job

        return wait_until("another triggerer to take the trigger", taken_over, 240, 1)

    def _train_log(self) -> str:
        return self.stack.task_log(DAG_ID, RUN_ID, "train_rl", self.task("train_rl")["try_number"])


@pytest.fixture(scope="session")
def component_loss(airflow_stack, session_gke):
    """Starts the run and the thread that takes parts of the stack away from it."""
    from sim import gke_faults

    airflow_stack.wait_for_healthy_dag(DAG_ID)
    airflow_stack.unpause(DAG_ID)
    api = faults.core_api()
    rule = f"e2e-loss-{TOKEN}"
    training = RunIdentity(DAG_ID, RUN_ID).jobset_name(CONF.get("workload_prefix", "qwen"), "train")
    faults.set_fault(api, rule, stage="train_rl", run_seconds=TRAINING_SECONDS, prefix=training)
    gke_faults.set_fault(rule, "slow-reply", pool_prefix="tpu-", cluster=CLUSTER, times=1, seconds=SLOW_REPLY_SECONDS)
    loss = ComponentLoss(airflow_stack, session_gke)
    loss.notes["training rule"] = rule
    try:
        airflow_stack.trigger(DAG_ID, CONF, run_id=RUN_ID)
        loss.thread.start()
        yield loss
    finally:
        loss.thread.join(timeout=1800)
        faults.clear_faults(api, rule)
        gke_faults.clear_faults(rule)


@pytest.mark.e2e_start
def test_the_run_is_started_on_the_distributed_stack(component_loss, airflow):
    status = airflow.script("status").stdout
    for component in ("redis", "scheduler-2", "triggerer-2", *WORKERS):
        assert f"{component}: running" in status


@pytest.mark.e2e_last
def test_a_run_survives_losing_a_worker_a_triggerer_and_a_scheduler(component_loss, airflow, gke):
    component_loss.thread.join(timeout=1800)
    notes = component_loss.notes
    assert not component_loss.error, component_loss.error
    tasks = airflow.task_instances(DAG_ID, RUN_ID)
    # 5. One scheduler was lost during the training, and the other carried the run to the end alone.
    assert notes["scheduler killed"]
    assert notes["final state"] == "success", {t: (ti["state"], ti["try_number"]) for t, ti in tasks.items()}

    # 1. The retry of the pool create adopted the pool GKE had: one create ever reached GKE.
    assert tasks["create_tpu_pools"]["try_number"] == 2
    creates = [
        op
        for op in gke.list_operations(parent=GKE_PARENT).operations
        if op.operation_type.name == "CREATE_NODE_POOL" and f"/clusters/{CLUSTER}/nodePools/" in op.target_link
    ]
    assert len(creates) == 1, [op.target_link for op in creates]
    assert cluster_or_none(gke, CLUSTER) is None  # and the run's teardown deleted it all

    # 2. The deferred task resumed on the other worker (not a retry), which had none of the first one's files.
    assert notes["train_rl resumed on"] != notes["train_rl first part on"]
    assert tasks["train_rl"]["try_number"] == 1

    # 3. and 4. The other triggerers went on with the wait: one training JobSet (the stalled triggerer deleted
    # none when it cancelled the trigger it lost), each trainer line logged once.
    assert notes["trigger taken over from the stalled one by"] != notes["triggerer stalled"]
    assert notes["trigger taken over by"] != notes["triggerer killed"]
    attempts = faults.list_faults(faults.core_api())[notes["training rule"]]["applied"]  # what the trainer ran
    assert len({attempt.rsplit("/", 1)[0] for attempt in attempts}) == 1, attempts
    log = airflow.task_log(DAG_ID, RUN_ID, "train_rl", 1)
    trainer_lines = re.findall(r"^.*?\[(qwen-[^\]]+)\] (.*)$", log, re.M)
    texts = [text for _, text in trainer_lines]
    assert texts and len(texts) == len(set(texts)), "a trainer line was logged twice"
    assert "RL Training Completed Successfully!" in texts
    # The first lines were logged by the killed triggerer, whose log was never uploaded: logged again by its taker.
    assert any("[simulated] python3 -m maxtext" in text for text in texts), texts[:5]
    assert any(text.startswith("train_steps=") for text in texts), texts[:5]
    assert "after the last line an earlier trigger of this wait logged" in log
    # The stalled triggerer, awake, kept the JobSet when Airflow cancelled the wait it lost, and its log reached the
    # task log: it read the task deferred, or (its 30-s bound passed on a loaded machine) kept the JobSet undecided.
    assert re.search(
        r"was cancelled while its task is deferred: another triggerer goes on with it"
        r"|The wait for JobSet \S+ was cancelled; the JobSet is kept",
        log,
    ), log[-3000:]
    evaluation = airflow.xcom(DAG_ID, RUN_ID, "train_rl", "evaluation")
    assert evaluation["before"] and evaluation["after"]
