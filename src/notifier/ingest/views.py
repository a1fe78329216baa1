"""Response bodies of the HTTP API. The handlers build their answers from these structs and the
OpenAPI document (``openapi.py``) is generated from them, so the two cannot disagree."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from notifier.store.rows import DELIVERY_STATUSES

ATTEMPT_OUTCOMES = ("delivered", "retry", "rate_limited", "deferred", "dead", "panic", "replayed")

# Every timestamp comes from a Postgres timestamptz, so it always carries its offset.
Timestamp = Annotated[datetime, msgspec.Meta(extra_json_schema={"format": "date-time"})]
DeliveryStatus = Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(DELIVERY_STATUSES)})]
Outcome = Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(ATTEMPT_OUTCOMES)})]
TraceId = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")]
SpanId = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{16}$")]


class _View(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ErrorDetail(_View):
    code: str
    message: str


class ErrorBody(_View):
    """Every error answer: `{"error": {"code": ..., "message": ...}}`."""

    error: ErrorDetail


CIRCUIT_STATES = ("closed", "open", "half_open")
CircuitState = Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(CIRCUIT_STATES)})]


class CircuitHealth(_View):
    """The circuit breaker of the channel's destination (shared by every channel of the type
    that delivers there): `open` while its deliveries are deferred, `half_open` while one
    probe tries it (`next_probe_at` is then when that probe's lease ends)."""

    destination: str
    state: CircuitState
    consecutive_failures: int
    opened_at: Timestamp | None
    next_probe_at: Timestamp | None


class ChannelHealth(_View):
    consecutive_failures: int
    failing_since: Timestamp | None
    last_success_at: Timestamp | None
    circuit: CircuitHealth


# A channel's payload filter, as the OpenAPI document's component ChannelFilter describes it.
FilterView = Annotated[
    dict[str, Any], msgspec.Meta(extra_json_schema={"$ref": "#/components/schemas/ChannelFilter"})
]


class ChannelView(_View):
    """A channel. `config` holds the secret fields only in the answer to its creation."""

    id: uuid.UUID
    type: str
    name: str
    config: dict[str, Any]
    recipient: str | None
    event_types: list[str]
    enabled: bool
    disabled_reason: str | None
    disabled_at: Timestamp | None
    health: ChannelHealth
    max_attempts: int | None
    rate_limit_per_second: float | None
    # The payload filter (README "Payload filters"); null: every payload matches.
    filter: FilterView | None
    # The tenant's own customer the channel belongs to (README "Customer portal"); null: none.
    customer: str | None
    # "fifo": one at a time, in acceptance order (README "Ordered delivery (FIFO)")
    ordering: str
    created_at: Timestamp
    updated_at: Timestamp


class ChannelPage(_View):
    items: list[ChannelView]
    next_cursor: str | None


class DeliveryRef(_View):
    id: uuid.UUID
    channel_id: uuid.UUID
    channel_type: str
    status: DeliveryStatus


class EventView(_View):
    id: uuid.UUID
    type: str
    recipient: str | None
    created_at: Timestamp
    deliveries: list[DeliveryRef]


class EventDetail(EventView):
    """An event with its payload: `null` once expunged (`DELETE /v1/events/{id}/payload`), and
    `payload_expunged_at` is then when (else `null`)."""

    payload: dict[str, Any] | None
    idempotency_key: str | None
    payload_expunged_at: Timestamp | None


class EventBatch(_View):
    events: list[EventView]


class AttemptView(_View):
    """One entry of a delivery's history: an attempt, or a replay (`replayed`: an operator
    enqueued the finished delivery again; it has no error). Entries are numbered in order, and
    the numbers keep increasing across replays. `response_excerpt`: the start of the receiver's
    answer to a delivered attempt (at most 2048 bytes of UTF-8), null when it kept none; a failed
    attempt's answer is summed up in `error`. `trace_id` and `span_id`: the attempt's span in
    the W3C trace context the event came with (its `traceparent` header) or the one notifier
    started; `span_id` is null when notifier recorded no span of its own (tracing off), both
    are null when the attempt was not traced."""

    attempt: int
    outcome: Outcome
    status_code: int | None
    duration_ms: int
    error: str | None
    response_excerpt: str | None
    started_at: Timestamp
    trace_id: TraceId | None = None
    span_id: SpanId | None = None


class DeliveryView(_View):
    """A delivery. `attempt` is the number of the latest entry of its history (0 before its first
    attempt); `max_attempts` the highest number its attempts may reach: its attempt budget,
    counted from its creation or from its latest replay. `max_attempts - attempt` attempts are
    left."""

    id: uuid.UUID
    event_id: uuid.UUID
    channel_id: uuid.UUID
    channel_type: str
    status: DeliveryStatus
    attempt: int
    max_attempts: int
    last_error: str | None
    next_attempt_at: Timestamp | None
    delivered_at: Timestamp | None
    created_at: Timestamp


class DeliveryDetail(DeliveryView):
    attempts: list[AttemptView]


class DeliveryPage(_View):
    items: list[DeliveryView]
    next_cursor: str | None


class ReplayResult(_View):
    queued: int
    # more deliveries match than `limit`: send the same request again, with `cursor` set to
    # `next_cursor`, to go on after the ones just replayed
    more: bool
    next_cursor: str | None


class Health(_View):
    status: Literal["ok"]


class SchemaReport(_View):
    # "current"; "missing" or "behind" (run `notifier migrate`: not ready); "ahead" (a newer
    # release migrated the database: ready, the migrations only add)
    status: Literal["current", "missing", "behind", "ahead"]
    version: int  # the highest migration the database has applied (0: none)
    expected: int  # the highest this code knows


class Readiness(_View):
    status: Literal["ready", "unavailable"]
    checks: dict[str, str]  # "database", "schema", "broker": "ok" or "unavailable: <why>"
    schema: SchemaReport | None = None  # None when the database did not answer


class EventTypeView(_View):
    """A registered event type: events of it are checked against `schema`."""

    name: str
    description: str
    schema: dict[str, Any]
    created_at: Timestamp
    updated_at: Timestamp


class EventTypeList(_View):
    items: list[EventTypeView]


class TenantView(_View):
    """The API key's tenant and its settings."""

    id: uuid.UUID
    strict_event_types: bool


PortalState = Annotated[
    str, msgspec.Meta(extra_json_schema={"enum": ["active", "expired", "revoked"]})
]


class PortalLinkView(_View):
    """A portal link (README "Customer portal"): scoped to the channels labelled `customer`, or
    to `channel_ids`. Its token is never shown again after its creation."""

    id: uuid.UUID
    customer: str | None
    channel_ids: list[uuid.UUID] | None
    state: PortalState
    created_at: Timestamp
    expires_at: Timestamp
    revoked_at: Timestamp | None


class PortalLinkCreated(PortalLinkView):
    """A new portal link with its URL: hand it to the customer; it is shown only this once."""

    url: str


class PortalLinkPage(_View):
    items: list[PortalLinkView]
    next_cursor: str | None


RESPONSE_MODELS: tuple[type[msgspec.Struct], ...] = (
    ErrorBody, ChannelView, ChannelPage, EventView, EventDetail, EventBatch, DeliveryView,
    DeliveryDetail, DeliveryPage, ReplayResult, Health, Readiness, EventTypeView, EventTypeList,
    TenantView, PortalLinkView, PortalLinkCreated, PortalLinkPage,
)  # fmt: skip
