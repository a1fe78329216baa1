"""What the HTTP API needs of the store: ``ApiStore``, the interface ``ingest.app.create_app``
is written against. ``Store`` implements it on Postgres, ``notifier.testing.api.MemoryApiStore``
in memory (for the API's unit tests)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from notifier.catalog import StoredCatalog
from notifier.store.console import DeliveryFilter, FoundDelivery, HourlyCount
from notifier.store.errors import IdempotencyConflict, UnknownChannels
from notifier.store.rows import (
    Channel,
    ChannelChanges,
    Delivery,
    DestinationCircuit,
    Event,
    EventType,
    FifoLine,
    IngestResult,
    MetricsSnapshot,
    NewEvent,
    ReplayPage,
)
from notifier.store.versions import SchemaState


class ApiStore(Protocol):
    """Tenants by API key, channels, events, deliveries and their replay, health and metrics.
    Every call but ``ping`` and ``metrics_snapshot`` names the tenant: one never sees another's
    rows. The errors are those of ``notifier.store.errors`` and ``notifier.errors``."""

    async def ping(self, timeout_seconds: float) -> None: ...

    async def schema_state(self, timeout_seconds: float | None = None) -> SchemaState: ...

    async def metrics_snapshot(self, retention_days: int = 0) -> MetricsSnapshot: ...

    async def tenant_by_key_hash(self, api_key_hash: str) -> uuid.UUID | None: ...

    async def circuits_of(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], DestinationCircuit]: ...

    async def fifo_lines(
        self, tenant_id: uuid.UUID, channel_ids: list[uuid.UUID]
    ) -> dict[uuid.UUID, FifoLine]: ...

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
    ) -> Channel: ...

    async def get_channel(self, tenant_id: uuid.UUID, channel_id: uuid.UUID) -> Channel | None: ...

    async def list_channels(
        self,
        tenant_id: uuid.UUID,
        *,
        type: str | None,
        recipient: str | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        customer: str | None = None,
    ) -> list[Channel]: ...

    async def update_channel(
        self,
        tenant_id: uuid.UUID,
        channel_id: uuid.UUID,
        changes: ChannelChanges,
        *,
        config_read: dict[str, Any] | None = None,
    ) -> Channel | None: ...

    async def delete_channel(self, tenant_id: uuid.UUID, channel_id: uuid.UUID) -> bool: ...

    async def ingest(
        self,
        tenant_id: uuid.UUID,
        events: Sequence[NewEvent],
        max_attempts: Mapping[str, int],
    ) -> list[IngestResult]: ...

    async def ingest_each(
        self,
        events: Sequence[tuple[uuid.UUID, NewEvent]],
        max_attempts: Mapping[str, int],
    ) -> list[IngestResult | IdempotencyConflict | UnknownChannels]: ...

    async def get_event(self, tenant_id: uuid.UUID, event_id: uuid.UUID) -> Event | None: ...

    async def expunge_event(self, tenant_id: uuid.UUID, event_id: uuid.UUID) -> Event:
        """Expunge the event's payload and its attempts' response excerpts
        (``notifier.store.expunge``); ``NotFound`` or ``DeliveriesInFlight`` writing nothing."""
        ...

    async def admit(self, key: str, count: int, *, capacity: int, rate: float) -> float:
        """The shared refilling bucket ``key`` of the ingest rate limit
        (``notifier.ratelimit.SharedBuckets.admit``)."""
        ...

    async def list_deliveries(
        self,
        tenant_id: uuid.UUID,
        *,
        status: str | None,
        channel_id: uuid.UUID | None,
        event_id: uuid.UUID | None,
        before: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[Delivery]: ...

    async def get_delivery(
        self, tenant_id: uuid.UUID, delivery_id: uuid.UUID
    ) -> Delivery | None: ...

    async def replay_delivery(self, tenant_id: uuid.UUID, delivery_id: uuid.UUID) -> None: ...

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
    ) -> ReplayPage: ...

    # -- the event-type catalog (notifier.store.event_types) ---------------------------------

    async def put_event_type(
        self,
        tenant_id: uuid.UUID,
        name: str,
        *,
        description: str,
        schema: dict[str, Any],
        max_types: int,
        max_bytes: int = ...,
    ) -> tuple[EventType, bool]: ...

    async def get_event_type(self, tenant_id: uuid.UUID, name: str) -> EventType | None: ...

    async def list_event_types(self, tenant_id: uuid.UUID) -> list[EventType]: ...

    async def delete_event_type(self, tenant_id: uuid.UUID, name: str) -> bool: ...

    async def event_catalog(self, tenant_id: uuid.UUID) -> StoredCatalog: ...

    async def strict_event_types(self, tenant_id: uuid.UUID) -> bool: ...

    async def set_strict_event_types(self, tenant_id: uuid.UUID, strict: bool) -> bool: ...

    # -- for the console (notifier.store.console) -------------------------------------------

    async def find_deliveries(
        self,
        tenant_id: uuid.UUID,
        found_by: DeliveryFilter,
        *,
        before: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[FoundDelivery]: ...

    async def count_deliveries(
        self, tenant_id: uuid.UUID, found_by: DeliveryFilter, *, replayable: bool = False
    ) -> int: ...

    async def hourly_counts(self, tenant_id: uuid.UUID, now: datetime) -> list[HourlyCount]: ...
