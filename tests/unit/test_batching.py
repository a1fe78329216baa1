"""Batcher: concurrent single-item calls become batches; results and errors reach each caller."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from notifier.batching import Batcher


class Recorder:
    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay
        self.fail = fail

    async def __call__(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        await trio.sleep(self.delay)
        if self.fail:
            raise ValueError("batch failed")
        return [i * 10 for i in items]


async def test_concurrent_calls_share_one_batch_and_get_their_own_results() -> None:
    run = Recorder()
    batcher: Batcher[int, int] = Batcher(run)
    results: dict[int, int] = {}

    async def call(i: int) -> None:
        results[i] = await batcher(i)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batcher.run)
        async with trio.open_nursery() as callers:
            for i in range(5):
                callers.start_soon(call, i)
        nursery.cancel_scope.cancel()
    assert results == {i: i * 10 for i in range(5)}
    assert [sorted(b) for b in run.batches] == [[0, 1, 2, 3, 4]]


async def test_calls_arriving_during_a_batch_form_the_next_one(
    autojump_clock: trio.abc.Clock,
) -> None:
    run = Recorder(delay=1.0)
    batcher: Batcher[int, int] = Batcher(run)

    async def call_at(t: float, i: int) -> None:
        await trio.sleep(t)
        assert await batcher(i) == i * 10

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batcher.run)
        async with trio.open_nursery() as callers:
            callers.start_soon(call_at, 0, 1)
            callers.start_soon(call_at, 0.5, 2)  # while batch [1] is running
            callers.start_soon(call_at, 0.6, 3)
        nursery.cancel_scope.cancel()
    assert [sorted(b) for b in run.batches] == [[1], [2, 3]]


async def test_max_batch_splits_large_piles() -> None:
    run = Recorder()
    batcher: Batcher[int, int] = Batcher(run, max_batch=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batcher.run)
        async with trio.open_nursery() as callers:
            for i in range(5):
                callers.start_soon(batcher, i)
        nursery.cancel_scope.cancel()
    assert [len(b) for b in run.batches] == [2, 2, 1]
    assert sorted(i for b in run.batches for i in b) == [0, 1, 2, 3, 4]


async def test_a_failing_batch_raises_in_every_caller_and_the_flusher_goes_on() -> None:
    run = Recorder(fail=True)
    batcher: Batcher[int, int] = Batcher(run)
    errors: list[BaseException] = []

    async def call(i: int) -> None:
        try:
            await batcher(i)
        except ValueError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batcher.run)
        async with trio.open_nursery() as callers:
            callers.start_soon(call, 1)
            callers.start_soon(call, 2)
        assert len(errors) == 2
        run.fail = False
        assert await batcher(3) == 30
        nursery.cancel_scope.cancel()


async def test_a_shielded_batch_finishes_although_the_flusher_is_cancelled(
    autojump_clock: trio.abc.Clock,
) -> None:
    run = Recorder(delay=2.0)
    batcher: Batcher[int, int] = Batcher(run, shield_seconds=5.0)
    got: list[int] = []

    async def call() -> None:
        with trio.CancelScope(shield=True):
            got.append(await batcher(7))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batcher.run)
        nursery.start_soon(call)
        await trio.sleep(1.0)  # the batch is running now
        nursery.cancel_scope.cancel()
    assert got == [70]
    assert trio.current_time() == pytest.approx(2.0)


class Closed(Exception):
    pass


async def test_callers_waiting_when_the_flusher_stops_get_the_closed_error_at_once() -> None:
    run = Recorder(delay=100)  # the first batch never finishes before the flusher is cancelled
    batcher: Batcher[int, int] = Batcher(run, closed=lambda: Closed("stopping"))
    errors: list[BaseException] = []

    async def call(i: int) -> None:
        try:
            await batcher(i)
        except Closed as exc:
            errors.append(exc)

    with trio.fail_after(1):  # real time: nothing may wait for the 100 s batch
        async with trio.open_nursery() as callers, trio.open_nursery() as flusher:
            flusher.start_soon(batcher.run)
            callers.start_soon(call, 1)
            await trio.testing.wait_all_tasks_blocked()
            callers.start_soon(call, 2)  # waits behind the stuck batch
            await trio.testing.wait_all_tasks_blocked()
            flusher.cancel_scope.cancel()
    assert len(errors) == 2
    with pytest.raises(Closed):
        await batcher(3)  # and a caller arriving later is not left waiting either
    assert run.batches == [[1]]
