"""The trigger's parts that need no cluster: its serialized form and the log cursor used on reconnects."""

from tpu_rl import jobset_status as st
from tpu_rl.hooks.kubernetes import ClusterTarget
from tpu_rl.triggers.jobset import JobSetTrigger
from tpu_rl.triggers.workload_log import JobSetLogRecord, LogCursor, LogPrinter, WorkloadLogFollower, carried_through
from tpu_rl_testing import jobset_trigger


def test_trigger_round_trips_through_its_serialized_form():
    trigger = jobset_trigger(log_container="workload-container", progress_interval=60)
    classpath, kwargs = trigger.serialize()
    assert classpath == "tpu_rl.triggers.jobset.JobSetTrigger"
    assert JobSetTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_a_trigger_serialised_before_the_cluster_was_one_object_still_loads():
    """A task deferred across a deploy: its trigger row names the cluster with the old keywords."""
    old = {
        "name": "n",
        "namespace": "ns",
        "uid": "u",
        "log_replicated_job": "pathways-head",
        "log_container": "workload-container",
        "kubernetes_conn_id": None,
        "cluster_url": "https://34.1.2.3",
        "ssl_ca_cert": "Q0E=",
        "gcp_conn_id": "g",
        "impersonation_chain": None,
        "use_dns_endpoint": False,
        "progress_interval": 60,
        "log_tail_lines": 100,
        "delete_on_kill": True,
    }
    trigger = JobSetTrigger(**old)
    assert trigger.cluster == ClusterTarget(cluster_url="https://34.1.2.3", ssl_ca_cert="Q0E=", gcp_conn_id="g")
    assert trigger.serialize()[1]["cluster"]["cluster_url"] == "https://34.1.2.3"


def test_reconnect_drops_lines_already_seen_and_keeps_new_ones():
    cursor = LogCursor()
    first = ["2026-11-29T10:00:01.5Z step 1", "2026-11-29T10:00:02Z step 2", "2026-11-29T10:00:02Z step 2b"]
    assert [cursor.new_text(x) for x in first] == ["step 1", "step 2", "step 2b"]
    # A reconnect with sinceSeconds returns some lines again; kubelet timestamps drop trailing zeros.
    again = ["2026-11-29T10:00:01.5Z step 1", "2026-11-29T10:00:02Z step 2b", "2026-11-29T10:00:02.000000001Z step 3"]
    assert [cursor.new_text(x) for x in again] == [None, None, "step 3"]


def test_the_kubelets_own_error_in_a_log_stream_is_no_line_and_loses_none():
    """Right after a container starts, the kubelet may answer a followed log with its own error after the headers
    ("failed to try resolving symlinks in path ..."): it is no line of the trainer, so it takes no place in the log
    (it once did, and every line after it counted as already logged: the task log lost the trainer's lines)."""
    import asyncio
    from types import SimpleNamespace

    from tpu_rl.triggers.wait_progress import Progress

    error = 'failed to try resolving symlinks in path "/var/log/pods/default_head-0_u/c/0.log": lstat: no such file'
    stamped = [f"2026-12-02T10:00:0{i}.5Z line {i}" for i in range(5)]
    pod = SimpleNamespace(uid="pod-uid", name="head-0")
    api, log = _JobSetApi(), _Log()

    class Hook:
        def __init__(self, lines):
            self.lines = lines

        async def follow_log(self, pod, namespace, container, since):
            for raw in self.lines:
                yield raw

    async def read_twice() -> list[tuple[bool, bool]]:
        store = JobSetLogRecord(api, "n", "ns", "u")
        printer = LogPrinter(log, store, await store.claim())
        follower, cursor, progress = jobset_trigger().log_follower(printer), LogCursor(), Progress(tail_lines=10)
        reads = [await follower.read(Hook([error, *stamped]), pod, cursor, progress)]
        reads.append(await follower.read(Hook(stamped), pod, cursor, progress))
        await printer.flush(final=True)
        return reads

    assert asyncio.run(read_twice()) == [(False, False), (True, True)]  # the first read failed: read again
    assert [line.partition("] ")[2] for line in log.lines if line.startswith("[head-0]")] == [
        f"line {i}" for i in range(5)
    ]


class _JobSetApi:
    """The cluster's JobSet as the log cursor's store reaches it, in memory: what a dead triggerer's trigger
    recorded on the JobSet stays there. A patch names the incarnation (uid) it is for and, with ``replacing``, the
    value it replaces (the apiserver's JSON patch ``test``)."""

    def __init__(self, uid: str = "u") -> None:
        self.jobset: dict = {"metadata": {"name": "n", "uid": uid, "annotations": {}}}
        self.patches = 0

    async def get_jobset(self, name, namespace):
        return self.jobset

    async def annotate_jobset(self, name, namespace, uid, key, value, *, replacing=None):
        annotations = self.jobset["metadata"]["annotations"]
        if uid != self.jobset["metadata"]["uid"] or (replacing is not None and annotations.get(key) != replacing):
            return False
        self.patches += 1
        annotations[key] = value
        return True


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message, *args):
        self.lines.append(message % args)

    warning = info


def test_a_trigger_that_takes_over_logs_what_the_dead_one_had_not_and_nothing_twice():
    """Airflow gives a dead triggerer's trigger to another triggerer, rebuilt from its serialised form: the new
    one reads the log from its start (for the tail and the evaluation), logs from the line after the last one
    the dead trigger recorded, and so the task log holds every line once."""
    import asyncio
    from types import SimpleNamespace

    from tpu_rl.triggers.wait_progress import Progress

    stamped = [f"2026-12-02T10:{i // 60:02d}:{i % 60:02d}.5Z line {i}" for i in range(120)]
    stamped[5] = (
        "2026-12-02T10:00:05.5Z W1202 10:00:05.482113 139872 train_rl.py:786] Pre RL Training: corr=8, total=20, "
        "accuracy=40.0%, partial_accuracy=50.0%, format_accuracy=95.0%, mean_reward=0.4950"
    )
    pod = SimpleNamespace(uid="pod-uid", name="head-0")
    api = _JobSetApi()
    trigger = jobset_trigger()

    class Hook:
        def __init__(self, upto: int) -> None:
            self.upto = upto

        async def follow_log(self, pod, namespace, container, since):
            for raw in stamped[: self.upto]:
                yield raw

    async def wait(upto: int, record_every: int, log: _Log) -> Progress:
        store = JobSetLogRecord(api, "n", "ns", "u")
        printer = LogPrinter(log, store, await store.claim())
        progress, follower = Progress(tail_lines=200), trigger.log_follower(printer)
        for end in range(record_every, upto + 1, record_every):
            await follower.read(Hook(end), pod, trigger_cursor, progress)
            await printer.flush()
        return progress

    first_log, second_log = _Log(), _Log()
    trigger_cursor = LogCursor()
    # The first triggerer logs 70 lines in batches of 10, reads 5 more, and dies before the next batch.
    asyncio.run(wait(70, 10, first_log))
    store = JobSetLogRecord(api, "n", "ns", "u")
    asyncio.run(trigger.log_follower(LogPrinter(first_log, store)).read(Hook(75), pod, trigger_cursor, Progress(200)))
    trigger_cursor = LogCursor()
    assert st.log_record_text(api.jobset, "another-uid") is None  # a replacement's record is its own
    second = asyncio.run(wait(120, 120, second_log))

    logged = [line.partition("] ")[2] for line in first_log.lines + second_log.lines if line.startswith("[head-0]")]
    assert logged == [raw.partition(" ")[2] for raw in stamped]
    assert len(second.tail) == 120 and "Pre" in second.evaluation  # what came before the takeover is read again
    assert api.patches == 10  # one patch of the JobSet a batch, and one as each trigger started


def test_a_trigger_that_stalled_while_another_took_its_wait_over_logs_no_more():
    """A triggerer that stops heartbeating without dying (paused, throttled) loses its triggers to another
    triggerer, and runs on for a moment when it wakes up, until it cancels them. What it read meanwhile is the
    other one's to log: it finds the record changed, logs nothing more, and each line is in the task log once."""
    import asyncio
    from types import SimpleNamespace

    pod = SimpleNamespace(uid="pod-uid", name="head-0")
    stamped = [f"2026-12-02T10:00:{i:02d}.5Z line {i}" for i in range(30)]
    api = _JobSetApi()

    async def scenario() -> tuple[_Log, _Log]:
        stalled_log, taker_log = _Log(), _Log()
        stalled_store = JobSetLogRecord(api, "n", "ns", "u")
        stalled = LogPrinter(stalled_log, stalled_store, await stalled_store.claim())
        for raw in stamped[:20]:  # it logs ten lines, reads ten more, and stalls before their batch
            stalled.add(pod, raw, raw.partition(" ")[2])
            if raw == stamped[9]:
                await stalled.flush()
        taker_store = JobSetLogRecord(api, "n", "ns", "u")
        taker = LogPrinter(taker_log, taker_store, await taker_store.claim())
        for raw in stamped:
            if not taker.logged_before(pod, raw):
                taker.add(pod, raw, raw.partition(" ")[2])
        await stalled.flush()  # it wakes up: its batch is due
        stalled.add(pod, stamped[29], "line 29")
        await stalled.flush()
        await taker.flush()
        return stalled_log, taker_log

    stalled_log, taker_log = asyncio.run(scenario())
    logged = [line.partition("] ")[2] for line in stalled_log.lines + taker_log.lines if line.startswith("[head-0]")]
    assert logged == [f"line {i}" for i in range(30)]
    assert any("Another trigger of this wait logs the workload's log now" in line for line in stalled_log.lines)


def _remote_logging_takeover(first_confirms: bool, second_stalls: bool = False) -> tuple[list[str], list[str]]:
    """With remote logging, a trigger logs lines 0-69 of a pod's log in batches; then its triggerer dies (or, with
    ``first_confirms``, it was only paused and confirms its upload as it wakes up). Another trigger takes the wait
    over and reads the whole log (lines 0-119); with ``second_stalls`` it stalls before it settled the first one's
    lines and a third takes over. Returns what the task log shows (the logs Airflow uploaded) and every line."""
    import asyncio
    from types import SimpleNamespace

    pod = SimpleNamespace(uid="pod-uid", name="head-0")
    stamped = [f"2026-12-02T10:{i // 60:02d}:{i % 60:02d}.5Z line {i}" for i in range(120)]
    api = _JobSetApi()

    async def taker(log: _Log) -> LogPrinter:
        printer = await LogPrinter.resumed(log, JobSetLogRecord(api, "n", "ns", "u"), recover=True)
        for raw in stamped:
            if not printer.logged_before(pod, raw):
                printer.add(pod, raw, raw.partition(" ")[2])
        return printer

    async def scenario() -> list[_Log]:
        first_log, second_log, third_log = _Log(), _Log(), _Log()
        first = await LogPrinter.resumed(first_log, JobSetLogRecord(api, "n", "ns", "u"), recover=True)
        for i, raw in enumerate(stamped[:70]):
            first.add(pod, raw, raw.partition(" ")[2])
            if i % 10 == 9:
                await first.flush()
        second = await taker(second_log)
        await second.flush()
        assert not [line for line in second_log.lines if line.startswith("[head-0]")]  # held, not yet settled
        if second_stalls:
            third = await taker(third_log)
            await second.confirm_upload()  # it wakes up, finds the wait gone, ends: its (empty) log is uploaded
            second, second_log = third, third_log
        if first_confirms:
            await first.confirm_upload()
        second.recover_by = 0  # the wait for the first one's confirmation ran out
        await second.flush(final=True)
        uploaded = [first_log] if first_confirms else []
        return [*uploaded, second_log]

    logs = asyncio.run(scenario())
    shown = [line.partition("] ")[2] for log in logs for line in log.lines if line.startswith("[head-0]")]
    return shown, [raw.partition(" ")[2] for raw in stamped]


def test_with_remote_logging_the_lines_of_a_triggerer_that_died_are_logged_again():
    """Airflow uploads a trigger's log only when the trigger ends in a live triggerer: a triggerer that dies takes
    what it logged with it. The trigger that takes the wait over logs those lines again (those the kubelet still
    has), once the dead one's confirmation did not come, before the lines after them: the task log is complete."""
    shown, every_line = _remote_logging_takeover(first_confirms=False)
    assert shown == every_line


def test_with_remote_logging_a_paused_triggerer_that_confirms_its_upload_has_its_lines_logged_once():
    shown, every_line = _remote_logging_takeover(first_confirms=True)
    assert shown == every_line


def test_with_remote_logging_a_taker_that_stalls_before_it_settled_leaves_the_lines_to_the_next():
    shown, every_line = _remote_logging_takeover(first_confirms=False, second_stalls=True)
    assert shown == every_line


def test_the_evaluation_before_training_outlives_a_rotated_log_and_a_triggerer_restart():
    """The trainer logs every rollout; the kubelet rotates its log at 10 MiB. A trigger that takes the wait over
    after the rotation reads a log without the "Pre RL Training" line: the record on the JobSet kept it, with
    each batch the dead trigger logged, and so the run still has the evaluation before training."""
    import asyncio
    from types import SimpleNamespace

    pre = (
        "2026-12-02T10:00:05.5Z W1202 10:00:05.482113 139872 train_rl.py:786] Pre RL Training: corr=8, total=20, "
        "accuracy=40.0%, partial_accuracy=50.0%, format_accuracy=95.0%, mean_reward=0.4950"
    )
    pod = SimpleNamespace(uid="pod-uid", name="head-0")
    api = _JobSetApi()

    async def scenario() -> LogPrinter:
        store = JobSetLogRecord(api, "n", "ns", "u")
        first = LogPrinter(_Log(), store, await store.claim())
        for raw in ("2026-12-02T10:00:01.5Z step 1", pre, "2026-12-02T10:00:09.5Z step 2"):
            first.add(pod, raw, raw.partition(" ")[2])
        await first.flush()
        # The triggerer dies; the log rotates; another triggerer's trigger takes the wait over.
        return await LogPrinter.resumed(_Log(), JobSetLogRecord(api, "n", "ns", "u"))

    taker = asyncio.run(scenario())
    assert taker.kept == {"Pre": pre.partition(" ")[2]}


def test_a_pod_that_ends_while_its_log_stream_backs_off_is_read_at_once():
    """A container that runs but whose log cannot be read yet makes the follower back off (up to 30 s); the pod
    failing meanwhile wakes it, so a short-lived pod's last lines (the failure report's, the evaluation's) are
    read before the JobSet's end is reported, not lost to the back-off."""
    import asyncio
    import time

    from tpu_rl.triggers.wait_progress import Progress
    from tpu_rl.vocabulary import COMPLETION_INDEX_LABEL, JOB_INDEX_LABEL, REPLICATED_JOB_LABEL

    trigger = jobset_trigger()
    labels = {REPLICATED_JOB_LABEL: "pathways-head", JOB_INDEX_LABEL: "0", COMPLETION_INDEX_LABEL: "0"}

    def pod(phase: str) -> dict:
        return {"metadata": {"name": "head-0", "uid": "pod-uid", "labels": labels}, "status": {"phase": phase}}

    class Hook:
        calls = 0

        async def follow_log(self, name, namespace, container, since):
            Hook.calls += 1
            if progress.pods["pod-uid"].phase == "Running":
                raise RuntimeError('(400) no logs found for container "c"')
            yield "2026-12-02T10:00:05.5Z Post RL Training: corr=9, total=20"

    async def scenario() -> float:
        follower = asyncio.create_task(trigger.log_follower().follow(Hook(), progress))
        while Hook.calls < 2:  # the second read failed: the follower now backs off for 4 s
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        ended = time.monotonic()
        progress.record_pod("MODIFIED", pod("Failed"))
        while not progress.tail:
            await asyncio.sleep(0.05)
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        return time.monotonic() - ended

    progress = Progress(tail_lines=10)
    progress.record_pod("ADDED", pod("Running"))
    waited = asyncio.run(scenario())
    assert list(progress.tail) == ["Post RL Training: corr=9, total=20"]
    assert waited < 1.5, f"the ended pod's log was read {waited:.1f} s after it ended, at the end of the back-off"


async def test_a_helper_cancelled_just_as_the_pods_change_stops():
    """When the JobSet finished, the trigger cancels its helpers and waits for them before it fires. A helper
    waiting for the pods to change, cancelled in the same turn of the loop as the pods watch saw a change, once
    returned from its wait instead (asyncio.wait_for on Python 3.11, CPython gh-86296) and looped on for ever:
    the trigger never fired, train_rl stayed deferred and its slice up."""
    import asyncio

    from tpu_rl.triggers.wait_progress import Progress

    progress = Progress(tail_lines=10)

    async def follower():  # follow() with nothing left to follow: it waits for the pods, again and again
        while True:
            await WorkloadLogFollower.wait_for_pods(progress)

    task = asyncio.create_task(follower())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    progress.pods_changed.set()  # the pods watch saw a change ...
    task.cancel()  # ... in the turn the trigger stops its helpers
    done, _ = await asyncio.wait({task}, timeout=1)
    assert done and task.cancelled()


PRE_LINE = (
    "2026-12-02T10:00:20.5Z W1202 10:00:20.482113 139872 train_rl.py:786] Pre RL Training: corr=8, total=20, "
    "accuracy=40.0%, partial_accuracy=50.0%, format_accuracy=95.0%, mean_reward=0.4950"
)


def _rollouts(count: int) -> list[str]:
    """Tunix's "Rollout string metric" lines (rl_cluster.py: a numpy array of prompts, one element a line)."""
    return [
        f"2026-12-02T10:{(i // 1000) // 60:02d}:{(i // 1000) % 60:02d}.{i % 1000:03d}Z "
        f" 'Question: Natalia sold clips to {i} of her friends in April, and then she sold half as many ...'"
        for i in range(count)
    ]


def test_a_trainer_that_logs_every_rollout_leaves_a_task_log_one_can_read():
    """Megabytes of prompts and completions a step: the task log gets a minute's budget of them, every evaluation
    line, warning and error, and one line saying what it left out; the record still has read to the last line, so
    a takeover repeats none and skips none of what was copied."""
    import asyncio
    from types import SimpleNamespace

    from tpu_rl.triggers.workload_log import LOG_LINES_A_MINUTE

    pre = PRE_LINE
    error = "2026-12-02T10:00:30.5Z E1202 10:00:30.100000 139872 rl_cluster.py:612] Skipping metric rewards"
    flood = _rollouts(20000)
    lines = flood[:10000] + [pre] + flood[10000:15000] + [error] + flood[15000:]
    pod = SimpleNamespace(uid="pod-uid", name="head-0")
    api, log = _JobSetApi(), _Log()

    async def scenario() -> LogPrinter:
        store = JobSetLogRecord(api, "n", "ns", "u")
        printer = LogPrinter(log, store, await store.claim())
        for raw in lines:
            printer.add(pod, raw, raw.partition(" ")[2])
        await printer.flush(final=True)
        return await LogPrinter.resumed(_Log(), JobSetLogRecord(api, "n", "ns", "u"))

    taker = asyncio.run(scenario())
    copied = [line for line in log.lines if line.startswith("[head-0]")]
    assert len(copied) == LOG_LINES_A_MINUTE + 2
    assert pre.partition(" ")[2] in copied[-2] and error.partition(" ")[2] in copied[-1]
    assert sum(len(line) for line in log.lines) < 100_000  # the trainer wrote about 2 MiB
    assert log.lines[-1].startswith(f"{20000 - LOG_LINES_A_MINUTE} line(s) (1.")
    assert "`kubectl logs head-0` has them" in log.lines[-1]
    assert taker.kept == {"Pre": pre.partition(" ")[2]}
    assert all(taker.logged_before(pod, raw) for raw in (lines[0], lines[-1]))


def test_a_line_longer_than_the_task_log_takes_is_cut():
    from types import SimpleNamespace

    from tpu_rl.triggers.workload_log import LOG_LINE_CHARS

    log = _Log()
    LogPrinter(log).add(SimpleNamespace(uid="u", name="p"), "2026-12-02T10:00:00Z x", "x" * (LOG_LINE_CHARS + 500))
    assert log.lines == [f"[p] {'x' * LOG_LINE_CHARS} ... (500 characters more)"]


def test_the_evaluation_before_training_is_recorded_as_soon_as_it_is_read():
    """Not a minute later: a trainer flooding its log has the kubelet rotate the line away within the minute, and a
    triggerer lost meanwhile would leave the run without its baseline."""
    import asyncio
    from types import SimpleNamespace

    pre = PRE_LINE
    api = _JobSetApi()

    async def scenario() -> None:
        store = JobSetLogRecord(api, "n", "ns", "u")
        printer = LogPrinter(_Log(), store, await store.claim())
        batches = asyncio.create_task(jobset_trigger().log_follower(printer).log_batches(None, None))
        printer.add(SimpleNamespace(uid="pod-uid", name="head-0"), pre, pre.partition(" ")[2])
        await asyncio.sleep(0.5)
        batches.cancel()

    asyncio.run(scenario())
    assert st.log_record(api.jobset, "u")["kept"] == {"Pre": pre.partition(" ")[2]}


def test_a_trigger_cancelled_again_while_it_decides_still_decides():
    """Airflow 3.3 sends the id of a trigger its triggerer no longer holds with every state sync until the trigger
    is done (``TriggerRunnerSupervisor.cancelling_triggers``), and the runner cancels it on each: a decision that
    takes a few seconds (the task's state, asked through the supervisor of a triggerer that just woke up) meets
    several cancellations. It is carried to its end: the wait that went elsewhere says so and keeps its JobSet,
    and a task that left the wait has its JobSet deleted."""
    import asyncio

    deleted, log = [], _Log()

    class Hook:
        async def delete_jobset(self, name, namespace, uid):
            deleted.append(uid)

    def decide(state: str) -> bool:
        trigger = jobset_trigger()
        trigger._log = log  # LoggingMixin's logger

        async def task_state():
            await asyncio.sleep(0.3)
            return state

        trigger._task_state = task_state

        async def scenario() -> bool:
            deciding = asyncio.create_task(trigger._cancelled_with_the_task(Hook()))
            for _ in range(3):
                await asyncio.sleep(0.05)
                deciding.cancel("user action")  # airflow/jobs/triggerer_job_runner.py _USER_ACTION_CANCEL_MSG
            return await deciding

        return asyncio.run(scenario())

    assert decide("deferred") is False
    assert "was cancelled while its task is deferred: another triggerer goes on with it" in "\n".join(log.lines)
    assert deleted == []
    assert decide("failed") is True
    assert deleted == [jobset_trigger().uid]


def test_a_trigger_cancelled_again_as_it_ends_still_confirms_its_upload():
    """A paused triggerer that wakes up has the wait it lost cancelled on each pass of its loop until the trigger is
    done. Its confirmation that its log goes to remote storage is carried to its end: without it, the trigger that
    took the wait over would log this one's lines a second time."""
    import asyncio

    class SlowApi(_JobSetApi):
        async def annotate_jobset(self, *args, **kwargs):
            await asyncio.sleep(0.3)
            return await super().annotate_jobset(*args, **kwargs)

    api = SlowApi()

    async def scenario() -> str:
        record = JobSetLogRecord(api, "n", "ns", "u")
        printer = LogPrinter(_Log(), record, await record.claim(recover=True))
        trigger = jobset_trigger()
        trigger._log = _Log()

        async def wait_that_is_cancelled():
            try:
                await asyncio.sleep(60)
            finally:
                helpers = [asyncio.create_task(asyncio.sleep(60))]  # the pod watch, the log's follower, ...
                await carried_through(trigger._stop(helpers, None, printer))

        waiting = asyncio.create_task(wait_that_is_cancelled())
        for _ in range(4):
            await asyncio.sleep(0.1)
            waiting.cancel("user action")
        await asyncio.gather(waiting, return_exceptions=True)
        return record.owner

    owner = asyncio.run(scenario())
    assert st.log_uploaded(api.jobset, "u", owner)
