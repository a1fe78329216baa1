"""FIFO channels' lines in memory: ``MemoryDeliveries`` with ``fifo_head`` (``worker.fifo``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec
import trio

from notifier.messages import WorkerMessage, encode_message
from notifier.store.rows import TERMINAL_STATUSES, AttemptRecord, FifoHead
from notifier.testing.deliveries import MemoryDeliveries


class MemoryFifo(MemoryDeliveries):
    """The worker's store with FIFO channels: ``add_fifo`` numbers a channel's deliveries in
    the order they are added, as the fan-out does; ``fifo_head`` answers the lowest unfinished
    one as ``fifo_head`` in ``store/queries_attempts.sql`` does, its wait on trio's clock (a
    recorded ``next_attempt_at`` is taken as that far from the time it was recorded)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[uuid.UUID, list[WorkerMessage]] = {}
        self._due: dict[uuid.UUID, float] = {}  # delivery → when it is due (trio clock)

    def add_fifo(self, message: WorkerMessage) -> None:
        self.add(message.delivery_id, attempt=message.attempt - 1)
        self.lines.setdefault(message.channel_id, []).append(message)

    async def record_attempt(self, rec: AttemptRecord) -> bool:
        moved = await super().record_attempt(rec)
        if rec.next_attempt_at is not None:
            wait = (rec.next_attempt_at - datetime.now(UTC)).total_seconds()
            self._due[rec.delivery_id] = trio.current_time() + max(0.0, wait)
        return moved

    async def fifo_head(self, channel_id: uuid.UUID) -> FifoHead | None:
        await trio.lowlevel.checkpoint()
        self._check()
        for seq, message in enumerate(self.lines.get(channel_id, []), start=1):
            state = self.states[message.delivery_id]
            if state.status in TERMINAL_STATUSES:
                continue
            wait = max(0.0, self._due.get(message.delivery_id, 0.0) - trio.current_time())
            body = encode_message(msgspec.structs.replace(message, attempt=state.attempt + 1))
            return FifoHead(
                delivery_id=message.delivery_id, fifo_seq=seq, wait_seconds=wait, body=body
            )
        return None
