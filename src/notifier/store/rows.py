"""Plain row types the store hands out, so no asyncpg ``Record`` leaves the store."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec

DELIVERY_STATUSES = ("PENDING", "RETRYING", "DELIVERED", "DEAD")
TERMINAL_STATUSES = frozenset({"DELIVERED", "DEAD"})


class Channel(msgspec.Struct, frozen=True, kw_only=True):
    id: uuid.UUID
    tenant_id: uuid.UUID
    type: str
    name: str
    config: dict[str, Any]
    recipient: str | None
    event_types: list[str]
    enabled: bool
    max_attempts: int | None
    created_at: datetime
    updated_at: datetime
    disabled_reason: str | None = None
    disabled_at: datetime | None = None
    consecutive_failures: int = 0
    failing_since: datetime | None = None
    last_success_at: datetime | None = None
    rate_limit_per_second: float | None = None  # across the fleet; None: no limit
    # The payload filter (notifier.filters); None: every payload matches.
    filter: dict[str, Any] | None = None
    # The tenant's own customer the channel belongs to (a portal link's scope); None: none.
    customer: str | None = None
    ordering: str = "none"  # "fifo": README "Ordered delivery (FIFO)"


class ChannelChanges(msgspec.Struct, frozen=True, kw_only=True):
    """The fields a change of a channel names; an ``UNSET`` one keeps what is stored, whatever
    a concurrent write put there."""

    name: str | msgspec.UnsetType = msgspec.UNSET
    config: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    recipient: str | msgspec.UnsetType | None = msgspec.UNSET
    event_types: list[str] | msgspec.UnsetType = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET
    max_attempts: int | msgspec.UnsetType | None = msgspec.UNSET
    rate_limit_per_second: float | msgspec.UnsetType | None = msgspec.UNSET
    filter: dict[str, Any] | msgspec.UnsetType | None = msgspec.UNSET  # None: no filter
    customer: str | msgspec.UnsetType | None = msgspec.UNSET  # None: no customer label
    ordering: str | msgspec.UnsetType = msgspec.UNSET

    def named(self) -> list[str]:
        return [f for f in self.__struct_fields__ if getattr(self, f) is not msgspec.UNSET]


class DeliverySummary(msgspec.Struct, frozen=True, kw_only=True):
    id: uuid.UUID
    channel_id: uuid.UUID
    channel_type: str
    status: str


class Event(msgspec.Struct, frozen=True, kw_only=True):
    id: uuid.UUID
    type: str
    recipient: str | None
    payload: dict[str, Any] | None  # None once expunged (``payload_expunged_at``)
    idempotency_key: str | None
    created_at: datetime
    deliveries: list[DeliverySummary]
    payload_expunged_at: datetime | None = None


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event to ingest; ``id`` is chosen by the caller so results can be matched up."""

    id: uuid.UUID
    type: str
    recipient: str | None
    payload: msgspec.Raw  # the JSON object exactly as received
    idempotency_key: str | None
    request_hash: str
    channel_ids: list[uuid.UUID] | None
    # The W3C traceparent it was ingested under (tracing.parse_traceparent's), or None.
    traceparent: str | None = None


class IngestResult(msgspec.Struct, frozen=True, kw_only=True):
    event: Event
    created: bool  # False: an earlier event with the same idempotency key and body


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    attempt: int
    outcome: str
    status_code: int | None
    duration_ms: int
    error: str | None
    started_at: datetime
    # The start of the receiver's answer (at most 2048 bytes), as the adapter kept it.
    response_excerpt: str | None = None
    trace_id: str | None = None  # the attempt's span (README, Tracing)
    span_id: str | None = None


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    id: uuid.UUID
    event_id: uuid.UUID
    channel_id: uuid.UUID
    channel_type: str
    status: str
    attempt: int
    max_attempts: int
    last_error: str | None
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    created_at: datetime
    attempts: list[Attempt] | None = None


class DeliveryState(msgspec.Struct, frozen=True):
    status: str
    attempt: int
    # The delivery's channel: "enabled", "disabled" (with the reason) or "deleted". Deliveries
    # of a channel that is not enabled are not attempted.
    channel_state: str = "enabled"
    channel_reason: str | None = None
    # The channel's rate_limit_per_second (None: no limit), read with its state.
    rate_limit_per_second: float | None = None
    # The number of the delivery's latest replay (0: none): its backoff starts again after it.
    replayed_at: int = 0


class FifoHead(msgspec.Struct, frozen=True, kw_only=True):
    """The head of a FIFO channel's line: its unfinished delivery with the lowest number."""

    delivery_id: uuid.UUID
    fifo_seq: int
    wait_seconds: float  # until it is due (0: due now), on Postgres's clock
    body: bytes  # the worker message of its next attempt
    traceparent: str | None = None


class FifoLine(msgspec.Struct, frozen=True, kw_only=True):
    """A FIFO channel's line as the console shows it: its unfinished deliveries, the seconds
    since the oldest one's event was accepted, and whether one of them is retrying."""

    backlog: int
    lag_seconds: float
    retrying: bool


class AttemptRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker writes when it settles one attempt: the new status plus the attempt row.
    ``status`` None (a rate-limited attempt) leaves the delivery's status and attempt alone."""

    delivery_id: uuid.UUID
    attempt: int
    status: str | None
    outcome: str
    started_at: datetime
    duration_ms: int
    status_code: int | None = None
    error: str | None = None
    response_excerpt: str | None = None
    next_attempt_at: datetime | None = None
    disable_channel: bool = False  # the destination is gone: disable the channel too
    # The delivery's created_at (its event's, which its message carries): the day of history
    # that holds it, so the statement reads one partition. None: looked for in every one.
    created_at: datetime | None = None
    # The attempt's span (README, Tracing): its trace id, and its own id when it was recorded.
    trace_id: str | None = None
    span_id: str | None = None


class OutboxRow(msgspec.Struct, frozen=True):
    id: int
    delivery_id: uuid.UUID
    routing_key: str
    body: bytes
    created_at: datetime  # when the row was written (for the relay's lag)
    traceparent: str | None = None  # its event's: the AMQP header ``traceparent``


class MetricsSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What ``/metrics`` reads from Postgres at scrape time, in one statement."""

    outbox_depth: int
    pending: int  # deliveries PENDING
    retrying: int  # deliveries RETRYING
    oldest_open_age_seconds: float | None  # since the open delivery changed least recently
    # days of history past the retention still there (kept for an unfinished delivery, or no
    # maintenance role running), and how far ahead the partitions reach (schema.sql)
    history_days_overdue: int = 0
    history_ahead_seconds: float = 0.0
    # (channel type, destination, state) of the circuits not closed or changed lately
    circuits: tuple[tuple[str, str, str], ...] = ()
    # (channel type, how many) of the channels notifier disabled (not a PATCH), where any
    auto_disabled: tuple[tuple[str, int], ...] = ()
    # (channel type, channel id, unfinished deliveries, age of the oldest in seconds) of the
    # FIFO channels furthest behind (README "Ordered delivery (FIFO)")
    fifo_lines: tuple[tuple[str, str, int, float], ...] = ()


class ReplayPage(msgspec.Struct, frozen=True, kw_only=True):
    """What one call of a bulk replay did: how many deliveries it enqueued again, whether more
    match, and the ``(created_at, id)`` the next call starts after (None: from the start)."""

    queued: int
    more: bool
    next: tuple[datetime, uuid.UUID] | None


class DestinationCircuit(msgspec.Struct, frozen=True, kw_only=True):
    """A destination's circuit breaker as the API and the console show it (a destination with
    no row is closed, with no failure)."""

    state: str  # closed, open, half_open
    consecutive_failures: int = 0
    opened_at: datetime | None = None
    next_probe_at: datetime | None = None  # half-open: when the probe's lease ends


class AttemptRow(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt of a dead delivery, as a failure alert lists it (``notifier.alerts``)."""

    attempt: int
    started_at: datetime
    outcome: str
    status_code: int | None = None
    duration_ms: int | None = None
    error: str | None = None


class DeadHistory(msgspec.Struct, frozen=True, kw_only=True):
    """What the store tells of a dead delivery: its channel's name (None when the channel was
    deleted) and its latest attempts, newest first."""

    channel_name: str | None = None
    attempts: tuple[AttemptRow, ...] = ()


class EventType(msgspec.Struct, frozen=True, kw_only=True):
    """A registered event type of a tenant's catalog (``notifier.catalog``)."""

    name: str
    description: str
    schema: dict[str, Any]
    created_at: datetime
    updated_at: datetime
