"""Sync work off the triggerer's event loop, in a way Airflow 3.1's channel to the triggerer's supervisor survives.

A sync call in a trigger may ask the supervisor (an Airflow connection, a task's state, a variable). Before Airflow
3.3, the trigger runner reads each reply on its event loop, in order, under an ``asyncio.Lock``
(``TriggerCommsDecoder.asend``): a request sent from a plain thread (``asyncio.to_thread``) runs on a second event
loop and races it for the socket, and a request cancelled after it was sent (asgiref's ``sync_to_async`` cancels the
send it started when its caller is cancelled) leaves its reply unread. Either way the next reply is "read out of
order", and the trigger runner dies with every trigger of the triggerer (apache/airflow#64620, on 3.1.8; fixed by
PR 66412, whose 3.3 decoder matches replies to requests). Met on 3.1.7's stack: a triggerer that woke from a stall,
its lost waits cancelled, each asking the task's state within a bound, died that way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Calls whose caller stopped waiting: held until they end (a task without a reference may be collected).
_ABANDONED: set[asyncio.Task] = set()


async def run_to_the_end(awaitable: Awaitable[T], /) -> T:
    """``awaitable`` run as a task of its own that is never cancelled: a caller cancelled meanwhile (Airflow cancels
    a trigger again on each pass of its loop; a bound such as ``asyncio.timeout`` cancels too) stops waiting while
    the work runs to its end, and the reply of any supervisor request it sent is read. For a provider's coroutine
    that may ask the supervisor through ``sync_to_async`` (a hook's connection)."""
    call = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait({call})
    finally:
        if not call.done():
            _ABANDONED.add(call)
            call.add_done_callback(_forget)
    return call.result()


async def in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, as :func:`run_to_the_end` runs it: through asgiref's
    ``sync_to_async``, whose thread sends a supervisor request on the runner's own loop (``asyncio.to_thread``'s
    would send it from a loop of its own)."""
    from asgiref.sync import sync_to_async

    return await run_to_the_end(sync_to_async(fn, thread_sensitive=False)(*args, **kwargs))


def _forget(call: asyncio.Task) -> None:
    _ABANDONED.discard(call)
    if not call.cancelled():
        call.exception()  # read, so that asyncio does not log it as never retrieved
