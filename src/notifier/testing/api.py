"""``MemoryApiStore``: the HTTP API's store (``notifier.store.api.ApiStore``) in memory, so the
API runs, and is tested, without Postgres.

It keeps the rules the store's SQL keeps, as the API sees them: every call is a tenant's, an
idempotency key replays its event for the same body and conflicts for another, a batch is stored
whole or not at all, events fan out by ``notifier.testing.fanout_targets``, a change of a
channel changes only the fields it names, and only finished deliveries of enabled channels are
replayed. What it enqueues for the workers is kept in ``enqueued`` (delivery ids, in order);
nothing moves a delivery afterwards unless a test ``settle``\\ s it. Set ``unavailable = True``
to make every call raise ``StoreUnavailable`` (Postgres down).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import trio

from notifier.errors import StoreUnavailable
from notifier.store.api import ApiStore
from notifier.store.console import DeliveryFilter, FoundDelivery, HourlyCount
from notifier.store.deliveries import not_replayable
from notifier.store.errors import (
    ConfigChanged,
    IdempotencyConflict,
    NotFound,
    UnknownChannels,
)
from notifier.store.rows import (
    Attempt,
    Channel,
    ChannelChanges,
    Delivery,
    DeliverySummary,
    DestinationCircuit,
    Event,
    IngestResult,
    MetricsSnapshot,
    NewEvent,
    ReplayPage,
)
from notifier.store.versions import LATEST, SchemaState
from notifier.testing import fanout_targets, pattern_matches
from notifier.testing.buckets import MemoryBuckets

DEFAULT_MAX_ATTEMPTS = 5  # when neither the channel nor its type says (as in insert_events)


@dataclass
class _StoredEvent:
    tenant_id: uuid.UUID
    event: Event  # its deliveries as they were created
    request_hash: str


@dataclass
class _StoredDelivery:
    tenant_id: uuid.UUID
    delivery: Delivery
    attempts: list[Attempt] = field(default_factory=list)


class MemoryApiStore(ApiStore):
    """An ``ApiStore`` in memory (see the module docstring); mypy checks it implements the
    interface it names."""

    def __init__(self) -> None:
        self.tenants: dict[str, uuid.UUID] = {}  # API key hash -> tenant id
        self.schema = SchemaState(frozenset(range(1, LATEST + 1)))  # what schema_state answers
        self.channels: dict[uuid.UUID, Channel] = {}
        self.events: dict[uuid.UUID, _StoredEvent] = {}
        self.deliveries: dict[uuid.UUID, _StoredDelivery] = {}
        self.enqueued: list[uuid.UUID] = []  # delivery ids handed to the outbox, in order
        self.unavailable = False
        self.buckets = MemoryBuckets()  # the ingest rate limit's
        # destinations' circuits by (channel type, destination); a test sets them
        self.circuits: dict[tuple[str, str], DestinationCircuit] = {}
        self._last_time = datetime.now(UTC)

    # -- for tests ----------------------------------------------------------------------------

    async def create_tenant(self, name: str, api_key_hash: str) -> uuid.UUID:
        await self._call()
        self.tenants[api_key_hash] = tenant_id = uuid.uuid4()
        return tenant_id

    def settle(
        self,
        delivery_id: uuid.UUID,
        status: str,
        *,
        attempt: int = 1,
        error: str | None = None,
        response_excerpt: str | None = None,
    ) -> None:
        """What a worker would write: the delivery ``status`` after ``attempt`` (with the
        receiver's ``response_excerpt``)."""
        stored = self.deliveries[delivery_id]
        now = self._now()
        stored.delivery = msgspec.structs.replace(
            stored.delivery, status=status, attempt=attempt, last_error=error,
            delivered_at=now if status == "DELIVERED" else None,
        )  # fmt: skip
        outcome = {"DELIVERED": "delivered", "DEAD": "dead"}.get(status, "retry")
        stored.attempts.append(Attempt(
            attempt=attempt, outcome=outcome, status_code=None, duration_ms=1, error=error,
            response_excerpt=response_excerpt, started_at=now,
        ))  # fmt: skip

    def _now(self) -> datetime:
        """Now, and always later than the last time given: rows are ordered by creation."""
        self._last_time = max(datetime.now(UTC), self._last_time + timedelta(microseconds=1))
        return self._last_time

    async def _call(self) -> None:
        await trio.lowlevel.checkpoint()
        if self.unavailable:
            raise StoreUnavailable("memory store is unavailable")

    # -- health, metrics, tenants -------------------------------------------------------------

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

    async def metrics_snapshot(self) -> MetricsSnapshot:
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

    # -- channels -----------------------------------------------------------------------------

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
    ) -> Channel:
        await self._call()
        now = self._now()
        channel = Channel(
            id=uuid.uuid4(), tenant_id=tenant_id, type=type, name=name, config=dict(config),
            recipient=recipient, event_types=list(event_types), enabled=enabled,
            max_attempts=max_attempts, rate_limit_per_second=rate_limit_per_second,
            created_at=now, updated_at=now,
        )  # fmt: skip
        self.channels[channel.id] = channel
        return channel

    def _channel(self, tenant_id: uuid.UUID, channel_id: uuid.UUID) -> Channel | None:
        channel = self.channels.get(channel_id)
        return channel if channel is not None and channel.tenant_id == tenant_id else None

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
    ) -> list[Channel]:
        await self._call()
        found = sorted(
            (c for c in self.channels.values() if c.tenant_id == tenant_id
             and (type is None or c.type == type)
             and (recipient is None or c.recipient == recipient)
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

    # -- events -------------------------------------------------------------------------------

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
        )  # fmt: skip
        summaries = []
        for c in sorted(targets, key=lambda c: c.id):
            delivery = Delivery(
                id=uuid.uuid4(), event_id=e.id, channel_id=c.id, channel_type=c.type,
                status="PENDING", attempt=0,
                max_attempts=c.max_attempts or max_attempts.get(c.type, DEFAULT_MAX_ATTEMPTS),
                last_error=None, next_attempt_at=None, delivered_at=None, created_at=now,
            )  # fmt: skip
            self.deliveries[delivery.id] = _StoredDelivery(tenant_id, delivery)
            self.enqueued.append(delivery.id)
            summaries.append(DeliverySummary(
                id=delivery.id, channel_id=c.id, channel_type=c.type, status="PENDING"
            ))  # fmt: skip
        event = Event(
            id=e.id, type=e.type, recipient=e.recipient, payload=msgspec.json.decode(e.payload),
            idempotency_key=e.idempotency_key, created_at=now, deliveries=summaries,
        )  # fmt: skip
        self.events[e.id] = _StoredEvent(tenant_id, event, e.request_hash)
        return event

    def _current(self, stored: _StoredEvent) -> Event:
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

    # -- deliveries ---------------------------------------------------------------------------

    def _deliveries(self, tenant_id: uuid.UUID) -> list[Delivery]:
        return [s.delivery for s in self.deliveries.values() if s.tenant_id == tenant_id]

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

    def _channel_state(self, delivery: Delivery) -> str:
        """The rule of the SQL function ``notifier_channel_state`` (schema.sql), in memory."""
        channel = self.channels.get(delivery.channel_id)
        if channel is None:
            return "deleted"
        return "enabled" if channel.enabled else "disabled"

    def _replay(self, stored: _StoredDelivery) -> None:
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
        if refused := not_replayable(stored.delivery.status, self._channel_state(stored.delivery)):
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

        def matches(s: _StoredDelivery) -> bool:
            d = s.delivery
            return (
                s.tenant_id == tenant_id and d.status == status
                and self._channel_state(d) == "enabled"
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

    # -- the console's reads ------------------------------------------------------------------

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
            if not replayable or self._channel_state(x.delivery) == "enabled"
        )  # fmt: skip

    async def hourly_counts(self, tenant_id: uuid.UUID, now: datetime) -> list[HourlyCount]:
        await self._call()
        counts = Counter(
            (int((now - d.created_at) / timedelta(hours=1)), d.status)
            for d in self._deliveries(tenant_id)
            if now - timedelta(days=1) < d.created_at <= now
        )
        return [HourlyCount(h, status, n) for (h, status), n in counts.items()]
