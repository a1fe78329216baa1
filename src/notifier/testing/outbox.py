"""An in-memory outbox with the relay's claim/finish/doorbell interface: a doorbell that can
be lost, and LISTENs that fail on cue."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import trio

from notifier.errors import StoreUnavailable
from notifier.hint import Doorbell
from notifier.store.rows import (
    OutboxRow,
)

# -- in-memory outbox ---------------------------------------------------------------------------


class MemoryDoorbell(Doorbell):
    """The store's doorbell, rung and lost by ``MemoryOutbox`` instead of a LISTEN connection."""


class MemoryClaim:
    def __init__(self, outbox: MemoryOutbox, rows: list[OutboxRow]) -> None:
        self._outbox = outbox
        self.rows = rows
        self._sent: list[int] = []
        self._refused: dict[int, str] = {}

    async def finish(self, sent: Sequence[int], refused: dict[int, str]) -> None:
        await trio.lowlevel.checkpoint()
        self._sent, self._refused = list(sent), dict(refused)


class MemoryOutbox:
    """The outbox with its locking semantics: claimed rows are invisible to other claims until
    the claim ends; deletes and refusals take effect only if the claim ends without error."""

    def __init__(self) -> None:
        self.rows: dict[int, OutboxRow] = {}
        self.refused: dict[int, str] = {}  # row id -> last error
        self._locked: set[int] = set()
        self._next_id = 1
        self.bell = MemoryDoorbell()
        # LISTEN: when each open_doorbell was asked for (trio time), and how many of the next
        # ones fail as if Postgres were unreachable.
        self.listened_at: list[float] = []
        self.listen_failures = 0

    def add(
        self,
        delivery_id: uuid.UUID,
        routing_key: str,
        body: bytes,
        *,
        created_at: datetime | None = None,
        traceparent: str | None = None,
    ) -> int:
        """Insert a row (written now, unless ``created_at`` says otherwise) and ring."""
        row_id = self._next_id
        self._next_id += 1
        written = created_at or datetime.now(UTC)
        self.rows[row_id] = OutboxRow(row_id, delivery_id, routing_key, body, written, traceparent)
        if self.bell.connected:  # nobody hears the NOTIFY while the LISTEN connection is lost
            self.bell.ring()
        return row_id

    def lose_doorbell(self) -> None:
        """The LISTEN connection is lost (a terminated backend): the doorbell in use says so."""
        self.bell.lost()

    @asynccontextmanager
    async def claim_outbox(self, limit: int) -> AsyncIterator[MemoryClaim]:
        await trio.lowlevel.checkpoint()
        free = [r for i, r in sorted(self.rows.items()) if i not in self._locked]
        fresh = [r for r in free if r.id not in self.refused]
        again = [r for r in free if r.id in self.refused]  # no waiting in memory: due at once
        free = (fresh + again)[:limit]
        claim = MemoryClaim(self, free)
        self._locked.update(r.id for r in free)
        try:
            yield claim
            for row_id in claim._sent:
                self.rows.pop(row_id, None)
                self.refused.pop(row_id, None)
            self.refused.update(claim._refused)
        finally:
            self._locked.difference_update(r.id for r in free)

    @asynccontextmanager
    async def open_doorbell(self) -> AsyncIterator[MemoryDoorbell]:
        """LISTEN; a new doorbell once the previous one was lost."""
        await trio.lowlevel.checkpoint()
        self.listened_at.append(trio.current_time())
        if self.listen_failures > 0:
            self.listen_failures -= 1
            raise StoreUnavailable("memory outbox: LISTEN failed")
        if not self.bell.connected:
            self.bell = MemoryDoorbell()
        yield self.bell
