"""GroupCommit: concurrent single-item calls become batches run by the callers themselves; each
caller gets its own result, a failure reaches only the callers of its batch, and cancelled
callers neither lose a batch nor stall the ones after it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from notifier.ingest.groupcommit import GroupCommit


class Gated:
    """``run_batch``: records each batch and holds the first one until ``release``; answers
    ``item * 10``, or raises for a batch holding ``fail_on``."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.release = trio.Event()
        self.fail_on = fail_on

    async def __call__(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        if len(self.batches) == 1:
            await self.release.wait()
        if self.fail_on in items:
            raise ValueError("batch failed")
        return [i * 10 for i in items]


async def call_into(commit: GroupCommit[int, int], i: int, got: dict[int, object]) -> None:
    try:
        got[i] = await commit(i)
    except ValueError as exc:
        got[i] = exc


async def test_calls_arriving_during_a_batch_form_the_next_one_and_get_their_own_results() -> None:
    run = Gated()
    commit: GroupCommit[int, int] = GroupCommit(run)
    got: dict[int, object] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call_into, commit, 0, got)
        await trio.testing.wait_all_tasks_blocked()  # 0 leads a batch of its own at once
        for i in range(1, 6):  # one after the other: each waits before the next comes
            nursery.start_soon(call_into, commit, i, got)
            await trio.testing.wait_all_tasks_blocked()
        run.release.set()
    assert run.batches == [[0], [1, 2, 3, 4, 5]]  # in the order the callers came
    assert got == {i: i * 10 for i in range(6)}


async def test_a_lone_call_is_run_at_once() -> None:
    run = Gated()
    run.release.set()
    commit: GroupCommit[int, int] = GroupCommit(run)
    with trio.fail_after(5):
        assert await commit(7) == 70
    assert run.batches == [[7]]


async def test_batches_hold_at_most_max_batch_items() -> None:
    run = Gated()
    commit: GroupCommit[int, int] = GroupCommit(run, max_batch=2)
    got: dict[int, object] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call_into, commit, 0, got)
        await trio.testing.wait_all_tasks_blocked()
        for i in range(1, 6):  # one after the other: each waits before the next comes
            nursery.start_soon(call_into, commit, i, got)
            await trio.testing.wait_all_tasks_blocked()
        run.release.set()
    assert run.batches == [[0], [1, 2], [3, 4], [5]]
    assert got == {i: i * 10 for i in range(6)}


async def test_a_failing_batch_fails_its_own_callers_only() -> None:
    run = Gated(fail_on=2)
    commit: GroupCommit[int, int] = GroupCommit(run, max_batch=2)
    got: dict[int, object] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call_into, commit, 0, got)
        await trio.testing.wait_all_tasks_blocked()
        for i in range(1, 5):
            nursery.start_soon(call_into, commit, i, got)
            await trio.testing.wait_all_tasks_blocked()
        run.release.set()
    assert run.batches == [[0], [1, 2], [3, 4]]
    assert got[0] == 0
    assert got[3] == 30
    assert got[4] == 40
    assert isinstance(got[1], ValueError)
    assert isinstance(got[2], ValueError)


async def test_a_caller_cancelled_while_waiting_is_left_out_of_the_batch() -> None:
    run = Gated()
    commit: GroupCommit[int, int] = GroupCommit(run)
    got: dict[int, object] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call_into, commit, 0, got)
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as gone:
            gone.cancel()
            async with trio.open_nursery() as inner:
                inner.start_soon(call_into, commit, 1, got)
        nursery.start_soon(call_into, commit, 2, got)
        await trio.testing.wait_all_tasks_blocked()
        run.release.set()
    assert run.batches == [[0], [2]]
    assert got == {0: 0, 2: 20}


async def test_a_leader_cancelled_mid_batch_finishes_it_for_the_others() -> None:
    run = Gated()
    commit: GroupCommit[int, int] = GroupCommit(run)
    got: dict[int, object] = {}
    leading = trio.CancelScope()

    async def leader() -> None:
        with leading:
            await call_into(commit, 0, got)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(leader)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call_into, commit, 1, got)
        await trio.testing.wait_all_tasks_blocked()
        leading.cancel()  # the leader's request is gone, its batch is not
        await trio.testing.wait_all_tasks_blocked()
        assert run.batches == [[0]]
        run.release.set()
    assert run.batches == [[0], [1]]
    assert got == {0: 0, 1: 10}


@pytest.mark.parametrize("round", range(20))
async def test_a_caller_cancelled_as_it_is_told_to_lead_hands_the_lead_on(round: int) -> None:
    """Cancelled at the moment the batch before it ends, a waiting caller either leaves the
    queue or passes on the lead it was given: the caller after it is answered either way (the
    order in which trio runs the two varies; twenty rounds see both)."""
    run = Gated()
    commit: GroupCommit[int, int] = GroupCommit(run, max_batch=1)
    got: dict[int, object] = {}
    waiting = trio.CancelScope()

    async def waiter() -> None:
        with waiting:
            await call_into(commit, 1, got)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call_into, commit, 0, got)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(call_into, commit, 2, got)
            await trio.testing.wait_all_tasks_blocked()
            waiting.cancel()
            run.release.set()
    assert got == {0: 0, 2: 20}
    assert run.batches == [[0], [2]]


async def test_callers_queued_behind_a_slow_batch_run_their_own_after_the_patience(
    mock_clock: trio.testing.MockClock,
) -> None:
    run = Gated()  # the first batch is held until released: a stalled Postgres
    commit: GroupCommit[int, int] = GroupCommit(run, patience_seconds=0.1)
    got: dict[int, object] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call_into, commit, 0, got)
        await trio.testing.wait_all_tasks_blocked()
        for i in (1, 2):
            nursery.start_soon(call_into, commit, i, got)
            await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(1):
            while len(got) < 2:  # noqa: ASYNC110 - waits on the virtual clock
                await trio.sleep(0.01)
        assert trio.current_time() < 0.2
        assert got == {1: 10, 2: 20}  # run beside the held batch, not after it
        run.release.set()
    # 1 and 2 ran out of patience at the same moment: either leads the other's batch.
    assert [sorted(b) for b in run.batches] == [[0], [1, 2]]
    assert got == {0: 0, 1: 10, 2: 20}


async def test_without_patience_callers_wait_for_the_batch_running(
    mock_clock: trio.testing.MockClock,
) -> None:
    run = Gated()
    commit: GroupCommit[int, int] = GroupCommit(run)
    got: dict[int, object] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call_into, commit, 0, got)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call_into, commit, 1, got)
        await trio.sleep(10)
        assert got == {}
        run.release.set()
    assert run.batches == [[0], [1]]


async def test_a_batch_that_answers_the_wrong_number_of_results_fails_its_callers() -> None:
    async def short(items: Sequence[int]) -> list[int]:
        await trio.lowlevel.checkpoint()
        return list(items)[1:]

    commit: GroupCommit[int, int] = GroupCommit(short)
    with pytest.raises(RuntimeError, match="wrong number of results"):
        await commit(1)
