"""A trigger's sync call that asks the triggerer's supervisor (a task's state, a connection), cut short by a bound or
by Airflow's cancellation, leaves the channel to the supervisor sound: the trigger runner's next request still gets
its own reply. On Airflow 3.1.7 (``make test-compat``) the same call through ``sync_to_async`` under
``asyncio.timeout`` ends the runner with "Response read out of order" (apache/airflow#64620), as the 3.1.7 stack's
triggerer did when it woke from a stall; from a plain thread (``asyncio.to_thread``) the runner's requests stop being
answered. The runner's real ``TriggerCommsDecoder`` of the installed Airflow talks to a supervisor that answers each
request in order, 0.3 s later, over a socket pair."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import msgspec
import pytest

from tpu_rl.hooks.in_thread import in_thread, run_to_the_end

REPLY_SECONDS = 0.3


class Supervisor:
    """The supervisor's end: reads request frames, answers each GetTaskStates after REPLY_SECONDS."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.answered: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        from airflow.sdk.execution_time.comms import TaskStatesResult, _RequestFrame, _ResponseFrame

        decoder = msgspec.msgpack.Decoder(_RequestFrame)
        stream = self.sock.makefile("rb")
        while len(head := stream.read(4)) == 4:
            frame = decoder.decode(stream.read(int.from_bytes(head, "big")))
            time.sleep(REPLY_SECONDS)
            runs = frame.body["run_ids"]
            reply = TaskStatesResult(task_states={run: {"train_rl": "deferred"} for run in runs})
            self.answered.extend(runs)  # before the reply: its reader may go on before this thread does
            self.sock.sendall(_ResponseFrame(id=frame.id, body=reply.model_dump(), error=None).as_bytes())


@pytest.fixture
async def runner_channel(monkeypatch):
    """The trigger runner's decoder, as ``TriggerRunner`` sets it up, with the supervisor at the other end."""
    from airflow.jobs.triggerer_job_runner import TriggerCommsDecoder
    from airflow.sdk.execution_time import task_runner

    ours, theirs = socket.socketpair()
    supervisor = Supervisor(theirs)
    reader, writer = await asyncio.open_connection(sock=ours)
    decoder = TriggerCommsDecoder(async_writer=writer, async_reader=reader, socket=ours)
    if hasattr(decoder, "start_reader"):  # Airflow 3.3's decoder reads replies in a task of its own
        await decoder.start_reader()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", decoder, raising=False)
    yield decoder, supervisor
    writer.close()
    theirs.close()


def _state_of(run_id: str) -> dict:
    """What the JobSet trigger asks when Airflow cancels its wait (``JobSetTrigger._task_state``)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    return RuntimeTaskInstance.get_task_states(dag_id="maxtext_rl_tpu", task_ids=["train_rl"], run_ids=[run_id])


async def _runners_own_request(decoder, run_id: str) -> dict:
    """A request of the runner itself on its loop (as its ``sync_state_to_supervisor`` sends every pass)."""
    from airflow.sdk.execution_time.comms import GetTaskStates

    reply = await asyncio.wait_for(
        decoder.asend(GetTaskStates(dag_id="maxtext_rl_tpu", task_ids=["train_rl"], run_ids=[run_id])), 10
    )
    return reply.task_states


async def test_a_supervisor_request_cut_short_by_its_bound_or_a_cancel_leaves_the_runners_channel_sound(
    runner_channel,
):
    decoder, supervisor = runner_channel

    # Cut short by the caller's bound (the trigger's 30-s cancel decision on a loaded triggerer).
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await in_thread(_state_of, "bounded")
    assert time.monotonic() - started < REPLY_SECONDS  # the caller stopped waiting at its bound
    assert await _runners_own_request(decoder, "runner-1") == {"runner-1": {"train_rl": "deferred"}}

    # Cut short by a cancellation (Airflow cancels the trigger again on each pass of its loop).
    call = asyncio.ensure_future(in_thread(_state_of, "cancelled"))
    await asyncio.sleep(0.05)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await _runners_own_request(decoder, "runner-2") == {"runner-2": {"train_rl": "deferred"}}

    # The calls cut short ran to their end: the supervisor answered them, and their replies were read by them.
    assert supervisor.answered[:4] == ["bounded", "runner-1", "cancelled", "runner-2"]


async def test_triggers_asking_at_once_beside_the_runner_each_get_their_own_reply(runner_channel):
    """A triggerer that takes several waits over (a stalled one's) starts them at once: each reads its connection
    and, cancelled, its task's state, while the runner sends its own requests."""
    decoder, _ = runner_channel
    triggers = [in_thread(_state_of, f"trigger-{n}") for n in range(4)]
    runner = [_runners_own_request(decoder, f"runner-{n}") for n in range(2)]
    replies = await asyncio.wait_for(asyncio.gather(*triggers, *runner), 30)
    assert replies == [{f"trigger-{n}": {"train_rl": "deferred"}} for n in range(4)] + [
        {f"runner-{n}": {"train_rl": "deferred"}} for n in range(2)
    ]


async def test_a_coroutine_run_to_the_end_outlives_its_callers_cancellation_and_bound():
    ended = asyncio.Event()

    async def work():
        await asyncio.sleep(0.1)
        ended.set()
        return "done"

    waiting = asyncio.ensure_future(run_to_the_end(work()))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.wait_for(ended.wait(), 5)  # the work went on to its end

    ended.clear()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await run_to_the_end(work())
    await asyncio.wait_for(ended.wait(), 5)
    assert await run_to_the_end(work()) == "done"
