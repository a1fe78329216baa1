"""``/v1/deliveries``: list a tenant's deliveries (newest first, filtered) and read one with
its attempts."""

from __future__ import annotations

import uuid

import msgspec
from quart import Blueprint, Response, request

from notifier.ingest.api.auth import current_tenant
from notifier.ingest.api.context import api_context
from notifier.ingest.api.http import ApiError, json_response, uuid_arg
from notifier.ingest.api.pagination import cursor_arg, limit_arg, split_page
from notifier.ingest.views import AttemptView, DeliveryDetail, DeliveryPage, DeliveryView
from notifier.store.rows import DELIVERY_STATUSES, Delivery

routes = Blueprint("deliveries", __name__)


def delivery_view(d: Delivery) -> DeliveryView:
    """The delivery; with its attempts (``DeliveryDetail``) when the store read them."""
    view = DeliveryView(
        id=d.id, event_id=d.event_id, channel_id=d.channel_id, channel_type=d.channel_type,
        status=d.status, attempt=d.attempt, max_attempts=d.max_attempts,
        last_error=d.last_error, next_attempt_at=d.next_attempt_at,
        delivered_at=d.delivered_at, created_at=d.created_at,
    )  # fmt: skip
    if d.attempts is None:
        return view
    attempts = [
        AttemptView(attempt=a.attempt, outcome=a.outcome, status_code=a.status_code,
                    duration_ms=a.duration_ms, error=a.error,
                    response_excerpt=a.response_excerpt, started_at=a.started_at,
                    trace_id=a.trace_id, span_id=a.span_id)
        for a in d.attempts
    ]  # fmt: skip
    return DeliveryDetail(**msgspec.structs.asdict(view), attempts=attempts)


@routes.get("/v1/deliveries")
async def list_deliveries() -> Response:
    tenant_id = await current_tenant()
    status = request.args.get("status")
    if status is not None and status not in DELIVERY_STATUSES:
        raise ApiError(
            422, "invalid_parameter", f"status must be one of {', '.join(DELIVERY_STATUSES)}"
        )
    limit = limit_arg()
    rows = await api_context().store.list_deliveries(
        tenant_id, status=status, channel_id=uuid_arg("channel_id"),
        event_id=uuid_arg("event_id"), before=cursor_arg(), limit=limit + 1,
    )  # fmt: skip
    page, next_cursor = split_page(rows, limit, lambda d: (d.created_at, d.id))
    return json_response(
        DeliveryPage(items=[delivery_view(d) for d in page], next_cursor=next_cursor)
    )


@routes.get("/v1/deliveries/<uuid:delivery_id>")
async def get_delivery(delivery_id: uuid.UUID) -> Response:
    delivery = await api_context().store.get_delivery(await current_tenant(), delivery_id)
    if delivery is None:
        raise ApiError(404, "not_found", "delivery not found")
    return json_response(delivery_view(delivery))
