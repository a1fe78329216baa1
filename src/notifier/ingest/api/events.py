"""``/v1/events``: ingest one event or a batch (idempotent, rate limited per tenant) and read
one back with its deliveries."""

from __future__ import annotations

import math
import re
import uuid

import msgspec
from quart import Blueprint, Response, request

from notifier.ingest.api.auth import current_tenant
from notifier.ingest.api.context import api_context
from notifier.ingest.api.http import ApiError, json_response, read_body
from notifier.ingest.events import new_event, new_ids
from notifier.ingest.models import IDEMPOTENCY_HEADER_PATTERN, BatchIn, EventIn
from notifier.ingest.views import DeliveryRef, EventBatch, EventDetail, EventView
from notifier.store.rows import Event, IngestResult, NewEvent

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
        idempotency_key=event.idempotency_key,
    )  # fmt: skip


async def admit(tenant_id: uuid.UUID, count: int) -> None:
    """Spend ``count`` events of the key's rate limit (a bucket shared by every ingest
    process, one statement), or answer 429 writing nothing. Every event is charged: the
    config keeps the bucket (``ingest.rate_limit_burst``) at least as big as a batch."""
    ctx = api_context()
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


async def ingest(tenant_id: uuid.UUID, events: list[NewEvent]) -> list[IngestResult]:
    await admit(tenant_id, len(events))
    ctx = api_context()
    results = await ctx.store.ingest(tenant_id, events, ctx.max_attempts)  # refusals: errors.py
    ctx.ingested.inc(sum(1 for r in results if r.created))
    return results


@routes.post("/v1/events")
async def post_event() -> Response:
    tenant_id = await current_tenant()
    data = await read_body(EventIn)
    key = data.idempotency_key
    header_key = request.headers.get("Idempotency-Key")
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
    event = new_event(data, key)
    await admit(tenant_id, 1)
    ctx = api_context()
    # Stored together with the events of the requests in flight beside it: one statement, one
    # crossing for all. Its outcome is its own: a conflict or an unknown channel of another
    # request in the batch does not touch it.
    outcome = await ctx.commit((tenant_id, event))
    if isinstance(outcome, Exception):
        raise outcome  # answered like the same error of a request alone (api/errors.py)
    if outcome.created:
        ctx.ingested.inc()
    return json_response(event_view(outcome.event), 202 if outcome.created else 200)


@routes.post("/v1/events/batch")
async def post_batch() -> Response:
    tenant_id = await current_tenant()
    data = await read_body(BatchIn)
    max_events = api_context().config.ingest.max_batch_events
    if len(data.events) > max_events:
        raise ApiError(422, "validation_error", f"events: at most {max_events} events per batch")
    ids = new_ids(len(data.events))
    results = await ingest(
        tenant_id,
        [new_event(e, e.idempotency_key, i) for e, i in zip(data.events, ids, strict=True)],
    )
    status = 202 if any(r.created for r in results) else 200
    return json_response(EventBatch(events=[event_view(r.event) for r in results]), status)


@routes.get("/v1/events/<uuid:event_id>")
async def get_event(event_id: uuid.UUID) -> Response:
    event = await api_context().store.get_event(await current_tenant(), event_id)
    if event is None:
        raise ApiError(404, "not_found", "event not found")
    return json_response(event_view(event, with_payload=True))
