"""``/v1/events``: ingest one event or a batch (idempotent, rate limited per tenant), read one
back with its deliveries, and expunge one's payload."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Sequence

import msgspec
from quart import Blueprint, Response, request

from notifier.ingest.api.auth import current_tenant
from notifier.ingest.api.context import ApiContext, api_context
from notifier.ingest.api.http import ApiError, json_response, read_body
from notifier.ingest.events import new_event, new_ids
from notifier.ingest.models import IDEMPOTENCY_HEADER_PATTERN, BatchIn, EventIn
from notifier.ingest.views import DeliveryRef, EventBatch, EventDetail, EventView
from notifier.store.errors import DeliveriesInFlight, NotFound
from notifier.store.rows import Event, IngestResult, NewEvent
from notifier.tracing import HEADER, Kind, parse_traceparent

routes = Blueprint("events", __name__)
_IDEMPOTENCY_HEADER = re.compile(IDEMPOTENCY_HEADER_PATTERN)


def event_view(event: Event, *, with_payload: bool = False) -> EventView:
    """The event; with its payload and idempotency key (``EventDetail``) when asked."""
    view = EventView(
        id=event.id, type=event.type, recipient=event.recipient, created_at=event.created_at,
        deliveries=[
            DeliveryRef(id=d.id, channel_id=d.channel_id, channel_type=d.channel_type,
                        status=d.status)
            for d in event.deliveries
        ],
    )  # fmt: skip
    if not with_payload:
        return view
    return EventDetail(
        **msgspec.structs.asdict(view), payload=event.payload,
        idempotency_key=event.idempotency_key, payload_expunged_at=event.payload_expunged_at,
    )  # fmt: skip


async def admit(tenant_id: uuid.UUID, count: int, ctx: ApiContext | None = None) -> None:
    """Spend ``count`` events of the key's rate limit (a bucket shared by every ingest
    process, one statement), or answer 429 writing nothing. Every event is charged: the
    config keeps the bucket (``ingest.rate_limit_burst``) at least as big as a batch."""
    ctx = ctx or api_context()
    limit = ctx.rate_limiter
    if limit is None:
        return
    wait = await ctx.store.admit(
        limit.key(tenant_id), count, capacity=limit.capacity, rate=limit.rate
    )
    if wait > 0:
        raise ApiError(
            429, "rate_limited",
            f"over {limit.rate:g} events per second for this API key; "
            f"retry in {math.ceil(wait)} s", {"Retry-After": str(math.ceil(wait))},
        )  # fmt: skip


async def ingest(
    tenant_id: uuid.UUID, events: list[NewEvent], ctx: ApiContext | None = None
) -> list[IngestResult]:
    ctx = ctx or api_context()
    await admit(tenant_id, len(events), ctx)
    results = await ctx.store.ingest(tenant_id, events, ctx.max_attempts)  # refusals: errors.py
    ctx.ingested.inc(sum(1 for r in results if r.created))
    return results


def idempotency_key(data: EventIn, header_key: str | None) -> str | None:
    """The event's idempotency key: the body's or the ``Idempotency-Key`` header's
    (``header_key``), which must agree when both are given; 422 for a header out of shape."""
    key = data.idempotency_key
    if header_key is not None:
        if not 1 <= len(header_key) <= 255 or not _IDEMPOTENCY_HEADER.search(header_key):
            raise ApiError(
                422, "validation_error",
                "Idempotency-Key: 1 to 255 characters of visible ASCII (spaces only inside)",
            )  # fmt: skip
        if key is not None and key != header_key:
            raise ApiError(
                422, "validation_error",
                "idempotency_key: differs from the Idempotency-Key header",
            )  # fmt: skip
        key = header_key
    return key


async def store_event(
    ctx: ApiContext, tenant_id: uuid.UUID, data: EventIn, header_key: str | None,
    traceparent: str | None = None,
) -> tuple[EventView, int]:  # fmt: skip
    """``POST /v1/events`` once the body is read: the event stored (or found again by its
    idempotency key), its view and status (202 stored, 200 the same event again); the store's
    refusals are raised (answered by ``errors``). ``traceparent``: the request's, checked; the
    event keeps it, or with tracing on the ingest span's (a child of it, or a new trace)."""
    if not ctx.tracing.enabled:
        return await _store_event(ctx, tenant_id, data, header_key, traceparent)
    with ctx.tracing.span(
        "notifier.ingest", traceparent, kind=Kind.SERVER,
        attributes={"url.path": "/v1/events", "notifier.tenant_id": str(tenant_id)},
    ) as span:  # fmt: skip
        view, status = await _store_event(ctx, tenant_id, data, header_key, span.traceparent)
        span.set("http.response.status_code", status)
        span.set("notifier.event_id", str(view.id))
        return view, status


async def _store_event(
    ctx: ApiContext, tenant_id: uuid.UUID, data: EventIn, header_key: str | None,
    traceparent: str | None,
) -> tuple[EventView, int]:  # fmt: skip
    event = new_event(data, idempotency_key(data, header_key), traceparent=traceparent)
    await admit(tenant_id, 1, ctx)
    # Stored together with the events of the requests in flight beside it: one statement, one
    # crossing for all. Its outcome is its own: a conflict or an unknown channel of another
    # request in the batch does not touch it.
    outcome = await ctx.commit((tenant_id, event))
    if isinstance(outcome, Exception):
        raise outcome  # answered like the same error of a request alone (api/errors.py)
    if outcome.created:
        ctx.ingested.inc()
    return event_view(outcome.event), 202 if outcome.created else 200


async def store_batch(
    ctx: ApiContext, tenant_id: uuid.UUID, data: BatchIn, traceparent: str | None = None
) -> tuple[EventBatch, int]:
    """``POST /v1/events/batch`` once the body is read: the events stored in one transaction,
    their views and the status (202 when any was new, else 200). Every event of the batch keeps
    the one trace context of the request (``store_event``)."""
    if not ctx.tracing.enabled:
        return await _store_batch(ctx, tenant_id, data, traceparent)
    with ctx.tracing.span(
        "notifier.ingest", traceparent, kind=Kind.SERVER,
        attributes={"url.path": "/v1/events/batch", "notifier.tenant_id": str(tenant_id),
                    "notifier.events": len(data.events)},
    ) as span:  # fmt: skip
        batch, status = await _store_batch(ctx, tenant_id, data, span.traceparent)
        span.set("http.response.status_code", status)
        return batch, status


async def _store_batch(
    ctx: ApiContext, tenant_id: uuid.UUID, data: BatchIn, traceparent: str | None
) -> tuple[EventBatch, int]:
    max_events = ctx.config.ingest.max_batch_events
    if len(data.events) > max_events:
        raise ApiError(422, "validation_error", f"events: at most {max_events} events per batch")
    ids = new_ids(len(data.events))
    results = await ingest(
        tenant_id,
        [
            new_event(e, e.idempotency_key, i, traceparent)
            for e, i in zip(data.events, ids, strict=True)
        ],
        ctx,
    )
    status = 202 if any(r.created for r in results) else 200
    return EventBatch(events=[event_view(r.event) for r in results]), status


def request_traceparent(values: Sequence[str | bytes]) -> str | None:
    """The request's ``traceparent`` header, checked (``tracing.parse_traceparent``); ``None``
    when it is absent, out of shape or given more than once: a bad header is ignored, never an
    error."""
    return parse_traceparent(values[0]) if len(values) == 1 else None


# The two routes below are served by ``api.hot`` in front of quart when the app runs under
# ``serve_ingest``; these handlers answer them under quart's test client and stay the contract.
@routes.post("/v1/events")
async def post_event() -> Response:
    tenant_id = await current_tenant()
    data = await read_body(EventIn)
    view, status = await store_event(
        api_context(), tenant_id, data, request.headers.get("Idempotency-Key"),
        request_traceparent(request.headers.getlist(HEADER)),
    )  # fmt: skip
    return json_response(view, status)


@routes.post("/v1/events/batch")
async def post_batch() -> Response:
    tenant_id = await current_tenant()
    data = await read_body(BatchIn)
    batch, status = await store_batch(
        api_context(), tenant_id, data, request_traceparent(request.headers.getlist(HEADER))
    )
    return json_response(batch, status)


@routes.get("/v1/events/<uuid:event_id>")
async def get_event(event_id: uuid.UUID) -> Response:
    event = await api_context().store.get_event(await current_tenant(), event_id)
    if event is None:
        raise ApiError(404, "not_found", "event not found")
    return json_response(event_view(event, with_payload=True))


@routes.delete("/v1/events/<uuid:event_id>/payload")
async def expunge_payload(event_id: uuid.UUID) -> Response:
    """The event's payload and its deliveries' response excerpts removed, the event and its
    deliveries kept: 200 with the event (again on an expunged event: the same answer). 409
    while a delivery is PENDING or RETRYING (its message carries the payload)."""
    tenant_id = await current_tenant()
    try:
        event = await api_context().store.expunge_event(tenant_id, event_id)
    except NotFound as exc:
        raise ApiError(404, "not_found", "event not found") from exc
    except DeliveriesInFlight as exc:
        raise ApiError(409, "deliveries_in_flight", str(exc)) from exc
    return json_response(event_view(event, with_payload=True))
