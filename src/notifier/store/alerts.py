"""The store's query for the failure alerts: a dead delivery's channel name and latest attempts
(``notifier.alerts``)."""

from __future__ import annotations

import uuid
from datetime import datetime

from notifier.store.base import Q, Row, crossing
from notifier.store.pool import Queries
from notifier.store.rows import AttemptRow, DeadHistory


class AlertQueries(Queries):
    """What ``notifier.alerts.Alerts`` reads, one statement per alert."""

    @crossing
    async def dead_history(
        self, delivery_id: uuid.UUID, created_at: datetime, channel_id: uuid.UUID, limit: int
    ) -> DeadHistory:
        """The channel's name and the delivery's latest ``limit`` attempts, newest first,
        reading only the partition of ``created_at`` (the delivery's creation, as its message
        says); when that finds no attempt (a wrong day), every partition once more."""
        rows = await self._pool.fetch(Q["dead_history"], delivery_id, created_at, channel_id, limit)
        if rows[0]["attempt"] is None:
            rows = await self._pool.fetch(Q["dead_history"], delivery_id, None, channel_id, limit)
        return DeadHistory(
            channel_name=rows[0]["channel_name"],
            attempts=tuple(_attempt(r) for r in rows if r["attempt"] is not None),
        )


def _attempt(row: Row) -> AttemptRow:
    return AttemptRow(
        attempt=row["attempt"], started_at=row["started_at"], outcome=row["outcome"],
        status_code=row["status_code"], duration_ms=row["duration_ms"], error=row["error"],
    )  # fmt: skip
