"""What the pages read, made of the store's calls the API makes (``notifier.store.api.ApiStore``):
deliveries filtered by what the API's list filters (status, channel) and, walking its pages,
by event type pattern and time; the event type of each, read once per page."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

from notifier.store.api import ApiStore
from notifier.store.rows import Delivery

# Rows one page of the console reads at most to fill itself: a filter that matches few of
# many deliveries shows a short page with a link further back rather than read them all.
SCAN_ROWS = 5_000
READ_PAGE = 200
COUNT_SCAN_ROWS = 50_000  # rows a bulk replay's count reads at most
LAST_ID = uuid.UUID(int=(1 << 128) - 1)  # after every id: a time bound alone as a cursor


def pattern_matches(pattern: str, event_type: str) -> bool:
    """``*`` matches everything, ``a.b.*`` matches ``a.b.<anything>``, else exact: the rule
    of channels' event type patterns (``notifier_type_matches`` in schema.sql)."""
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return event_type.startswith(pattern[:-1])
    return pattern == event_type


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeliveryFilter:
    status: str | None = None
    channel_id: uuid.UUID | None = None
    event_type: str | None = None  # a pattern
    since: datetime | None = None  # created at or after
    until: datetime | None = None  # created before

    def start(self, before: tuple[datetime, uuid.UUID] | None) -> tuple[datetime, uuid.UUID] | None:
        """Where a newest-first walk starts: ``before`` or ``until``, the earlier."""
        bound = (self.until, LAST_ID) if self.until else None
        if before is None or bound is None:
            return before or bound
        return min(before, bound)


@dataclasses.dataclass(frozen=True)
class DeliveryPage:
    items: list[Delivery]
    event_types: dict[uuid.UUID, str]  # by event id
    next: tuple[datetime, uuid.UUID] | None  # where the next page starts; None: no more


class EventTypes:
    """Event ids → types for one request, each event read once."""

    def __init__(self, store: ApiStore, tenant_id: uuid.UUID) -> None:
        self._store = store
        self._tenant_id = tenant_id
        self.known: dict[uuid.UUID, str] = {}

    async def of(self, event_id: uuid.UUID) -> str:
        if event_id not in self.known:
            event = await self._store.get_event(self._tenant_id, event_id)
            self.known[event_id] = event.type if event else ""
        return self.known[event_id]


async def walk(
    store: ApiStore,
    tenant_id: uuid.UUID,
    flt: DeliveryFilter,
    before: tuple[datetime, uuid.UUID] | None,
    types: EventTypes,
    *,
    want: int,
    scan_rows: int = SCAN_ROWS,
) -> tuple[list[Delivery], tuple[datetime, uuid.UUID] | None]:
    """Up to ``want`` deliveries ``flt`` matches, newest first from ``before``, reading at most
    ``scan_rows``; and where a further walk starts (None: nothing further matches)."""
    found: list[Delivery] = []
    cursor = flt.start(before)
    scanned = 0
    while scanned < scan_rows:
        rows = await store.list_deliveries(
            tenant_id, status=flt.status, channel_id=flt.channel_id, event_id=None,
            before=cursor, limit=min(READ_PAGE, scan_rows - scanned),
        )  # fmt: skip
        for row in rows:
            scanned += 1
            if flt.since is not None and row.created_at < flt.since:
                return found, None
            if flt.event_type and not pattern_matches(flt.event_type, await types.of(row.event_id)):
                continue
            found.append(row)
            if len(found) == want:
                return found, (row.created_at, row.id)
        if len(rows) < READ_PAGE:
            return found, None
        cursor = (rows[-1].created_at, rows[-1].id)
    return found, cursor


async def find_deliveries(
    store: ApiStore,
    tenant_id: uuid.UUID,
    flt: DeliveryFilter,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> DeliveryPage:
    """One page of ``limit`` deliveries, newest first, with their event types."""
    types = EventTypes(store, tenant_id)
    items, position = await walk(store, tenant_id, flt, before, types, want=limit + 1)
    if len(items) > limit:
        items = items[:limit]
        position = (items[-1].created_at, items[-1].id)
    for item in items:
        await types.of(item.event_id)
    return DeliveryPage(items, types.known, position)


async def count_replayable(
    store: ApiStore, tenant_id: uuid.UUID, flt: DeliveryFilter, *, at_most: int
) -> tuple[int, bool]:
    """How many deliveries a bulk replay of ``flt`` would queue now (those of enabled
    channels), counting to ``at_most`` and reading at most ``COUNT_SCAN_ROWS``; and whether
    there may be more."""
    types = EventTypes(store, tenant_id)
    rows, further = await walk(
        store, tenant_id, flt, None, types, want=at_most, scan_rows=COUNT_SCAN_ROWS
    )
    enabled: dict[uuid.UUID, bool] = {}
    for row in rows:
        if row.channel_id not in enabled:
            channel = await store.get_channel(tenant_id, row.channel_id)
            enabled[row.channel_id] = channel is not None and channel.enabled
    return sum(enabled[r.channel_id] for r in rows), further is not None


def utc_now() -> datetime:
    return datetime.now(UTC)
