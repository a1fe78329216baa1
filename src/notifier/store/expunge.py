"""The store's queries that expunge payloads (data-protection requests): one event's
(``DELETE /v1/events/{id}/payload``) or every event of a tenant created before a time, a batch
per transaction (``notifier tenant expunge``). The SQL, and why it locks what it locks, is at the
end of queries_events.sql."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime

from notifier.store.base import Q, Row, crossing, transaction
from notifier.store.errors import DeliveriesInFlight, NotFound
from notifier.store.events import _event
from notifier.store.pool import Queries
from notifier.store.rows import TERMINAL_STATUSES, Event

EXPUNGE_BATCH = 500  # events a transaction of ``expunge_before`` takes at most


@dataclasses.dataclass(frozen=True)
class ExpungePage:
    """One batch of ``expunge_before``: events expunged, events left as they were for a
    delivery in flight, and where the next batch starts (None: nothing is left)."""

    expunged: int
    in_flight: int
    next: tuple[datetime, uuid.UUID] | None


@dataclasses.dataclass(frozen=True)
class ExpungeCounts:
    expunged: int
    skipped_in_flight: int
    batches: int


class ExpungeQueries(Queries):
    """Expunging events' payloads and their deliveries' response excerpts."""

    @transaction
    async def expunge_event(self, tenant_id: uuid.UUID, event_id: uuid.UUID) -> Event:
        """Expunge the payload of the event (JSON null, ``payload_expunged_at`` set once) and
        the response excerpts of its deliveries' attempts; the event as it is then. Again on an
        expunged event: nothing changes. Raises ``NotFound`` (no such event of the tenant) or
        ``DeliveriesInFlight`` (a delivery is PENDING or RETRYING) having written nothing."""
        async with self._pool.acquire() as conn, conn.transaction():
            if await conn.fetchrow(Q["expunge_lock_event"], tenant_id, event_id) is None:
                raise NotFound("event not found")
            rows = await conn.fetch(Q["expunge_lock_deliveries"], tenant_id, [event_id])
            if in_flight := sum(1 for r in rows if r["status"] not in TERMINAL_STATUSES):
                raise DeliveriesInFlight(in_flight)
            await conn.fetchval(Q["expunge_events"], tenant_id, [event_id])
            row: Row = await conn.fetchrow(Q["event_get"], tenant_id, event_id)
        return _event(row, row["idempotency_key"])

    @crossing
    async def tenant_id_by_name(self, name: str) -> uuid.UUID | None:
        """The id of the tenant ``name``, enabled or not."""
        tenant_id: uuid.UUID | None = await self._pool.fetchval(Q["expunge_tenant_id"], name)
        return tenant_id

    async def expunge_before(
        self, tenant_id: uuid.UUID, before: datetime, *, batch_size: int = EXPUNGE_BATCH
    ) -> ExpungeCounts:
        """Trio-flavoured. Expunge every event of the tenant created before ``before`` that
        has no delivery in flight, oldest first, ``batch_size`` events a transaction (a big
        tenant holds no long transaction, and what is done stays done if a batch fails)."""
        expunged = in_flight = batches = 0
        after: tuple[datetime, uuid.UUID] | None = None
        while True:
            page = await self._expunge_page(tenant_id, before, after, batch_size)
            batches += 1
            expunged += page.expunged
            in_flight += page.in_flight
            if page.next is None:
                return ExpungeCounts(expunged, in_flight, batches)
            after = page.next

    @transaction
    async def _expunge_page(
        self,
        tenant_id: uuid.UUID,
        before: datetime,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> ExpungePage:
        """One batch of ``expunge_before``: up to ``limit`` events after ``after``."""
        at, last_id = after if after else (None, None)
        async with self._pool.acquire() as conn, conn.transaction():
            picked = await conn.fetch(
                Q["expunge_lock_events_before"], tenant_id, before, at, last_id, limit
            )
            if not picked:
                return ExpungePage(0, 0, None)
            ids = [r["id"] for r in picked]
            rows = await conn.fetch(Q["expunge_lock_deliveries"], tenant_id, ids)
            busy = {r["event_id"] for r in rows if r["status"] not in TERMINAL_STATUSES}
            free = [i for i in ids if i not in busy]
            done: int = await conn.fetchval(Q["expunge_events"], tenant_id, free) if free else 0
        last = max((r["created_at"], r["id"]) for r in picked)
        return ExpungePage(done, len(busy), last if len(picked) == limit else None)
