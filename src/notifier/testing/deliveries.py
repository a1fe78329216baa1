"""The worker's delivery store in memory, with the forward-only status rule."""

from __future__ import annotations

import uuid
from datetime import datetime

import msgspec
import trio

from notifier.errors import StoreUnavailable
from notifier.store.rows import (
    TERMINAL_STATUSES,
    AttemptRecord,
    AttemptRow,
    DeadHistory,
    DeliveryState,
)

# -- in-memory delivery store -------------------------------------------------------------------


class MemoryDeliveries:
    """The worker's ``DeliveryStore`` in memory, with the rule of ``attempt_record_batch`` in
    ``store/queries_attempts.sql``: a delivery's status never leaves ``DELIVERED`` or ``DEAD``
    and its attempt never goes back; the attempt row is kept whenever the delivery exists.

    Set ``unavailable = True`` to make every call raise ``StoreUnavailable`` (Postgres down).
    """

    def __init__(self) -> None:
        self.states: dict[uuid.UUID, DeliveryState] = {}
        self.last_errors: dict[uuid.UUID, str | None] = {}
        self.attempts: list[AttemptRecord] = []  # every attempt row written, in order
        self.channel_names: dict[uuid.UUID, str] = {}  # for dead_history; unnamed: deleted
        self.unavailable = False

    def add(
        self,
        delivery_id: uuid.UUID,
        *,
        status: str = "PENDING",
        attempt: int = 0,
        channel_state: str = "enabled",
        channel_reason: str | None = None,
        rate_limit_per_second: float | None = None,
    ) -> None:
        """Create (or overwrite) a delivery row; ``channel_state`` is its channel's
        (``enabled``, ``disabled`` or ``deleted``), ``rate_limit_per_second`` its limit."""
        self.states[delivery_id] = DeliveryState(
            status, attempt, channel_state, channel_reason, rate_limit_per_second
        )

    def state(self, delivery_id: uuid.UUID) -> DeliveryState | None:
        return self.states.get(delivery_id)

    def _check(self) -> None:
        if self.unavailable:
            raise StoreUnavailable("memory store is unavailable")

    async def delivery_state(
        self, delivery_id: uuid.UUID, created_at: datetime | None = None
    ) -> DeliveryState | None:
        await trio.lowlevel.checkpoint()
        self._check()
        return self.states.get(delivery_id)

    async def record_attempt(self, rec: AttemptRecord) -> bool:
        """Return whether the delivery row moved."""
        await trio.lowlevel.checkpoint()
        self._check()
        current = self.states.get(rec.delivery_id)
        if current is None:
            return False
        self.attempts.append(rec)
        if current.status in TERMINAL_STATUSES or current.attempt > rec.attempt:
            return False
        if rec.status is None:  # rate limited: status, attempt and last error stay
            return True
        self.states[rec.delivery_id] = msgspec.structs.replace(
            current, status=rec.status, attempt=rec.attempt
        )
        self.last_errors[rec.delivery_id] = rec.error
        return True

    async def dead_history(
        self, delivery_id: uuid.UUID, created_at: datetime, channel_id: uuid.UUID, limit: int
    ) -> DeadHistory:
        """The failure alerts' read (``notifier.alerts.AlertHistory``, ``dead_history`` in
        ``store/queries_alerts.sql``): the channel's name and the delivery's latest ``limit``
        attempt rows, newest first."""
        await trio.lowlevel.checkpoint()
        self._check()
        rows = [r for r in self.attempts if r.delivery_id == delivery_id][::-1][:limit]
        return DeadHistory(
            channel_name=self.channel_names.get(channel_id),
            attempts=tuple(
                AttemptRow(
                    attempt=r.attempt,
                    started_at=r.started_at,
                    outcome=r.outcome,
                    status_code=r.status_code,
                    duration_ms=r.duration_ms,
                    error=r.error,
                )
                for r in rows
            ),
        )
