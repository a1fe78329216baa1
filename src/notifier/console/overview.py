"""The console's first page: the tenant's deliveries per status over the last hour and day,
delivered and failed per hour as a chart, the channels failing now (since when, the last error),
the DEAD count, and its own queue: its deliveries waiting, in retry delays and dead. Never the
fleet's figures (the broker's queues hold every tenant's messages)."""

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
from notifier.store.console import DeliveryFilter, HourlyCount
from notifier.store.rows import DELIVERY_STATUSES, Channel

HOURS = 24
FAILED = frozenset({"DEAD", "RETRYING"})
# The tenant's own queue: its deliveries waiting for a worker, in retry delays, and dead.
QUEUE_STATUSES = ("PENDING", "RETRYING", "DEAD")


@dataclasses.dataclass(frozen=True)
class Recent:
    hour: Counter[str]
    day: Counter[str]
    delivered: list[int]  # per hour, oldest first (deliveries created in that hour)
    failed: list[int]
    labels: list[str]


def recent(counts: list[HourlyCount], now: datetime) -> Recent:
    """Pure: the overview's numbers from the store's per-hour counts of the day to ``now``."""
    hour, day = Counter[str](), Counter[str]()
    delivered, failed = [0] * HOURS, [0] * HOURS
    for c in counts:
        if not 0 <= c.hours_ago < HOURS:
            continue
        day[c.status] += c.count
        if c.hours_ago == 0:
            hour[c.status] += c.count
        slot = HOURS - 1 - c.hours_ago
        if c.status == "DELIVERED":
            delivered[slot] += c.count
        elif c.status in FAILED:
            failed[slot] += c.count
    labels = [(now - timedelta(hours=HOURS - 1 - i)).strftime("%H:%M") for i in range(HOURS)]
    return Recent(hour, day, delivered, failed, labels)


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
    day = recent(await ctx.store.hourly_counts(tenant_id, now), now)
    queue = {
        status: await ctx.store.count_deliveries(tenant_id, DeliveryFilter(status=status))
        for status in QUEUE_STATUSES
    }
    return await page(
        "overview.html", signed_in=True, statuses=DELIVERY_STATUSES, day=day, dead=queue["DEAD"],
        failing=await failing_channels(ctx.store, tenant_id),
        chart=line_chart(day.delivered, day.failed, day.labels), queue=queue, now=now,
    )  # fmt: skip
