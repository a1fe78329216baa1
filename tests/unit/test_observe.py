"""The worker's observation seam: the handler tells an observer exactly one ``Outcome`` per
attempt (and per message that never reached one), with the delivery, the attempt, the duration
of the adapter call and the error; an observer that raises changes nothing about the message."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from notifier.broker.base import Confirm, Incoming, Outgoing, Settle
from notifier.broker.topology import build_topology
from notifier.errors import PermanentError, RetriableError, StoreUnavailable
from notifier.messages import WorkerMessage, encode_message
from notifier.store.rows import AttemptRecord, DeliveryState
from notifier.testing import (
    Delay,
    MemoryBroker,
    MemoryDeliveries,
    PacedAdapter,
    RecordingAdapter,
    RecordingObserver,
    SettleRecorder,
    worker_message,
)
from notifier.testing.buckets import MemoryBuckets
from notifier.worker.decide import RetryPolicy
from notifier.worker.handle import Handler
from notifier.worker.observe import UNDECODABLE, Outcome

POLICY = RetryPolicy(base_seconds=1, max_seconds=30, tiers_seconds=(1, 5, 15, 30))


class Rig:
    def __init__(self, adapter: RecordingAdapter, store: MemoryDeliveries | None = None) -> None:
        self.store = store or MemoryDeliveries()
        self.adapter = adapter
        broker = MemoryBroker()
        broker.declare(build_topology(["webhook"], POLICY.tiers_seconds, "quorum"))
        self.observer = RecordingObserver()
        self.sink = SettleRecorder()
        self.handler = Handler(
            self.store, adapter, broker.publish, timeout_seconds=10, policy=POLICY,
            observer=self.observer, limits=MemoryBuckets(),
        )  # fmt: skip

    async def handle_body(self, body: bytes, message_id: str | None) -> Settle:
        tag = len(self.sink.settled) + 1
        await self.handler.handle(Incoming(body, message_id, tag, False, self.sink))
        return self.sink.settled[-1]

    async def handle(self, m: WorkerMessage) -> Settle:
        return await self.handle_body(encode_message(m), str(m.delivery_id))


def fields(o: Outcome) -> tuple[object, ...]:
    """What an observer of a delivery's attempt reads first."""
    assert o.message is not None
    return (o.message.delivery_id, o.message.attempt, o.outcome, o.status, o.recorded,
            o.duration_ms, o.error)  # fmt: skip


async def test_each_attempt_of_a_delivery_is_one_outcome_with_its_duration(
    mock_clock: trio.testing.MockClock,
) -> None:
    m1 = worker_message(1, max_attempts=2)
    m2 = worker_message(1, max_attempts=2, attempt=2)
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 503"), Delay(0.25)))
    rig.store.add(m1.delivery_id)

    assert await rig.handle(m1) is Settle.ACK  # retry published, then acked
    assert await rig.handle(m2) is Settle.ACK  # delivered

    first, second = rig.observer.outcomes
    assert fields(first) == (m1.delivery_id, 1, "retry", "RETRYING", True, 0, "HTTP 503")
    assert fields(second) == (m1.delivery_id, 2, "delivered", "DELIVERED", True, 250, None)
    for o in (first, second):
        assert (o.channel_type, o.message_id) == ("webhook", str(m1.delivery_id))
        assert (o.exc, o.handler_failed) == (None, False)


async def test_a_delivered_attempt_carries_the_time_the_adapter_took(
    mock_clock: trio.testing.MockClock,
) -> None:
    m = worker_message(1)
    rig = Rig(RecordingAdapter("webhook", Delay(2.5)))
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.ACK

    (o,) = rig.observer.outcomes
    assert o.message == m
    assert fields(o) == (m.delivery_id, 1, "delivered", "DELIVERED", True, 2500, None)


async def test_a_dead_attempt_and_an_adapter_panic_carry_their_error() -> None:
    boom = RuntimeError("adapter bug")
    dead, panicking = worker_message(1), worker_message(2)
    rig = Rig(RecordingAdapter("webhook", PermanentError("HTTP 410: gone"), boom))
    rig.store.add(dead.delivery_id)
    rig.store.add(panicking.delivery_id)

    assert await rig.handle(dead) is Settle.REJECT
    assert await rig.handle(panicking) is Settle.REJECT

    o_dead, o_panic = rig.observer.outcomes
    assert fields(o_dead)[:5] == (dead.delivery_id, 1, "dead", "DEAD", True)
    assert o_dead.error == "HTTP 410: gone"
    assert o_dead.exc is None
    assert fields(o_panic)[:5] == (panicking.delivery_id, 1, "panic", "DEAD", True)
    assert o_panic.exc is boom
    assert o_panic.error == "adapter raised RuntimeError: adapter bug"
    assert not o_panic.handler_failed


async def test_a_rate_limited_attempt_made_no_call(mock_clock: trio.testing.MockClock) -> None:
    rig = Rig(PacedAdapter("webhook", interval_seconds=10))
    first, second = worker_message(1), worker_message(2)
    rig.store.add(first.delivery_id)
    rig.store.add(second.delivery_id)

    await rig.handle(first)
    await rig.handle(second)

    _, limited = rig.observer.outcomes
    assert fields(limited) == (
        second.delivery_id,
        1,
        "rate_limited",
        None,
        True,
        None,
        "rate limited: wait 10 s",
    )


async def test_a_copy_of_an_attempt_already_made_is_no_outcome() -> None:
    m = worker_message(1)
    rig = Rig(RecordingAdapter("webhook"))
    rig.store.add(m.delivery_id, status="DELIVERED", attempt=1)

    assert await rig.handle(m) is Settle.ACK

    assert rig.observer.outcomes == []


class RecordFails(MemoryDeliveries):
    async def record_attempt(self, rec: AttemptRecord) -> bool:
        await trio.lowlevel.checkpoint()
        raise StoreUnavailable("connection lost")


async def test_an_attempt_whose_record_failed_is_one_unrecorded_outcome() -> None:
    m = worker_message(1)
    rig = Rig(RecordingAdapter("webhook", PermanentError("HTTP 410")), RecordFails())
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.REQUEUE

    (o,) = rig.observer.outcomes
    assert (o.outcome, o.status, o.recorded) == ("dead", "DEAD", False)


async def test_an_undecodable_body_is_one_outcome_without_a_delivery() -> None:
    rig = Rig(RecordingAdapter("webhook"))

    assert await rig.handle_body(b"not json", "poison") is Settle.REJECT

    (o,) = rig.observer.outcomes
    assert (o.outcome, o.message, o.message_id, o.recorded) == (UNDECODABLE, None, "poison", False)
    assert o.exc is not None


async def test_a_bug_in_the_handler_is_one_panic_outcome_of_the_handler() -> None:
    async def publish_bug(out: Outgoing) -> Confirm:
        await trio.lowlevel.checkpoint()
        raise KeyError("a bug in the publisher")

    m = worker_message(1)
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 503")))
    rig.handler = Handler(
        rig.store, rig.adapter, publish_bug, timeout_seconds=10, policy=POLICY,
        observer=rig.observer,
    )  # fmt: skip
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.REJECT

    (o,) = rig.observer.outcomes
    assert (o.outcome, o.status, o.recorded, o.handler_failed) == ("panic", "DEAD", True, True)
    assert isinstance(o.exc, KeyError)
    assert o.error is not None
    assert o.error.startswith("handler raised KeyError")
    assert o.duration_ms is None


class Raising:
    def observe(self, outcome: Outcome) -> None:
        raise RuntimeError("observer bug")


@pytest.mark.parametrize("step", [None, PermanentError("HTTP 410")])
async def test_an_observer_that_raises_changes_nothing_about_the_message(
    step: Exception | None,
) -> None:
    m = worker_message(1)
    store = MemoryDeliveries()
    store.add(m.delivery_id)
    sink = SettleRecorder()
    handler = Handler(
        store, RecordingAdapter("webhook", step), MemoryBroker().publish, timeout_seconds=10,
        policy=POLICY, observer=Raising(),
    )  # fmt: skip

    await handler.handle(Incoming(encode_message(m), str(m.delivery_id), 1, False, sink))

    assert sink.settled == [Settle.ACK if step is None else Settle.REJECT]
    (row,) = store.attempts  # one row: no panic row for the observer's failure
    assert row.outcome == ("delivered" if step is None else "dead")
    assert store.state(m.delivery_id) == DeliveryState("DELIVERED" if step is None else "DEAD", 1)
