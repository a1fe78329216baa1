"""The bridge's loop runs every ready asyncio callback per pass, as asyncio does, rather than one
per trio checkpoint (``bridge.run_ready_in_batches``)."""

from __future__ import annotations

import trio
import trio_asyncio

from notifier.bridge import READY_BATCH_LIMIT, TIMER_PURGE_MIN, open_bridge

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
