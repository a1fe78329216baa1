"""The worker's view of Postgres: per-message calls, batched across worker tasks."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import trio

from notifier.batching import Batcher
from notifier.errors import StoreUnavailable
from notifier.store.rows import AttemptRecord, DeliveryState

RECORD_TIMEOUT_SECONDS = 10.0


def _stopped() -> StoreUnavailable:
    return StoreUnavailable("the worker group is stopping")


class BatchStore(Protocol):
    async def delivery_states(
        self, keys: Sequence[tuple[uuid.UUID, datetime | None]]
    ) -> list[DeliveryState | None]: ...

    async def record_attempts(
        self, recs: Sequence[AttemptRecord], *, disable_after_failing_seconds: float = 0.0
    ) -> list[bool]: ...


class BatchedDeliveries:
    """A ``DeliveryStore`` whose calls from concurrent worker tasks are sent together: one bridge
    crossing and one statement per batch instead of per message. Run ``run()`` alongside the
    worker tasks; an attempt batch that has started is always finished (shielded, bounded)."""

    def __init__(
        self, store: BatchStore, *, max_batch: int = 256, disable_after_failing_seconds: float = 0.0
    ) -> None:
        self._states = Batcher(store.delivery_states, max_batch=max_batch, closed=_stopped)
        self._records = Batcher(
            functools.partial(
                store.record_attempts, disable_after_failing_seconds=disable_after_failing_seconds
            ),
            max_batch=max_batch, shield_seconds=RECORD_TIMEOUT_SECONDS, closed=_stopped,
        )  # fmt: skip

    async def delivery_state(
        self, delivery_id: uuid.UUID, created_at: datetime | None = None
    ) -> DeliveryState | None:
        return await self._states((delivery_id, created_at))

    async def record_attempt(self, rec: AttemptRecord) -> bool:
        return await self._records(rec)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._states.run)
            nursery.start_soon(self._records.run)
