"""``MemoryApiStore``: the HTTP API's store (``notifier.store.api.ApiStore``) in memory, so the
API runs, and is tested, without Postgres.

It keeps the rules the store's SQL keeps, as the API sees them: every call is a tenant's, an
idempotency key replays its event for the same body and conflicts for another, a batch is stored
whole or not at all, events fan out by ``notifier.testing.fanout_targets``, a change of a
channel changes only the fields it names, only finished deliveries of enabled channels are
replayed (none of an event whose payload was expunged), and a payload is expunged only when no
delivery of its event is in flight. What it enqueues for the workers is kept in ``enqueued``
(delivery ids, in order); nothing moves a delivery afterwards unless a test ``settle``\\ s it.
Set ``unavailable = True`` to make every call raise ``StoreUnavailable`` (Postgres down).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from notifier.store.api import ApiStore
from notifier.store.errors import (
    ConfigChanged,
    DeliveriesInFlight,
    IdempotencyConflict,
    NotFound,
    UnknownChannels,
)
from notifier.store.rows import (
    TERMINAL_STATUSES,
    Channel,
    ChannelChanges,
    Delivery,
    DeliverySummary,
    DestinationCircuit,
    Event,
    FifoLine,
    IngestResult,
    MetricsSnapshot,
    NewEvent,
)
from notifier.store.versions import SchemaState
from notifier.testing import fanout_targets
from notifier.testing.api_catalog import MemoryApiCatalog
from notifier.testing.api_deliveries import MemoryApiDeliveries
from notifier.testing.api_state import StoredDelivery, StoredEvent

DEFAULT_MAX_ATTEMPTS = 5  # when neither the channel nor its type says (as in insert_events)


class MemoryApiStore(MemoryApiCatalog, MemoryApiDeliveries, ApiStore):
    """An ``ApiStore`` in memory (see the module docstring); mypy checks it implements the
    interface it names. Its state is ``api_state.MemoryApiState``'s, its deliveries' part
    ``api_deliveries.MemoryApiDeliveries``, its event-type catalog ``api_catalog``."""

    # -- for tests --------------------------------------------------------------------------------

    async def create_tenant(self, name: str, api_key_hash: str) -> uuid.UUID:
        await self._call()
        self.tenants[api_key_hash] = tenant_id = uuid.uuid4()
        return tenant_id

    # -- health, metrics, tenants -----------------------------------------------------------------

    async def ping(self, timeout_seconds: float) -> None:
        await self._call()

    async def schema_state(self, timeout_seconds: float | None = None) -> SchemaState:
        """Always the schema this code knows, unless ``schema`` was set."""
        await self._call()
        return self.schema

    async def circuits_of(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], DestinationCircuit]:
        await self._call()
        return {k: self.circuits[k] for k in keys if k in self.circuits}

    async def fifo_lines(
        self, tenant_id: uuid.UUID, channel_ids: list[uuid.UUID]
    ) -> dict[uuid.UUID, FifoLine]:
        """The unfinished deliveries of the tenant's FIFO channels among ``channel_ids``."""
        await self._call()
        now = self._now()
        found: dict[uuid.UUID, FifoLine] = {}
        for c in channel_ids:
            channel = self._channel(tenant_id, c)
            if channel is None or channel.ordering != "fifo":
                continue
            open_ = [
                s.delivery for s in self.deliveries.values()
                if s.tenant_id == tenant_id and s.delivery.channel_id == c
                and s.delivery.status in ("PENDING", "RETRYING")
            ]  # fmt: skip
            if open_:
                found[c] = FifoLine(
                    backlog=len(open_),
                    lag_seconds=(now - min(d.created_at for d in open_)).total_seconds(),
                    retrying=any(d.status == "RETRYING" for d in open_),
                )
        return found

    async def metrics_snapshot(self, retention_days: int = 0) -> MetricsSnapshot:
        await self._call()
        statuses = Counter(s.delivery.status for s in self.deliveries.values())
        return MetricsSnapshot(
            outbox_depth=len(self.enqueued), pending=statuses["PENDING"],
            retrying=statuses["RETRYING"], oldest_open_age_seconds=None,
        )  # fmt: skip

    async def tenant_by_key_hash(self, api_key_hash: str) -> uuid.UUID | None:
        await self._call()
        return self.tenants.get(api_key_hash)

    async def admit(self, key: str, count: int, *, capacity: int, rate: float) -> float:
        await self._call()
        return await self.buckets.admit(key, count, capacity=capacity, rate=rate)

    # -- channels ---------------------------------------------------------------------------------

    async def create_channel(
        self,
        tenant_id: uuid.UUID,
        *,
        type: str,
        name: str,
        config: dict[str, Any],
        recipient: str | None,
        event_types: list[str],
        enabled: bool,
        max_attempts: int | None,
        rate_limit_per_second: float | None = None,
        filter: dict[str, Any] | None = None,
        customer: str | None = None,
        ordering: str = "none",
    ) -> Channel:
        await self._call()
        now = self._now()
        channel = Channel(
            id=uuid.uuid4(), tenant_id=tenant_id, type=type, name=name, config=dict(config),
            recipient=recipient, event_types=list(event_types), enabled=enabled,
            max_attempts=max_attempts, rate_limit_per_second=rate_limit_per_second,
            filter=filter, customer=customer, ordering=ordering, created_at=now,
            updated_at=now,
        )  # fmt: skip
        self.channels[channel.id] = channel
        return channel

    async def get_channel(self, tenant_id: uuid.UUID, channel_id: uuid.UUID) -> Channel | None:
        await self._call()
        return self._channel(tenant_id, channel_id)

    async def list_channels(
        self,
        tenant_id: uuid.UUID,
        *,
        type: str | None,
        recipient: str | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        customer: str | None = None,
    ) -> list[Channel]:
        await self._call()
        found = sorted(
            (c for c in self.channels.values() if c.tenant_id == tenant_id
             and (type is None or c.type == type)
             and (recipient is None or c.recipient == recipient)
             and (customer is None or c.customer == customer)
             and (after is None or (c.created_at, c.id) > after)),
            key=lambda c: (c.created_at, c.id),
        )  # fmt: skip
        return found[:limit]

    async def update_channel(
        self,
        tenant_id: uuid.UUID,
        channel_id: uuid.UUID,
        changes: ChannelChanges,
        *,
        config_read: dict[str, Any] | None = None,
    ) -> Channel | None:
        await self._call()
        named = changes.named()
        if "config" in named and config_read is None:
            raise ValueError("a new config needs the config it was made from")
        channel = self._channel(tenant_id, channel_id)
        if channel is None:
            return None
        if "config" in named and channel.config != config_read:
            raise ConfigChanged("the channel's config changed while the new one was made")
        now = self._now()
        update: dict[str, Any] = {f: getattr(changes, f) for f in named}
        if "enabled" in named:
            if changes.enabled:
                update |= {"disabled_reason": None, "disabled_at": None}
                if not channel.enabled:  # enabling a disabled channel starts its health afresh
                    update |= {"consecutive_failures": 0, "failing_since": None}
            elif channel.enabled:
                update |= {"disabled_reason": "disabled through the API", "disabled_at": now}
        self.channels[channel_id] = msgspec.structs.replace(channel, updated_at=now, **update)
        return self.channels[channel_id]

    async def delete_channel(self, tenant_id: uuid.UUID, channel_id: uuid.UUID) -> bool:
        await self._call()
        if self._channel(tenant_id, channel_id) is None:
            return False
        del self.channels[channel_id]
        return True

    # -- events -----------------------------------------------------------------------------------

    async def ingest(
        self,
        tenant_id: uuid.UUID,
        events: Sequence[NewEvent],
        max_attempts: Mapping[str, int],
    ) -> list[IngestResult]:
        """The whole batch, or nothing: an unknown channel or a key conflict writes nothing."""
        await self._call()
        named = {cid for e in events for cid in e.channel_ids or ()}
        if missing := sorted(c for c in named if self._channel(tenant_id, c) is None):
            raise UnknownChannels(missing)
        keys = {  # idempotency key -> (request hash, event id)
            s.event.idempotency_key: (s.request_hash, s.event.id) for s in self.events.values()
            if s.tenant_id == tenant_id and s.event.idempotency_key is not None
        }  # fmt: skip
        for e in events:  # every conflict first: a conflict writes nothing
            key = e.idempotency_key
            if (
                key is not None
                and keys.setdefault(key, (e.request_hash, e.id))[0] != e.request_hash
            ):
                raise IdempotencyConflict(key)  # fmt: skip
        results = []
        for e in events:
            _, first = keys.get(e.idempotency_key or "", (None, e.id))
            if first == e.id:
                results.append(IngestResult(event=self._store_event(tenant_id, e, max_attempts),
                                            created=True))  # fmt: skip
            else:  # stored before, or earlier in this batch
                results.append(IngestResult(event=self._current(self.events[first]),
                                            created=False))  # fmt: skip
        return results

    async def ingest_each(
        self,
        events: Sequence[tuple[uuid.UUID, NewEvent]],
        max_attempts: Mapping[str, int],
    ) -> list[IngestResult | IdempotencyConflict | UnknownChannels]:
        """Each ``(tenant id, event)`` on its own: its result, or the error that kept it out."""
        outcomes: list[IngestResult | IdempotencyConflict | UnknownChannels] = []
        for tenant_id, e in events:
            try:
                (result,) = await self.ingest(tenant_id, [e], max_attempts)
            except (IdempotencyConflict, UnknownChannels) as exc:
                outcomes.append(exc)
            else:
                outcomes.append(result)
        return outcomes

    def _store_event(
        self, tenant_id: uuid.UUID, e: NewEvent, max_attempts: Mapping[str, int]
    ) -> Event:
        now = self._now()
        targets = fanout_targets(
            self.channels.values(), tenant_id=tenant_id, event_type=e.type,
            recipient=e.recipient, channel_ids=e.channel_ids,
            payload=msgspec.json.decode(e.payload),
        )  # fmt: skip
        summaries = []
        for c in sorted(targets, key=lambda c: c.id):
            delivery = Delivery(
                id=uuid.uuid4(), event_id=e.id, channel_id=c.id, channel_type=c.type,
                status="PENDING", attempt=0,
                max_attempts=c.max_attempts or max_attempts.get(c.type, DEFAULT_MAX_ATTEMPTS),
                last_error=None, next_attempt_at=None, delivered_at=None, created_at=now,
            )  # fmt: skip
            self.deliveries[delivery.id] = StoredDelivery(tenant_id, delivery)
            self.enqueued.append(delivery.id)
            summaries.append(DeliverySummary(
                id=delivery.id, channel_id=c.id, channel_type=c.type, status="PENDING"
            ))  # fmt: skip
        event = Event(
            id=e.id, type=e.type, recipient=e.recipient, payload=msgspec.json.decode(e.payload),
            idempotency_key=e.idempotency_key, created_at=now, deliveries=summaries,
        )  # fmt: skip
        self.events[e.id] = StoredEvent(tenant_id, event, e.request_hash, e.traceparent)
        return event

    def _current(self, stored: StoredEvent) -> Event:
        """The event with its deliveries as they are now (``event_get``)."""
        summaries = [
            DeliverySummary(id=d.id, channel_id=d.channel_id, channel_type=d.channel_type,
                            status=d.status)
            for d in sorted(self._deliveries(stored.tenant_id), key=lambda d: d.channel_id)
            if d.event_id == stored.event.id
        ]  # fmt: skip
        return msgspec.structs.replace(stored.event, deliveries=summaries)

    async def get_event(self, tenant_id: uuid.UUID, event_id: uuid.UUID) -> Event | None:
        await self._call()
        stored = self.events.get(event_id)
        if stored is None or stored.tenant_id != tenant_id:
            return None
        return self._current(stored)

    async def expunge_event(self, tenant_id: uuid.UUID, event_id: uuid.UUID) -> Event:
        """The rules of ``expunge_event`` (store/expunge.py): refused while a delivery is in
        flight; the payload None and the time set once; the attempts' excerpts cleared."""
        await self._call()
        stored = self.events.get(event_id)
        if stored is None or stored.tenant_id != tenant_id:
            raise NotFound("event not found")
        mine = [s for s in self.deliveries.values() if s.delivery.event_id == event_id]
        if in_flight := sum(1 for s in mine if s.delivery.status not in TERMINAL_STATUSES):
            raise DeliveriesInFlight(in_flight)
        if stored.event.payload_expunged_at is None:
            stored.event = msgspec.structs.replace(
                stored.event, payload=None, payload_expunged_at=self._now()
            )
        for s in mine:
            s.attempts = [msgspec.structs.replace(a, response_excerpt=None) for a in s.attempts]
        return self._current(stored)
