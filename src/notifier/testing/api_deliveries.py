"""The deliveries' part of ``testing.api.MemoryApiStore``: their lists, the replay of finished
ones (one, or a page by a filter) and the console's reads (found by a filter, counted, by hour),
by the rules of the store's SQL.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta

import msgspec

from notifier.store.console import DeliveryFilter, FoundDelivery, HourlyCount
from notifier.store.deliveries import not_replayable
from notifier.store.errors import (
    NotFound,
)
from notifier.store.rows import (
    Attempt,
    Delivery,
    ReplayPage,
)
from notifier.testing import pattern_matches
from notifier.testing.api_state import MemoryApiState, StoredDelivery


class MemoryApiDeliveries(MemoryApiState):
    """Deliveries, their replay and the console's reads, in memory."""

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
        await self._call()
        found = sorted(
            (d for d in self._deliveries(tenant_id)
             if (status is None or d.status == status)
             and (channel_id is None or d.channel_id == channel_id)
             and (event_id is None or d.event_id == event_id)
             and (before is None or (d.created_at, d.id) < before)),
            key=lambda d: (d.created_at, d.id), reverse=True,
        )  # fmt: skip
        return found[:limit]

    async def get_delivery(self, tenant_id: uuid.UUID, delivery_id: uuid.UUID) -> Delivery | None:
        await self._call()
        stored = self.deliveries.get(delivery_id)
        if stored is None or stored.tenant_id != tenant_id:
            return None
        return msgspec.structs.replace(stored.delivery, attempts=list(stored.attempts))

    def _replay(self, stored: StoredDelivery) -> None:
        """Enqueue a finished delivery again with a fresh attempt budget: the rules of
        ``replay`` (queries_deliveries.sql) — a ``replayed`` entry numbered after every entry
        before it, the budget counted from it."""
        d = stored.delivery
        entry = max([d.attempt, *(a.attempt for a in stored.attempts)]) + 1
        last_replay = max(
            (a.attempt for a in stored.attempts if a.outcome == "replayed" and a.error is None),
            default=0,
        )
        stored.attempts.append(Attempt(
            attempt=entry, outcome="replayed", status_code=None, duration_ms=0, error=None,
            started_at=self._now(),
        ))  # fmt: skip
        stored.delivery = msgspec.structs.replace(
            d, status="PENDING", attempt=entry,
            max_attempts=entry + max(d.max_attempts - last_replay, 1), last_error=None,
            next_attempt_at=None, delivered_at=None,
        )  # fmt: skip
        self.enqueued.append(d.id)

    async def replay_delivery(self, tenant_id: uuid.UUID, delivery_id: uuid.UUID) -> None:
        await self._call()
        stored = self.deliveries.get(delivery_id)
        if stored is None or stored.tenant_id != tenant_id:
            raise NotFound("delivery not found")
        if refused := not_replayable(
            stored.delivery.status, self._channel_state(stored.delivery),
            expunged=self._expunged(stored.delivery),
        ):  # fmt: skip
            raise refused
        self._replay(stored)

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
        await self._call()

        def matches(s: StoredDelivery) -> bool:
            d = s.delivery
            return (
                s.tenant_id == tenant_id and d.status == status
                and self._channel_state(d) == "enabled" and not self._expunged(d)
                and (channel_id is None or d.channel_id == channel_id)
                and (event_type is None
                     or pattern_matches(event_type, self.events[d.event_id].event.type))
                and (created_after is None or d.created_at >= created_after)
                and (created_before is None or d.created_at < created_before)
            )  # fmt: skip

        walk = sorted(
            (s for s in self.deliveries.values() if matches(s)),
            key=lambda s: (s.delivery.created_at, s.delivery.id),
        )
        if after is not None:
            walk = [s for s in walk if (s.delivery.created_at, s.delivery.id) > after]
        taken, rest = walk[:limit], walk[limit:]
        for stored in taken:
            self._replay(stored)
        last = taken[-1].delivery if taken else None
        position = (last.created_at, last.id) if rest and last is not None else None
        return ReplayPage(queued=len(taken), more=bool(rest), next=position)

    # -- the console's reads ----------------------------------------------------------------------

    def _found(self, tenant_id: uuid.UUID, f: DeliveryFilter) -> list[FoundDelivery]:
        """``console_deliveries``'s rule, newest first."""
        found = [
            FoundDelivery(delivery=d, event_type=self.events[d.event_id].event.type)
            for d in self._deliveries(tenant_id)
            if (f.status is None or d.status == f.status)
            and (f.channel_id is None or d.channel_id == f.channel_id)
            and (f.event_type is None
                 or pattern_matches(f.event_type, self.events[d.event_id].event.type))
            and (f.created_after is None or d.created_at >= f.created_after)
            and (f.created_before is None or d.created_at < f.created_before)
        ]  # fmt: skip
        return sorted(found, key=lambda x: (x.delivery.created_at, x.delivery.id), reverse=True)

    async def find_deliveries(
        self,
        tenant_id: uuid.UUID,
        found_by: DeliveryFilter,
        *,
        before: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[FoundDelivery]:
        await self._call()
        found = [
            x for x in self._found(tenant_id, found_by)
            if before is None or (x.delivery.created_at, x.delivery.id) < before
        ]  # fmt: skip
        return found[:limit]

    async def count_deliveries(
        self, tenant_id: uuid.UUID, found_by: DeliveryFilter, *, replayable: bool = False
    ) -> int:
        await self._call()
        return sum(
            1 for x in self._found(tenant_id, found_by)
            if not replayable
            or (self._channel_state(x.delivery) == "enabled" and not self._expunged(x.delivery))
        )  # fmt: skip

    async def hourly_counts(self, tenant_id: uuid.UUID, now: datetime) -> list[HourlyCount]:
        await self._call()
        counts = Counter(
            (int((now - d.created_at) / timedelta(hours=1)), d.status)
            for d in self._deliveries(tenant_id)
            if now - timedelta(days=1) < d.created_at <= now
        )
        return [HourlyCount(h, status, n) for (h, status), n in counts.items()]
