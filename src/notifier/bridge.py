"""The one trio ↔ asyncio bridge. asyncpg and aiormq run on the trio-asyncio loop opened here.

Only ``store`` and ``broker`` import from this module; everything else is trio all the way down.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from types import CodeType
from typing import Any, ParamSpec, TypeVar

import trio
import trio_asyncio

log = logging.getLogger("notifier.bridge")

P = ParamSpec("P")
T = TypeVar("T")


def _log_unhandled(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # trio-asyncio's default handler re-raises and would take the whole process down for an
    # exception nobody retrieved (e.g. a late confirm of a cancelled publish). Log it instead.
    exc = context.get("exception")
    log.warning("asyncio: %s", context.get("message", "unhandled error"), exc_info=exc)


# At most this many asyncio callbacks run between two trio checkpoints of the loop's task.
READY_BATCH_LIMIT = 512
# Cancelled timers are dropped once the loop's timer heap holds at least this many timers and
# has doubled since the last time they were (drop_cancelled_timers).
TIMER_PURGE_MIN = 1024


def run_ready_in_batches(loop: trio_asyncio.TrioEventLoop) -> None:
    """Make ``loop`` run every asyncio callback that is ready, up to ``READY_BATCH_LIMIT``, each
    time trio schedules it, as asyncio's own loop does — instead of one per trio checkpoint.

    trio-asyncio's loop task takes one callback from its queue per pass and then yields to trio's
    scheduler (the queue's ``receive`` is a checkpoint). Every step of asyncpg and aiormq (a frame
    read, a future resolved, a task resumed) is such a callback, so each one waited for a whole
    round of every runnable trio task: the asyncio side of the process — the relay's publishes,
    the workers' batches and acknowledgements — advanced at one step per round, and an ingest
    load with many busy connections starved it (docs/architecture.md §7). Per callback it also
    paid a cancel scope and a checkpoint.

    A pass runs its first callback, then the ones that are ready at that moment (those scheduled
    meanwhile wait for the next pass, so a callback that schedules itself cannot hold the task).
    ``no_wait`` passes (trio-asyncio's own draining at shutdown) keep the original behaviour:
    one callback, ``WouldBlock`` when none.
    The override is of ``_main_loop_one``, the per-pass method of trio-asyncio 0.16's loop (the
    version is pinned; ``tests/unit/test_bridge.py`` fails if it changes shape).
    """
    one = loop._main_loop_one
    queue = loop._q_recv
    timers: list[asyncio.TimerHandle] = loop._timers
    purge_at = TIMER_PURGE_MIN

    async def run_ready(no_wait: bool = False) -> None:
        nonlocal purge_at
        await one(no_wait)
        if no_wait:
            return
        for _ in range(min(queue.statistics().current_buffer_used, READY_BATCH_LIMIT)):
            try:
                await one(True)  # a plain callback or a due timer: no checkpoint
            except trio.WouldBlock:
                break
        if len(timers) >= purge_at:
            purge_at = max(TIMER_PURGE_MIN, 2 * drop_cancelled_timers(timers))

    loop._main_loop_one = run_ready


def drop_cancelled_timers(timers: list[asyncio.TimerHandle]) -> int:
    """Take the cancelled timers out of a loop's timer heap; how many are left.

    asyncio's loop drops cancelled timers once they are half its heap; trio-asyncio's keeps each
    one until it is due. asyncpg's pool schedules a timer every time a connection is given back
    (to close it after ``max_inactive_connection_lifetime``, 300 s) and cancels it at the next
    acquire, so a busy process held one cancelled timer per store call of the last five minutes
    (RSS grew by about 60 bytes per delivery until it levelled off). ``run_ready_in_batches``
    calls this whenever the heap has doubled since the last time: amortised constant work.
    """
    live = [t for t in timers if not t.cancelled()]
    if len(live) < len(timers):
        timers[:] = live
        heapq.heapify(timers)
    return len(timers)


# The code of the coroutine functions marked ``never_suspends``.
_RUN_AT_ONCE: set[CodeType] = set()
F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])


def never_suspends(fn: F) -> F:
    """Mark an asyncio-flavoured coroutine function that never suspends (it awaits nothing,
    or only what completes without waiting): a task that a library makes of one of its calls
    on the bridge's loop is run at once, to its end, and is a finished future
    (``run_at_once``).

    What it saves: aiormq makes a task of every call of a consumer callback, one per message,
    and such a task costs the loop four callbacks — its step, the callback that checks its
    outcome, and a callback of each of the two future stores that track it — besides the task
    itself; run at once, it costs none. A marked function that suspends after all is a bug:
    ``RuntimeError`` where the library created the task."""
    _RUN_AT_ONCE.add(fn.__code__)
    return fn


class _Finished(asyncio.Future[Any]):
    """A future that ends before anyone sees it: a callback added to it runs at once (asyncio's
    would wait for the loop's next pass, for nothing: nobody awaits the result)."""

    def add_done_callback(self, fn: Callable[[Any], object], *, context: Any = None) -> None:
        if context is None:
            fn(self)
        else:
            context.run(fn, self)


def run_at_once(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
) -> asyncio.Future[Any]:
    """The bridge loop's task factory: a coroutine of a ``never_suspends`` function runs now
    and becomes a finished future (with its result or its exception, as its task would have
    had); any other becomes the ``asyncio.Task`` the loop would make without a factory."""
    if getattr(coro, "cr_code", None) not in _RUN_AT_ONCE:
        return asyncio.Task(coro, loop=loop, **kwargs)
    done = _Finished(loop=loop)
    try:
        coro.send(None)
    except StopIteration as stop:
        done.set_result(stop.value)
    except asyncio.CancelledError:
        done.cancel()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        done.set_exception(exc)
    else:
        coro.close()
        name = getattr(coro, "__qualname__", coro)
        raise RuntimeError(f"{name} suspended, but is marked never_suspends")
    return done


@asynccontextmanager
async def open_bridge() -> AsyncIterator[None]:
    """Trio-flavoured. Open the trio-asyncio loop, unless one is already open in this task tree."""
    if trio_asyncio.current_loop.get() is not None:
        yield
        return
    async with trio_asyncio.open_loop() as loop:
        loop.set_exception_handler(_log_unhandled)
        loop.set_task_factory(run_at_once)
        run_ready_in_batches(loop)
        yield


async def aio(fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Trio-flavoured: run the asyncio-flavoured ``fn(*args, **kwargs)`` on the bridge loop."""
    result: T = await trio_asyncio.aio_as_trio(fn)(*args, **kwargs)
    return result
