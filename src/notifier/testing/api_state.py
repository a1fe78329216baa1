"""The state of ``testing.api.MemoryApiStore`` and the helpers its parts share: the rows it
keeps (tenants, channels, events, deliveries and their attempts), the clock that orders them,
the rule of a channel's state, and ``settle``, which writes what a worker would.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec
import trio

from notifier.errors import StoreUnavailable
from notifier.store.rows import (
    Attempt,
    Channel,
    Delivery,
    DestinationCircuit,
    Event,
)
from notifier.store.versions import LATEST, SchemaState
from notifier.testing.buckets import MemoryBuckets


@dataclass
class StoredEvent:
    tenant_id: uuid.UUID
    event: Event  # its deliveries as they were created; its payload None once expunged
    request_hash: str
    traceparent: str | None = None  # the trace context it was ingested under


@dataclass
class StoredDelivery:
    tenant_id: uuid.UUID
    delivery: Delivery
    attempts: list[Attempt] = field(default_factory=list)


class MemoryApiState:
    """What the in-memory API store keeps (``testing.api`` puts its parts together)."""

    def __init__(self) -> None:
        self.tenants: dict[str, uuid.UUID] = {}  # API key hash -> tenant id
        self.schema = SchemaState(frozenset(range(1, LATEST + 1)))  # what schema_state answers
        self.channels: dict[uuid.UUID, Channel] = {}
        self.events: dict[uuid.UUID, StoredEvent] = {}
        self.deliveries: dict[uuid.UUID, StoredDelivery] = {}
        self.enqueued: list[uuid.UUID] = []  # delivery ids handed to the outbox, in order
        self.unavailable = False
        self.buckets = MemoryBuckets()  # the ingest rate limit's
        # destinations' circuits by (channel type, destination); a test sets them
        self.circuits: dict[tuple[str, str], DestinationCircuit] = {}
        self._last_time = datetime.now(UTC)

    # -- for tests --------------------------------------------------------------------------------

    def settle(
        self,
        delivery_id: uuid.UUID,
        status: str,
        *,
        attempt: int = 1,
        error: str | None = None,
        response_excerpt: str | None = None,
        trace_id: str | None = None,
        span_id: str | None = None,
    ) -> None:
        """What a worker would write: the delivery ``status`` after ``attempt`` (with the
        receiver's ``response_excerpt``, the attempt span's ids)."""
        stored = self.deliveries[delivery_id]
        now = self._now()
        stored.delivery = msgspec.structs.replace(
            stored.delivery, status=status, attempt=attempt, last_error=error,
            delivered_at=now if status == "DELIVERED" else None,
        )  # fmt: skip
        outcome = {"DELIVERED": "delivered", "DEAD": "dead"}.get(status, "retry")
        stored.attempts.append(Attempt(
            attempt=attempt, outcome=outcome, status_code=None, duration_ms=1, error=error,
            response_excerpt=response_excerpt, started_at=now, trace_id=trace_id, span_id=span_id,
        ))  # fmt: skip

    def _now(self) -> datetime:
        """Now, and always later than the last time given: rows are ordered by creation."""
        self._last_time = max(datetime.now(UTC), self._last_time + timedelta(microseconds=1))
        return self._last_time

    async def _call(self) -> None:
        await trio.lowlevel.checkpoint()
        if self.unavailable:
            raise StoreUnavailable("memory store is unavailable")

    def _channel(self, tenant_id: uuid.UUID, channel_id: uuid.UUID) -> Channel | None:
        channel = self.channels.get(channel_id)
        return channel if channel is not None and channel.tenant_id == tenant_id else None

    def _deliveries(self, tenant_id: uuid.UUID) -> list[Delivery]:
        return [s.delivery for s in self.deliveries.values() if s.tenant_id == tenant_id]

    def _expunged(self, delivery: Delivery) -> bool:
        """Whether the payload of the delivery's event was expunged."""
        return self.events[delivery.event_id].event.payload_expunged_at is not None

    def _channel_state(self, delivery: Delivery) -> str:
        """The rule of the SQL function ``notifier_channel_state`` (schema.sql), in memory."""
        channel = self.channels.get(delivery.channel_id)
        if channel is None:
            return "deleted"
        return "enabled" if channel.enabled else "disabled"
