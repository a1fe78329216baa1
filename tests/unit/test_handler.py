"""The per-message handler with an in-memory store and a scripted adapter."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
import trio
import trio.testing

from notifier.adapters.base import Receipt
from notifier.broker.base import Incoming, Settle
from notifier.errors import PermanentError, RetriableError
from notifier.messages import WorkerMessage, encode_message
from notifier.store.rows import AttemptRecord, DeliveryState
from notifier.testing import Delay, MemoryDeliveries, RecordingAdapter
from notifier.worker.handle import Handler

TIMEOUT = 10.0


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class SettleLog:
    """A settle sink that records ``(delivery_tag, Settle)``."""

    def __init__(self) -> None:
        self.settled: list[tuple[int, Settle]] = []

    def settle(self, delivery_tag: int, how: Settle) -> None:
        self.settled.append((delivery_tag, how))


def message(n: int = 1, **changes: Any) -> WorkerMessage:
    fields: dict[str, Any] = {
        "delivery_id": uuid.UUID(int=n),
        "event_id": uuid.UUID(int=1000 + n),
        "tenant_id": uuid.UUID(int=7),
        "channel_id": uuid.UUID(int=8),
        "channel_type": "webhook",
        "channel_config": {"url": "https://example.com/hook"},
        "event_type": "order.created",
        "recipient": None,
        "payload": {"n": n},
        "created_at": datetime(2024, 1, 1, tzinfo=UTC),
        "attempt": 1,
        "max_attempts": 5,
    }
    fields.update(changes)
    return WorkerMessage(**fields)


class Rig:
    def __init__(
        self, adapter: RecordingAdapter | None = None, store: MemoryDeliveries | None = None
    ) -> None:
        self.store = store or MemoryDeliveries()
        self.adapter = adapter or RecordingAdapter()
        self.sink = SettleLog()
        self.handler = Handler(self.store, self.adapter, timeout_seconds=TIMEOUT)
        self._tag = 0

    def incoming(self, body: bytes, message_id: str | None = None) -> Incoming:
        self._tag += 1
        return Incoming(body, message_id, self._tag, False, self.sink)

    async def handle(self, m: WorkerMessage) -> Settle:
        """Handle one message; return how it was settled."""
        incoming = self.incoming(encode_message(m), str(m.delivery_id))
        before = len(self.sink.settled)
        await self.handler.handle(incoming)
        [(tag, how)] = self.sink.settled[before:]  # settled exactly once
        assert tag == incoming.delivery_tag
        return how


async def test_delivered() -> None:
    rig = Rig(RecordingAdapter("webhook", Receipt(status_code=204, response_excerpt="ok")))
    m = message()
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.ACK

    assert rig.adapter.messages == [m]
    assert rig.store.state(m.delivery_id) == DeliveryState("DELIVERED", 1)
    [row] = rig.store.attempts
    assert (row.delivery_id, row.attempt, row.status, row.outcome) == (
        m.delivery_id,
        1,
        "DELIVERED",
        "delivered",
    )
    assert (row.status_code, row.response_excerpt, row.error) == (204, "ok", None)
    assert row.duration_ms >= 0


async def test_delivered_without_a_receipt() -> None:
    rig = Rig()
    m = message()
    rig.store.add(m.delivery_id)
    assert await rig.handle(m) is Settle.ACK
    [row] = rig.store.attempts
    assert (row.outcome, row.status_code, row.response_excerpt) == ("delivered", None, None)


@pytest.mark.parametrize("status", ["DELIVERED", "DEAD"])
async def test_a_finished_delivery_is_acked_without_calling_the_adapter(status: str) -> None:
    rig = Rig()
    m = message(attempt=2)
    rig.store.add(m.delivery_id, status=status, attempt=1)

    assert await rig.handle(m) is Settle.ACK

    assert rig.adapter.messages == []
    assert rig.store.attempts == []
    assert rig.store.state(m.delivery_id) == DeliveryState(status, 1)


@pytest.mark.parametrize(
    ("stored_attempt", "message_attempt"),
    [
        (1, 1),  # the same attempt again (a relay republish or a redelivery after it was made)
        (3, 2),  # an older attempt's copy arriving late
    ],
)
async def test_a_stale_copy_is_acked_without_calling_the_adapter(
    stored_attempt: int, message_attempt: int
) -> None:
    rig = Rig()
    m = message(attempt=message_attempt)
    rig.store.add(m.delivery_id, status="RETRYING", attempt=stored_attempt)

    assert await rig.handle(m) is Settle.ACK

    assert rig.adapter.messages == []
    assert rig.store.attempts == []
    assert rig.store.state(m.delivery_id) == DeliveryState("RETRYING", stored_attempt)


async def test_the_next_attempt_after_a_recorded_one_is_made() -> None:
    rig = Rig()
    m = message(attempt=2)
    rig.store.add(m.delivery_id, status="RETRYING", attempt=1)
    assert await rig.handle(m) is Settle.ACK
    assert rig.adapter.messages == [m]
    assert rig.store.state(m.delivery_id) == DeliveryState("DELIVERED", 2)


async def test_an_unknown_delivery_is_acked_without_calling_the_adapter() -> None:
    rig = Rig()
    assert await rig.handle(message()) is Settle.ACK
    assert rig.adapter.messages == []
    assert rig.store.attempts == []


@pytest.mark.parametrize(
    "body",
    [
        b"not json",  # not JSON at all
        b"{}",  # JSON, but not a WorkerMessage
        b'{"delivery_id": "nope"}',  # wrong types
        b"",  # empty
    ],
)
async def test_an_undecodable_body_is_rejected_without_calling_the_adapter(body: bytes) -> None:
    rig = Rig()
    incoming = rig.incoming(body, "whatever")
    await rig.handler.handle(incoming)
    assert rig.sink.settled == [(incoming.delivery_tag, Settle.REJECT)]
    assert rig.adapter.messages == []
    assert rig.store.attempts == []


async def test_an_adapter_crash_is_a_panic_and_the_next_message_is_delivered() -> None:
    rig = Rig(RecordingAdapter("webhook", RuntimeError("boom")))
    crashing, fine = message(1), message(2)
    rig.store.add(crashing.delivery_id)
    rig.store.add(fine.delivery_id)

    assert await rig.handle(crashing) is Settle.REJECT
    assert await rig.handle(fine) is Settle.ACK

    assert rig.adapter.messages == [crashing, fine]
    first, second = rig.store.attempts
    assert (first.delivery_id, first.outcome, first.status) == (
        crashing.delivery_id,
        "panic",
        "DEAD",
    )
    assert first.error is not None
    assert "RuntimeError" in first.error
    assert "boom" in first.error
    assert rig.store.state(crashing.delivery_id) == DeliveryState("DEAD", 1)
    assert (second.delivery_id, second.outcome) == (fine.delivery_id, "delivered")
    assert rig.store.state(fine.delivery_id) == DeliveryState("DELIVERED", 1)


async def test_an_adapter_slower_than_the_timeout_is_a_failure_at_the_timeout(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(RecordingAdapter("webhook", Delay(TIMEOUT * 3)))
    m = message()
    rig.store.add(m.delivery_id)

    settle = await rig.handle(m)

    assert trio.current_time() == TIMEOUT
    assert rig.adapter.called_at == [0.0]
    [row] = rig.store.attempts
    assert row.outcome != "delivered"
    assert row.error is not None
    assert "timed out" in row.error
    assert "10" in row.error
    # this version of the rules: any failure is DEAD and goes to the DLQ
    assert (row.outcome, row.status, settle) == ("dead", "DEAD", Settle.REJECT)
    assert rig.store.state(m.delivery_id) == DeliveryState("DEAD", 1)


async def test_an_adapter_just_inside_the_timeout_delivers(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(RecordingAdapter("webhook", Delay(TIMEOUT - 0.5)))
    m = message()
    rig.store.add(m.delivery_id)
    assert await rig.handle(m) is Settle.ACK
    assert trio.current_time() == TIMEOUT - 0.5
    assert rig.store.state(m.delivery_id) == DeliveryState("DELIVERED", 1)


async def test_a_permanent_error_is_dead_and_rejected() -> None:
    rig = Rig(RecordingAdapter("webhook", PermanentError("HTTP 410: gone", status_code=410)))
    m = message()
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.REJECT

    [row] = rig.store.attempts
    assert (row.status, row.outcome, row.status_code, row.error) == (
        "DEAD",
        "dead",
        410,
        "HTTP 410: gone",
    )
    assert rig.store.state(m.delivery_id) == DeliveryState("DEAD", 1)
    assert rig.store.last_errors[m.delivery_id] == "HTTP 410: gone"


async def test_a_retriable_error_is_recorded_with_its_status_code() -> None:
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 503", status_code=503)))
    m = message()
    rig.store.add(m.delivery_id)

    settle = await rig.handle(m)

    [row] = rig.store.attempts
    assert (row.status_code, row.error) == (503, "HTTP 503")
    # this version of the rules: any failure is DEAD and goes to the DLQ
    assert (row.status, row.outcome, settle) == ("DEAD", "dead", Settle.REJECT)


async def test_store_unavailable_requeues_without_calling_the_adapter() -> None:
    rig = Rig()
    m = message()
    rig.store.add(m.delivery_id)
    rig.store.unavailable = True

    assert await rig.handle(m) is Settle.REQUEUE

    assert rig.adapter.messages == []
    assert rig.store.attempts == []
    assert rig.store.state(m.delivery_id) == DeliveryState("PENDING", 0)


class GoesDownAfterDelivery(RecordingAdapter):
    """Delivers, and Postgres becomes unreachable while it does."""

    def __init__(self, store: MemoryDeliveries) -> None:
        super().__init__("webhook")
        self.store = store

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        receipt = await super().deliver(message)
        self.store.unavailable = True
        return receipt


async def test_store_unavailable_for_the_record_requeues_and_records_nothing() -> None:
    store = MemoryDeliveries()
    rig = Rig(GoesDownAfterDelivery(store), store)
    m = message()
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.REQUEUE

    assert rig.adapter.messages == [m]
    assert rig.store.attempts == []
    assert rig.store.state(m.delivery_id) == DeliveryState("PENDING", 0)


async def test_cancellation_propagates_and_leaves_the_message_unsettled(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(RecordingAdapter("webhook", Delay(5)))
    m = message()
    rig.store.add(m.delivery_id)
    with trio.move_on_after(1):
        await rig.handler.handle(rig.incoming(encode_message(m), str(m.delivery_id)))
    assert trio.current_time() == 1
    assert rig.sink.settled == []
    assert rig.store.attempts == []


# -- the fake store keeps the SQL's forward-only rule ---------------------------------------------


async def test_memory_deliveries_never_moves_a_finished_delivery_or_an_attempt_back() -> None:
    store = MemoryDeliveries()
    d = uuid.UUID(int=1)
    store.add(d)

    def rec(attempt: int, status: str) -> AttemptRecord:
        return AttemptRecord(
            delivery_id=d,
            attempt=attempt,
            status=status,
            outcome=status.lower(),
            started_at=datetime(2024, 1, 1, tzinfo=UTC),
            duration_ms=1,
        )

    assert await store.record_attempt(rec(2, "RETRYING")) is True
    assert await store.record_attempt(rec(1, "DELIVERED")) is False  # older attempt
    assert await store.delivery_state(d) == DeliveryState("RETRYING", 2)
    assert await store.record_attempt(rec(2, "DEAD")) is True  # the same attempt may settle
    assert await store.record_attempt(rec(3, "DELIVERED")) is False  # DEAD stays DEAD
    assert await store.delivery_state(d) == DeliveryState("DEAD", 2)
    assert [r.attempt for r in store.attempts] == [2, 1, 2, 3]  # every row is kept
    assert (
        await store.record_attempt(
            AttemptRecord(
                delivery_id=uuid.UUID(int=2),
                attempt=1,
                status="DELIVERED",
                outcome="delivered",
                started_at=datetime(2024, 1, 1, tzinfo=UTC),
                duration_ms=1,
            )
        )
        is False
    )  # an unknown delivery: nothing written
    assert len(store.attempts) == 4
