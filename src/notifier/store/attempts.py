"""The store's queries for the workers: the state of deliveries about to be attempted, and the
settling of attempts (with the channels' health), many per statement."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from notifier.store.base import Q, Row, crossing, transaction
from notifier.store.pool import Queries
from notifier.store.rows import AttemptRecord, DeliveryState, FifoHead


class AttemptQueries(Queries):
    """What ``worker.deliveries.BatchedDeliveries`` sends, one batch per call."""

    @crossing
    async def delivery_states(
        self, keys: Sequence[tuple[uuid.UUID, datetime | None]]
    ) -> list[DeliveryState | None]:
        """The state of each delivery (None: there is none), with its channel's, in one round
        trip, in the order given. A key is the delivery's id and its created_at when known
        (its message says): then only the partitions of those days are read. One not found so
        is looked for again in every partition, so a wrong day costs time, never a delivery."""
        delivery_ids = [k[0] for k in keys]
        span = _span([k[1] for k in keys])
        rows = await self._pool.fetch(Q["delivery_states"], delivery_ids, *span)
        if span != ANY_TIME and len(rows) < len(set(delivery_ids)):
            seen = {r["id"] for r in rows}
            missing = [i for i in delivery_ids if i not in seen]
            rows = [*rows, *await self._pool.fetch(Q["delivery_states"], missing, *ANY_TIME)]
        found = {
            r["id"]: DeliveryState(
                r["status"],
                r["attempt"],
                r["channel_state"],
                r["disabled_reason"],
                r["rate_limit_per_second"],
                r["replayed_at"],
            )
            for r in rows
        }
        return [found.get(i) for i in delivery_ids]

    @transaction
    async def record_attempts(
        self, recs: Sequence[AttemptRecord], *, disable_after_failing_seconds: float = 0.0
    ) -> list[bool]:
        """Settle attempts in one statement, in the order given: for each, whether its delivery
        moved (False: it had already moved past that attempt). Keeps the channels' health and
        disables a channel failing without a success for longer than
        ``disable_after_failing_seconds`` (0: never)."""
        span = _span([r.created_at for r in recs])
        rows = await self._record(recs, span, disable_after_failing_seconds)
        if span != ANY_TIME and not all(r["found"] for r in rows):
            # A delivery not on the day its message said: looked for in every partition.
            lost = {r["delivery_id"] for r in rows if not r["found"]}
            again = await self._record(
                [r for r in recs if r.delivery_id in lost], ANY_TIME, disable_after_failing_seconds
            )
            rows = [*(r for r in rows if r["found"]), *again]
        moved = {r["delivery_id"]: r["moved"] for r in rows}
        return [bool(moved.get(r.delivery_id)) for r in recs]

    @crossing
    async def fifo_head(self, channel_id: uuid.UUID) -> FifoHead | None:
        """The head of a FIFO channel's line, or None when none of its deliveries is
        unfinished (README "Ordered delivery (FIFO)")."""
        row = await self._pool.fetchrow(Q["fifo_head"], channel_id)
        if row is None:
            return None
        return FifoHead(
            delivery_id=row["id"], fifo_seq=row["fifo_seq"], wait_seconds=row["wait_seconds"],
            body=bytes(row["body"]), traceparent=row["traceparent"],
        )  # fmt: skip

    async def _record(
        self, recs: Sequence[AttemptRecord], span: Span, disable_after: float
    ) -> list[Row]:
        """Asyncio-flavoured. ``attempt_record_batch`` of ``recs``, reading the partitions of
        the days in ``span``."""
        return await self._pool.fetch(
            Q["attempt_record_batch"],
            *(list(column) for column in zip(*(
                (r.delivery_id, r.attempt, r.status, r.outcome, r.started_at, r.duration_ms,
                 r.status_code, r.error, r.response_excerpt, r.next_attempt_at, r.disable_channel)
                for r in recs
            ), strict=True)),
            float(disable_after), *span,
            [r.trace_id for r in recs], [r.span_id for r in recs],
        )  # fmt: skip


Span = tuple[datetime | None, datetime | None]
ANY_TIME: Span = (None, None)  # the statements read every partition


def _span(created: Sequence[datetime | None]) -> Span:
    """Pure. The first and last of the deliveries' creation times, which the statements read
    the history's partitions by; ``ANY_TIME`` when one of them is not known."""
    known = [c for c in created if c is not None]
    if not known or len(known) < len(created):
        return ANY_TIME
    return min(known), max(known)
