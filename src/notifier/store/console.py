"""The store's queries for the console's pages (``notifier.console``): deliveries found with
their event's type by filters the API's list does not have, counted, and summed per hour."""

from __future__ import annotations

import uuid
from datetime import datetime

import msgspec

from notifier.store.base import Q, crossing
from notifier.store.deliveries import _delivery
from notifier.store.pool import Queries
from notifier.store.rows import Delivery


class DeliveryFilter(msgspec.Struct, frozen=True, kw_only=True):
    """What the console's deliveries are found by; None matches everything."""

    status: str | None = None
    channel_id: uuid.UUID | None = None
    event_type: str | None = None  # a pattern: exact, 'prefix.*' or '*'
    created_after: datetime | None = None  # at or after
    created_before: datetime | None = None


class FoundDelivery(msgspec.Struct, frozen=True, kw_only=True):
    delivery: Delivery
    event_type: str


class HourlyCount(msgspec.Struct, frozen=True):
    hours_ago: int  # 0: created in the last 60 minutes
    status: str
    count: int


def _filters(f: DeliveryFilter) -> tuple[object, ...]:
    return (f.status, f.channel_id, f.event_type, f.created_after, f.created_before)


class ConsoleQueries(Queries):
    """A tenant's deliveries as the console reads them."""

    @crossing
    async def find_deliveries(
        self,
        tenant_id: uuid.UUID,
        found_by: DeliveryFilter,
        *,
        before: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[FoundDelivery]:
        """Newest first, from just before ``before``."""
        at, last_id = before if before else (None, None)
        rows = await self._pool.fetch(
            Q["console_deliveries"], tenant_id, *_filters(found_by), at, last_id, limit
        )
        return [FoundDelivery(delivery=_delivery(r), event_type=r["event_type"]) for r in rows]

    @crossing
    async def count_deliveries(
        self, tenant_id: uuid.UUID, found_by: DeliveryFilter, *, replayable: bool = False
    ) -> int:
        """How many match; with ``replayable``, only those of enabled channels."""
        count: int = await self._pool.fetchval(
            Q["console_count"], tenant_id, *_filters(found_by), replayable
        )
        return count

    @crossing
    async def hourly_counts(self, tenant_id: uuid.UUID, now: datetime) -> list[HourlyCount]:
        """The deliveries created in the day up to ``now``, per status and hours before it."""
        rows = await self._pool.fetch(Q["console_hourly"], tenant_id, now)
        return [HourlyCount(r["hours_ago"], r["status"], r["count"]) for r in rows]
