"""Operations on deliveries: replay one (``/v1/deliveries/<id>/retry``) or every delivery a
filter matches, a page at a time (``/v1/deliveries/retry``)."""

from __future__ import annotations

import uuid

from quart import Blueprint, Response, request

from notifier.ingest.api.auth import current_tenant
from notifier.ingest.api.context import api_context
from notifier.ingest.api.deliveries import delivery_view
from notifier.ingest.api.http import ApiError, decode_body, in_utc, json_response, read_body
from notifier.ingest.api.pagination import decode_cursor, encode_cursor
from notifier.ingest.models import NoFields, ReplayIn
from notifier.ingest.views import ReplayResult
from notifier.store.errors import NotFound, NotReplayable

routes = Blueprint("operations", __name__)


@routes.post("/v1/deliveries/<uuid:delivery_id>/retry")
async def replay_delivery(delivery_id: uuid.UUID) -> Response:
    tenant_id = await current_tenant()
    data = await request.get_data(cache=False)
    assert isinstance(data, bytes)
    if data.strip():  # no body, or an empty object
        decode_body(data, NoFields)
    store = api_context().store
    try:
        await store.replay_delivery(tenant_id, delivery_id)
    except NotFound as exc:
        raise ApiError(404, "not_found", "delivery not found") from exc
    except NotReplayable as exc:
        raise ApiError(409, "not_replayable", str(exc)) from exc
    delivery = await store.get_delivery(tenant_id, delivery_id)
    if delivery is None:  # deleted by retention in between
        raise ApiError(404, "not_found", "delivery not found")
    return json_response(delivery_view(delivery), 202)


@routes.post("/v1/deliveries/retry")
async def replay_deliveries() -> Response:
    tenant_id = await current_tenant()
    data = await read_body(ReplayIn)
    page = await api_context().store.replay_deliveries(
        tenant_id, status=data.status, channel_id=data.channel_id, event_type=data.event_type,
        created_after=in_utc("created_after", data.created_after),
        created_before=in_utc("created_before", data.created_before),
        after=decode_cursor(data.cursor) if data.cursor is not None else None,
        limit=data.limit,
    )  # fmt: skip
    return json_response(ReplayResult(
        queued=page.queued, more=page.more,
        next_cursor=encode_cursor(*page.next) if page.next else None,
    ), 202)  # fmt: skip
