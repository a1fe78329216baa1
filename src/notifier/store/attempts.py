"""The store's queries for the workers: the state of deliveries about to be attempted, and the
settling of attempts (with the channels' health), many per statement."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from notifier.store.base import Q, crossing, transaction
from notifier.store.pool import Queries
from notifier.store.rows import AttemptRecord, DeliveryState


class AttemptQueries(Queries):
    """What ``worker.deliveries.BatchedDeliveries`` sends, one batch per call."""

    @crossing
    async def delivery_states(
        self, delivery_ids: Sequence[uuid.UUID]
    ) -> list[DeliveryState | None]:
        """The state of each delivery (None: there is none), with its channel's, in one round
        trip, in the order given."""
        rows = await self._pool.fetch(Q["delivery_states"], list(delivery_ids))
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
        rows = await self._pool.fetch(
            Q["attempt_record_batch"],
            *(list(column) for column in zip(*(
                (r.delivery_id, r.attempt, r.status, r.outcome, r.started_at, r.duration_ms,
                 r.status_code, r.error, r.response_excerpt, r.next_attempt_at, r.disable_channel)
                for r in recs
            ), strict=True)),
            float(disable_after_failing_seconds),
        )  # fmt: skip
        moved = {r["delivery_id"]: r["moved"] for r in rows}
        return [bool(moved.get(r.delivery_id)) for r in recs]
