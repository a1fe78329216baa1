"""Deliveries: the filtered list (newest first, a page at a time), one delivery with its event's
payload, its channel and its attempts, its replay, and the replay of every delivery the filter
matches after a confirmation that says how many."""

from __future__ import annotations

import json
import urllib.parse
import uuid
from datetime import UTC, datetime
from typing import cast

import msgspec
from quart import Response, redirect, request
from werkzeug.datastructures import MultiDict

from notifier.console.data import utc_now
from notifier.console.web import PREFIX, ConsoleError, page, routes, signed_in_tenant
from notifier.ingest.api.context import api_context
from notifier.ingest.api.http import ApiError, in_utc
from notifier.ingest.api.pagination import decode_cursor, split_page
from notifier.store.console import DeliveryFilter
from notifier.store.errors import NotFound, NotReplayable
from notifier.store.rows import DELIVERY_STATUSES, TERMINAL_STATUSES

PAGE_SIZE = 50
MAX_PATTERN_CHARS = 255
BULK_PAGE = 500  # deliveries one call of the store's bulk replay queues
BULK_MAX = 50_000  # deliveries one bulk replay from the console queues at most
NOTICES = {
    "replayed": "The delivery was queued again.",
    "test": "A test event was sent to the channel: this is its delivery.",
}


def _time(args: MultiDict[str, str], name: str) -> datetime | None:
    text = args.get(name, "").strip()
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConsoleError(400, f"{name}: not a time (YYYY-MM-DDTHH:MM in UTC)") from exc
    # The form's inputs carry no offset: UTC, as the pages show times.
    if at.tzinfo is None:
        return at.replace(tzinfo=UTC)
    try:
        return in_utc(name, at)
    except ApiError as exc:  # 0001-01-01T00:00+14:00 is before the first UTC time
        raise ConsoleError(400, f"{name}: out of range") from exc


def read_filter(args: MultiDict[str, str]) -> DeliveryFilter:
    """The filter the form's fields (a query string or a posted form) say; 400 if one is
    not valid."""
    status = args.get("status", "").strip() or None
    if status is not None and status not in DELIVERY_STATUSES:
        raise ConsoleError(400, f"status: one of {', '.join(DELIVERY_STATUSES)}")
    channel = args.get("channel", "").strip()
    try:
        channel_id = uuid.UUID(channel) if channel else None
    except ValueError as exc:
        raise ConsoleError(400, "channel: not a channel id") from exc
    pattern = args.get("type", "").strip() or None
    if pattern is not None and len(pattern) > MAX_PATTERN_CHARS:
        raise ConsoleError(400, f"type: at most {MAX_PATTERN_CHARS} characters")
    return DeliveryFilter(
        status=status, channel_id=channel_id, event_type=pattern,
        created_after=_time(args, "since"), created_before=_time(args, "until"),
    )  # fmt: skip


def _text(at: datetime | None) -> str:
    """``at`` as a form field holds it: ISO 8601 in UTC without the offset, to the
    microsecond (a bulk replay's bound is exact)."""
    return at.astimezone(UTC).replace(tzinfo=None).isoformat() if at else ""


def filter_fields(flt: DeliveryFilter) -> dict[str, str]:
    """The form fields of ``flt`` (what ``read_filter`` reads back)."""
    fields = {
        "status": flt.status or "", "channel": str(flt.channel_id or ""),
        "type": flt.event_type or "",
        "since": _text(flt.created_after), "until": _text(flt.created_before),
    }  # fmt: skip
    return {k: v for k, v in fields.items() if v}


@routes.get("/deliveries")
async def deliveries() -> Response:
    tenant_id = await signed_in_tenant()
    flt = read_filter(request.args)
    before = None
    if cursor := request.args.get("before"):
        try:
            before = decode_cursor(cursor)
        except ApiError as exc:
            raise ConsoleError(400, "before: not a position of this list") from exc
    store = api_context().store
    rows = await store.find_deliveries(tenant_id, flt, before=before, limit=PAGE_SIZE + 1)
    items, next_cursor = split_page(
        rows, PAGE_SIZE, lambda f: (f.delivery.created_at, f.delivery.id)
    )
    fields = filter_fields(flt)
    next_url = None
    if next_cursor is not None:
        query = {**fields, "before": next_cursor}
        next_url = f"{PREFIX}/deliveries?{urllib.parse.urlencode(query)}"
    bulk_url = None
    if flt.status in TERMINAL_STATUSES:
        bulk_url = f"{PREFIX}/deliveries/replay?{urllib.parse.urlencode(fields)}"
    channels = await store.list_channels(
        tenant_id, type=None, recipient=None, after=None, limit=500
    )
    return await page(
        "deliveries.html", signed_in=True, items=items, fields=fields, statuses=DELIVERY_STATUSES,
        channels=channels, names={c.id: c.name for c in channels}, next_url=next_url,
        bulk_url=bulk_url,
        first_url=f"{PREFIX}/deliveries?{urllib.parse.urlencode(fields)}" if before else None,
    )  # fmt: skip


@routes.get("/deliveries/<uuid:delivery_id>")
async def delivery(delivery_id: uuid.UUID) -> Response:
    tenant_id = await signed_in_tenant()
    store = api_context().store
    found = await store.get_delivery(tenant_id, delivery_id)
    if found is None:
        raise ConsoleError(404, "There is no such delivery.")
    event = await store.get_event(tenant_id, found.event_id)
    channel = await store.get_channel(tenant_id, found.channel_id)
    return await page(
        "delivery.html", signed_in=True, delivery=found, event=event, channel=channel,
        payload=json.dumps(event.payload, indent=2, ensure_ascii=False)
        if event and event.payload is not None else None,
        terminal=found.status in TERMINAL_STATUSES,
        notice=NOTICES.get(request.args.get("notice", "")),
    )  # fmt: skip


@routes.post("/deliveries/<uuid:delivery_id>/replay")
async def replay(delivery_id: uuid.UUID) -> Response:
    tenant_id = await signed_in_tenant()
    try:
        await api_context().store.replay_delivery(tenant_id, delivery_id)
    except NotFound as exc:
        raise ConsoleError(404, "There is no such delivery.") from exc
    except NotReplayable as exc:
        raise ConsoleError(409, f"This delivery cannot be replayed: {exc}.") from exc
    return cast(Response, redirect(f"{PREFIX}/deliveries/{delivery_id}?notice=replayed", 303))


@routes.get("/deliveries/replay")
async def confirm_bulk_replay() -> Response:
    tenant_id = await signed_in_tenant()
    flt = read_filter(request.args)
    if flt.status not in TERMINAL_STATUSES:
        raise ConsoleError(400, "Filter by status DEAD or DELIVERED to replay in bulk.")
    # Fixed now: what is created after this confirmation is not replayed with it.
    flt = msgspec.structs.replace(flt, created_before=flt.created_before or utc_now())
    count = await api_context().store.count_deliveries(tenant_id, flt, replayable=True)
    return await page(
        "replay_confirm.html", signed_in=True, count=min(count, BULK_MAX), more=count > BULK_MAX,
        fields=filter_fields(flt),
        list_url=f"{PREFIX}/deliveries?{urllib.parse.urlencode(filter_fields(flt))}",
    )  # fmt: skip


@routes.post("/deliveries/replay")
async def bulk_replay() -> Response:
    tenant_id = await signed_in_tenant()
    flt = read_filter(await request.form)
    if flt.status is None or flt.status not in TERMINAL_STATUSES:
        raise ConsoleError(400, "Filter by status DEAD or DELIVERED to replay in bulk.")
    store = api_context().store
    queued = 0
    after = None
    while queued < BULK_MAX:
        done = await store.replay_deliveries(
            tenant_id, status=flt.status, channel_id=flt.channel_id, event_type=flt.event_type,
            created_after=flt.created_after, created_before=flt.created_before, after=after,
            limit=min(BULK_PAGE, BULK_MAX - queued),
        )  # fmt: skip
        queued += done.queued
        if not done.more or done.next is None:
            break
        after = done.next
    return await page(
        "replay_done.html", signed_in=True, queued=queued,
        list_url=f"{PREFIX}/deliveries?{urllib.parse.urlencode(filter_fields(flt))}",
    )  # fmt: skip


@routes.get("/events/<uuid:event_id>")
async def event(event_id: uuid.UUID) -> Response:
    tenant_id = await signed_in_tenant()
    found = await api_context().store.get_event(tenant_id, event_id)
    if found is None:
        raise ConsoleError(404, "There is no such event.")
    return await page(
        "event.html", signed_in=True, event=found,
        payload=json.dumps(found.payload, indent=2, ensure_ascii=False),
    )  # fmt: skip
