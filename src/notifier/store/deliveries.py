"""The store's queries for the API's deliveries: list and read them (with their attempts), and
replay finished ones — one, or in bulk walking a cursor — through the outbox."""

from __future__ import annotations

import uuid
from datetime import datetime

from notifier.store.base import Q, Row, crossing, transaction
from notifier.store.errors import NotFound, NotReplayable
from notifier.store.pool import Queries
from notifier.store.rows import TERMINAL_STATUSES, Attempt, Delivery, ReplayPage


def _delivery(row: Row, attempts: list[Attempt] | None = None) -> Delivery:
    return Delivery(
        id=row["id"],
        event_id=row["event_id"],
        channel_id=row["channel_id"],
        channel_type=row["channel_type"],
        status=row["status"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        last_error=row["last_error"],
        next_attempt_at=row["next_attempt_at"],
        delivered_at=row["delivered_at"],
        created_at=row["created_at"],
        attempts=attempts,
    )


def not_replayable(
    status: str, channel_state: str, *, expunged: bool = False
) -> NotReplayable | None:
    """Why a delivery in ``status``, of a channel ``channel_state`` (enabled, disabled or
    deleted), of an event whose payload is ``expunged`` or not, cannot be replayed now; None
    when it can."""
    if status not in TERMINAL_STATUSES:
        return NotReplayable(
            f"the delivery is {status}: only a DELIVERED or DEAD delivery can be replayed"
        )
    if expunged:
        return NotReplayable("the event's payload was expunged: there is nothing to send")
    if channel_state != "enabled":
        return NotReplayable(
            f"the delivery's channel is {channel_state}"
            + ("; enable it first" if channel_state == "disabled" else "")
        )
    return None


class DeliveryQueries(Queries):
    """A tenant's deliveries, read and replayed."""

    @crossing
    async def list_deliveries(
        self,
        tenant_id: uuid.UUID,
        *,
        status: str | None,
        channel_id: uuid.UUID | None,
        event_id: uuid.UUID | None,
        before: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[Delivery]:
        at, last_id = before if before else (None, None)
        rows = await self._pool.fetch(
            Q["delivery_list"], tenant_id, status, channel_id, event_id, at, last_id, limit
        )
        return [_delivery(r) for r in rows]

    @crossing
    async def get_delivery(self, tenant_id: uuid.UUID, delivery_id: uuid.UUID) -> Delivery | None:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(Q["delivery_get"], tenant_id, delivery_id)
            if row is None:
                return None
            attempts = [
                Attempt(**dict(a)) for a in await conn.fetch(Q["delivery_attempts"], delivery_id)
            ]
            return _delivery(row, attempts)

    @transaction
    async def replay_delivery(self, tenant_id: uuid.UUID, delivery_id: uuid.UUID) -> None:
        """Enqueue one finished delivery again (``DEAD`` or ``DELIVERED`` → ``PENDING``, a
        ``replayed`` entry in its history, a fresh attempt budget; see ``replay`` in
        queries_deliveries.sql). Raises ``NotFound`` or ``NotReplayable`` having written nothing."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(Q["replay_check"], tenant_id, delivery_id)
            if row is None:
                raise NotFound("delivery not found")
            if refused := not_replayable(
                row["status"], row["channel_state"], expunged=row["expunged"]
            ):
                raise refused
            queued = await conn.fetch(
                Q["replay"], tenant_id, row["status"], delivery_id, None, None, None, None, 1,
                None, None,
            )  # fmt: skip
            if not queued:  # its channel disabled, or its event expunged, since replay_check
                raise NotReplayable("the delivery's channel or event changed meanwhile; try again")

    @transaction
    async def replay_deliveries(
        self,
        tenant_id: uuid.UUID,
        *,
        status: str,
        channel_id: uuid.UUID | None,
        event_type: str | None,
        created_after: datetime | None,
        created_before: datetime | None,
        after: tuple[datetime, uuid.UUID] | None = None,
        limit: int,
    ) -> ReplayPage:
        """Enqueue up to ``limit`` matching finished deliveries again (oldest first, only of
        enabled channels and of events whose payload was not expunged), walking them in
        ``(created_at, id)`` order from just after ``after``; return how many, and where the
        next call starts if more match there.

        The walk, not the status, says what is left: a replayed ``DELIVERED`` delivery is
        ``DELIVERED`` again soon, and a call from the start would replay it again."""
        filters = (channel_id, event_type, created_after, created_before)
        at, last_id = after if after else (None, None)
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                Q["replay"], tenant_id, status, None, *filters, limit, at, last_id
            )
            if rows:
                at, last_id = max((r["created_at"], r["id"]) for r in rows)
            more: bool = await conn.fetchval(
                Q["replay_more"], tenant_id, status, *filters, at, last_id
            )
        position = (at, last_id) if more and at is not None and last_id is not None else None
        return ReplayPage(queued=len(rows), more=more, next=position)
