"""The console's first page: the tenant's deliveries per status over the last hour and day,
delivered and failed per hour as a chart, the channels failing now (since when, the last error),
the DEAD count, and the broker's queue depths per channel type."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from datetime import datetime, timedelta

from quart import Response

from notifier.console.chart import line_chart
from notifier.console.data import utc_now
from notifier.console.web import page, routes, signed_in_tenant
from notifier.ingest.api.context import api_context
from notifier.store.api import ApiStore
from notifier.store.rows import DELIVERY_STATUSES, Channel, Delivery

SCAN_DAY_ROWS = 20_000  # deliveries of the last day read at most (the counts say "at least")
COUNT_DEAD_ROWS = 10_000
READ_PAGE = 500
HOURS = 24
FAILED = frozenset({"DEAD", "RETRYING"})


@dataclasses.dataclass(frozen=True)
class Recent:
    hour: Counter[str]
    day: Counter[str]
    delivered: list[int]  # per hour, oldest first (deliveries created in that hour)
    failed: list[int]
    labels: list[str]
    complete: bool  # False: more than SCAN_DAY_ROWS in the day, counts are lower bounds


def recent(rows: list[Delivery], now: datetime, complete: bool) -> Recent:
    """Pure: the counts of ``rows`` (the deliveries created since ``now`` - a day)."""
    hour, day = Counter[str](), Counter[str]()
    delivered, failed = [0] * HOURS, [0] * HOURS
    for row in rows:
        age = now - row.created_at
        if age > timedelta(days=1):
            continue
        day[row.status] += 1
        if age <= timedelta(hours=1):
            hour[row.status] += 1
        slot = HOURS - 1 - min(HOURS - 1, int(age / timedelta(hours=1)))
        if row.status == "DELIVERED":
            delivered[slot] += 1
        elif row.status in FAILED:
            failed[slot] += 1
    labels = [(now - timedelta(hours=HOURS - 1 - i)).strftime("%H:00") for i in range(HOURS)]
    return Recent(hour, day, delivered, failed, labels, complete)


async def read_day(store: ApiStore, tenant_id: uuid.UUID, now: datetime) -> Recent:
    since = now - timedelta(days=1)
    rows: list[Delivery] = []
    cursor = None
    while len(rows) < SCAN_DAY_ROWS:
        got = await store.list_deliveries(
            tenant_id, status=None, channel_id=None, event_id=None, before=cursor,
            limit=READ_PAGE,
        )  # fmt: skip
        rows.extend(r for r in got if r.created_at >= since)
        if len(got) < READ_PAGE or got[-1].created_at < since:
            return recent(rows, now, complete=True)
        cursor = (got[-1].created_at, got[-1].id)
    return recent(rows, now, complete=False)


async def count_dead(store: ApiStore, tenant_id: uuid.UUID) -> tuple[int, bool]:
    """The tenant's DEAD deliveries, counted to ``COUNT_DEAD_ROWS``; and whether more."""
    count, cursor = 0, None
    while count < COUNT_DEAD_ROWS:
        got = await store.list_deliveries(
            tenant_id, status="DEAD", channel_id=None, event_id=None, before=cursor,
            limit=READ_PAGE,
        )  # fmt: skip
        count += len(got)
        if len(got) < READ_PAGE:
            return count, False
        cursor = (got[-1].created_at, got[-1].id)
    return count, True


async def failing_channels(
    store: ApiStore, tenant_id: uuid.UUID
) -> list[tuple[Channel, str | None]]:
    """The channels failing now, longest failing first, each with its last error."""
    channels = await store.list_channels(
        tenant_id, type=None, recipient=None, after=None, limit=500
    )
    failing = sorted((c for c in channels if c.failing_since), key=lambda c: c.failing_since or 0)
    out = []
    for channel in failing:
        latest = await store.list_deliveries(
            tenant_id, status=None, channel_id=channel.id, event_id=None, before=None, limit=20
        )
        out.append((channel, next((d.last_error for d in latest if d.last_error), None)))
    return out


@routes.get("/")
async def overview() -> Response:
    tenant_id = await signed_in_tenant()
    ctx = api_context()
    now = utc_now()
    day = await read_day(ctx.store, tenant_id, now)
    dead, more_dead = await count_dead(ctx.store, tenant_id)
    await ctx.scrape.refresh()  # the broker's queue depths, read at most every few seconds
    gauges = ctx.metrics.scrape_time
    depths: dict[str, dict[str, int]] = {}
    for queue, depth in gauges.queue_depths:
        kinds = depths.setdefault(queue.channel_type, {"main": 0, "retry": 0, "dead": 0})
        kinds[queue.kind] = kinds.get(queue.kind, 0) + depth
    return await page(
        "overview.html", signed_in=True, statuses=DELIVERY_STATUSES, day=day, dead=dead,
        more_dead=more_dead, failing=await failing_channels(ctx.store, tenant_id),
        chart=line_chart(day.delivered, day.failed, day.labels), depths=depths,
        broker_up=gauges.broker_up, now=now,
    )  # fmt: skip
