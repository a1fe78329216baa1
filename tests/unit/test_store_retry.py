"""The store's retry of transactions Postgres rolled back for a conflict (a deadlock or a
serialization failure), with a fake transaction and trio's virtual clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from notifier.errors import StoreError, StoreUnavailable
from notifier.store.base import (
    CONFLICT_BACKOFF_SECONDS,
    CONFLICT_TRIES,
    StoreConflict,
    retry_conflicts,
)


class FakeTransaction:
    """Rolled back for a conflict ``conflicts`` times, then commits; counts its runs and when
    they started."""

    def __init__(self, conflicts: int, error: StoreError | None = None) -> None:
        self.conflicts = conflicts
        self.error = error
        self.started: list[float] = []

    async def __call__(self) -> str:
        self.started.append(trio.current_time())
        if self.error is not None:
            raise self.error
        if len(self.started) <= self.conflicts:
            raise StoreConflict("Postgres error: deadlock detected")
        return "committed"


def waits(tx: FakeTransaction) -> list[float]:
    return [b - a for a, b in zip(tx.started, tx.started[1:], strict=False)]


async def test_a_transaction_rolled_back_for_a_conflict_runs_again_after_a_short_wait(
    mock_clock: trio.testing.MockClock,
) -> None:
    tx = FakeTransaction(conflicts=CONFLICT_TRIES - 1)
    assert await retry_conflicts(tx) == "committed"
    assert len(tx.started) == CONFLICT_TRIES
    # jittered between half and one and a half times a wait that doubles each time
    for n, wait in enumerate(waits(tx)):
        nominal = CONFLICT_BACKOFF_SECONDS * 2**n
        assert 0.5 * nominal <= wait <= 1.5 * nominal, (n, wait)


async def test_a_transaction_that_keeps_conflicting_is_postgres_unavailable_for_now(
    mock_clock: trio.testing.MockClock,
) -> None:
    tx = FakeTransaction(conflicts=CONFLICT_TRIES)
    with pytest.raises(StoreUnavailable) as caught:
        await retry_conflicts(tx)
    assert type(caught.value) is StoreUnavailable  # the API answers it 503 with Retry-After
    assert "deadlock detected" in str(caught.value)
    assert len(tx.started) == CONFLICT_TRIES
    # bounded: a request waits well under a second in all
    assert tx.started[-1] - tx.started[0] <= 1.5 * CONFLICT_BACKOFF_SECONDS * 2**CONFLICT_TRIES


async def test_a_transaction_that_commits_at_once_does_not_wait(
    mock_clock: trio.testing.MockClock,
) -> None:
    tx = FakeTransaction(conflicts=0)
    assert await retry_conflicts(tx) == "committed"
    assert tx.started == [0.0]


@pytest.mark.parametrize(
    "error",
    [StoreError("Postgres error: duplicate key"), StoreUnavailable("Postgres unavailable")],
)
async def test_other_store_errors_are_not_retried(
    mock_clock: trio.testing.MockClock, error: StoreError
) -> None:
    tx = FakeTransaction(conflicts=0, error=error)
    with pytest.raises(StoreError) as caught:
        await retry_conflicts(tx, tries=5)
    assert caught.value is error
    assert len(tx.started) == 1
