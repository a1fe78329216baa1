"""What the pages read beyond what the API reads: a page of deliveries found by the console's
filters (``notifier.store.console``), and now."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

from notifier.store.api import ApiStore
from notifier.store.console import DeliveryFilter, FoundDelivery


@dataclasses.dataclass(frozen=True)
class DeliveryPage:
    items: list[FoundDelivery]
    next: tuple[datetime, uuid.UUID] | None  # where the next page starts; None: no more


async def find_deliveries(
    store: ApiStore,
    tenant_id: uuid.UUID,
    found_by: DeliveryFilter,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> DeliveryPage:
    """One page of ``limit`` deliveries, newest first, from just before ``before``."""
    rows = await store.find_deliveries(tenant_id, found_by, before=before, limit=limit + 1)
    if len(rows) <= limit:
        return DeliveryPage(rows, None)
    last = rows[limit - 1].delivery
    return DeliveryPage(rows[:limit], (last.created_at, last.id))


def utc_now() -> datetime:
    return datetime.now(UTC)
