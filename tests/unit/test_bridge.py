"""The bridge's loop runs every ready asyncio callback per pass, as asyncio does, rather than one
per trio checkpoint (``bridge.run_ready_in_batches``), and runs a task of a coroutine that never
suspends at once (``bridge.never_suspends``)."""

from __future__ import annotations

import asyncio

import pytest
import trio
import trio_asyncio

from notifier.bridge import (
    _RUN_AT_ONCE,
    READY_BATCH_LIMIT,
    TIMER_PURGE_MIN,
    never_suspends,
    open_bridge,
)
from notifier.broker.amqp_consumer import Consumer

CALLBACKS = 200


async def rounds_until_all_ran(callbacks: int) -> int:
    """Schedule ``callbacks`` asyncio callbacks at once; how many trio checkpoints a trio task
    makes before the last one has run."""
    ran: list[int] = []
    async with open_bridge():
        loop = trio_asyncio.current_loop.get()
        for i in range(callbacks):
            loop.call_soon(ran.append, i)
        rounds = 0
        with trio.fail_after(10):
            while len(ran) < callbacks:
                await trio.lowlevel.checkpoint()
                rounds += 1
    assert ran == list(range(callbacks))  # in order, each once
    return rounds


async def test_ready_callbacks_run_together_not_one_per_trio_round() -> None:
    # The stock loop of trio-asyncio needs one trio round per callback (CALLBACKS rounds).
    assert await rounds_until_all_ran(CALLBACKS) <= 3


async def test_a_pass_is_bounded_so_trio_tasks_keep_running() -> None:
    many = 3 * READY_BATCH_LIMIT
    rounds = await rounds_until_all_ran(many)
    assert 3 <= rounds <= 6


async def test_a_callback_that_schedules_itself_does_not_hold_the_loop() -> None:
    spins = 0
    stopped = False

    def again() -> None:
        nonlocal spins
        spins += 1
        if not stopped:
            loop.call_soon(again)

    async with open_bridge():
        loop = trio_asyncio.current_loop.get()
        loop.call_soon(again)
        rounds = 0
        with trio.fail_after(10):
            while rounds < 50:
                await trio.lowlevel.checkpoint()
                rounds += 1
        stopped = True
    # at most two runs of it per pass of the loop (the pass's first callback, then the one it
    # scheduled, which was ready when the pass counted): the trio task's rounds went on
    assert 25 <= spins <= 2 * rounds + 2


async def test_cancelled_timers_do_not_stay_in_the_loop_until_they_are_due() -> None:
    # asyncpg's pool does this on every release and acquire: a 300 s timer, cancelled at once.
    async with open_bridge():
        loop = trio_asyncio.current_loop.get()
        kept = loop.call_later(300, lambda: None)
        for _ in range(20 * TIMER_PURGE_MIN):
            loop.call_later(300, lambda: None).cancel()
        with trio.fail_after(10):
            while loop._q_recv.statistics().current_buffer_used:  # the loop takes them in
                await trio.lowlevel.checkpoint()
            for _ in range(5):
                await trio.lowlevel.checkpoint()
        # a timer once the heap doubled: at most a bound's worth of cancelled ones remain
        assert len(loop._timers) <= TIMER_PURGE_MIN
        assert kept in loop._timers
        kept.cancel()
        # and the heap still works: a live timer set now fires when it is due
        fired = trio.Event()
        due = trio.current_time() + 0.05
        loop.call_later(0.05, fired.set)
        with trio.fail_after(10):
            await fired.wait()
        assert trio.current_time() >= due


# -- coroutines that never suspend (bridge.never_suspends) ---------------------------------------


@never_suspends
async def _record(seen: list[int], value: int) -> int:
    seen.append(value)
    return value * 2


@never_suspends
async def _fail() -> None:
    raise ValueError("bad message")


@never_suspends
async def _suspends() -> None:
    await asyncio.sleep(0)


async def test_a_task_of_a_coroutine_that_never_suspends_has_run_when_it_is_made() -> None:
    seen: list[int] = []
    called: list[object] = []
    async with open_bridge():
        loop = trio_asyncio.current_loop.get()
        task = loop.create_task(_record(seen, 21))
        assert seen == [21]  # already run, before the loop's next pass
        assert task.done()
        assert task.result() == 42
        task.add_done_callback(called.append)  # at once: nobody waits for the loop
        assert called == [task]


async def test_its_exception_is_its_outcome_as_a_tasks_would_be() -> None:
    async with open_bridge():
        loop = trio_asyncio.current_loop.get()
        task = loop.create_task(_fail())
        assert task.done()
        with pytest.raises(ValueError, match="bad message"):
            task.result()


async def test_one_marked_that_suspends_is_refused_where_its_task_is_made() -> None:
    async with open_bridge():
        loop = trio_asyncio.current_loop.get()
        with pytest.raises(RuntimeError, match="suspended"):
            loop.create_task(_suspends())


async def test_any_other_coroutine_becomes_a_task_of_the_loop() -> None:
    seen: list[int] = []

    async def plain() -> int:
        await asyncio.sleep(0)
        seen.append(1)
        return 7

    async with open_bridge():
        result = await trio_asyncio.aio_as_trio(plain)()
        loop = trio_asyncio.current_loop.get()
        task = loop.create_task(plain())
        assert isinstance(task, asyncio.Task)
        assert not task.done()
        assert await trio_asyncio.aio_as_trio(lambda: task)() == 7
    assert result == 7
    assert seen == [1, 1]


def test_the_consumer_callback_is_marked() -> None:
    # aiormq makes a task of every call of it: one per message
    assert Consumer._on_message.__code__ in _RUN_AT_ONCE
