"""The per-message handler (docs/architecture.md §5) with an in-memory store, broker and reporter
and a scripted adapter; one or more tests per row of the §5 table."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from notifier.adapters.base import Receipt
from notifier.broker.base import Confirm, Incoming, Outgoing, Settle
from notifier.broker.repair import RepairingPublish
from notifier.broker.topology import build_topology, retry_queue, routes_to
from notifier.errors import BrokerError, PermanentError, RetriableError, StoreUnavailable
from notifier.messages import WorkerMessage, decode_message, encode_message
from notifier.ratelimit import Bucket
from notifier.store.rows import AttemptRecord, DeliveryState
from notifier.testing import (
    Delay,
    MemoryBroker,
    MemoryDeliveries,
    PacedAdapter,
    RecordingAdapter,
    RecordingReporter,
    Report,
    worker_message,
)
from notifier.testing.buckets import MemoryBuckets
from notifier.testing.circuits import MemoryCircuits
from notifier.worker.circuit import Breaker, Circuit, CircuitPolicy, State
from notifier.worker.decide import RetryPolicy
from notifier.worker.group import outcome_observers
from notifier.worker.handle import (
    DEADLINE_BACKSTOP_SECONDS,
    STORE_UNAVAILABLE_PAUSE_SECONDS,
    Handler,
)
from notifier.worker.republish import RETRY_PUBLISH_TIMEOUT_SECONDS, Publish

TIMEOUT = 10.0
TIERS = (1, 5, 15, 30)
POLICY = RetryPolicy(base_seconds=1, max_seconds=30, tiers_seconds=TIERS)
SECRET = "whsec_do-not-leak-me"
RETRY_EXCHANGE = "deliveries.retry"


class SettleLog:
    """A settle sink that records ``(delivery_tag, Settle)`` and, at the moment of settling,
    how many attempt rows had been written and messages published (to check the order)."""

    def __init__(self, store: MemoryDeliveries, broker: MemoryBroker) -> None:
        self._store = store
        self._broker = broker
        self.settled: list[tuple[int, Settle]] = []
        self.seen_at_settle: list[tuple[int, int]] = []  # (attempt rows, published)

    def settle(self, delivery_tag: int, how: Settle) -> None:
        self.settled.append((delivery_tag, how))
        self.seen_at_settle.append((len(self._store.attempts), len(self._broker.published)))


def message(n: int = 1, **changes: Any) -> WorkerMessage:
    config = {"url": "https://example.com/hook", "secret": SECRET}
    return worker_message(n, **{"channel_config": config, **changes})


TOPOLOGY = build_topology(["webhook"], TIERS, "quorum")


def routed_broker() -> MemoryBroker:
    broker = MemoryBroker()
    broker.declare(TOPOLOGY)
    return broker


class Rig:
    def __init__(
        self,
        adapter: RecordingAdapter | None = None,
        store: MemoryDeliveries | None = None,
        *,
        broker: MemoryBroker | None = None,
        publish: Publish | None = None,
        circuits: Breaker | None = None,
    ) -> None:
        self.store = store or MemoryDeliveries()
        self.adapter = adapter or RecordingAdapter()
        self.broker = broker or routed_broker()
        self.reporter = RecordingReporter()
        self.buckets = MemoryBuckets()
        self.sink = SettleLog(self.store, self.broker)
        # as the worker group wires it: a returned retry declares its tier again
        self.repairing = RepairingPublish(
            self.broker.publish, self.broker.declare_topology, TOPOLOGY
        )
        self.handler = Handler(
            self.store,
            self.adapter,
            publish or self.repairing,
            timeout_seconds=TIMEOUT,
            policy=POLICY,
            observer=outcome_observers(
                self.adapter.channel_type, reporter=self.reporter, metrics=None
            ),
            limits=self.buckets,
            circuits=circuits,
        )
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


def retry_copy(out: Outgoing) -> WorkerMessage:
    return decode_message(out.body)


def assert_no_secret(report: Report) -> None:
    assert SECRET not in report.summary
    for key, value in report.tags.items():
        assert SECRET not in key
        assert SECRET not in value


def assert_next_attempt_in(
    row: AttemptRecord, tier: int, before: datetime, after: datetime
) -> None:
    assert row.next_attempt_at is not None
    wait = timedelta(seconds=tier)
    assert before + wait <= row.next_attempt_at <= after + wait


# -- rate limited: attempt row rate_limited; retry (tier ≥ wait, attempt unchanged), then Ack ----


@pytest.mark.parametrize(
    ("interval", "elapsed", "tier"),
    [
        (10, 0, 15),  # wait 10 → the 15 s tier
        (10, 7, 5),  # wait 3 → 5 s
        (10, 9.5, 1),  # wait 0.5 → 1 s
        (5, 0, 5),  # wait exactly a tier
        (100, 0, 30),  # longer than the last tier: the last tier
    ],
)
async def test_a_rate_limited_message_goes_to_the_tier_covering_the_wait_unchanged(
    mock_clock: trio.testing.MockClock, interval: float, elapsed: float, tier: int
) -> None:
    rig = Rig(PacedAdapter(interval_seconds=interval))
    first, second = message(1), message(2, attempt=3)
    rig.store.add(first.delivery_id)
    rig.store.add(second.delivery_id, status="RETRYING", attempt=2)
    assert await rig.handle(first) is Settle.ACK  # takes the slot at t=0
    await trio.sleep(elapsed)
    rows_before = len(rig.store.attempts)
    before = datetime.now(UTC)

    assert await rig.handle(second) is Settle.ACK

    after = datetime.now(UTC)
    assert rig.adapter.messages == [first]  # deliver was not called for the second one
    [out] = rig.broker.published
    assert out.exchange == RETRY_EXCHANGE
    assert out.routing_key == f"deliveries.webhook.retry.{tier}s"
    assert out.message_id == str(second.delivery_id)
    assert retry_copy(out) == second  # the same attempt (3), nothing else changed
    assert rig.broker.queues[f"deliveries.webhook.retry.{tier}s"] == [out]
    [row] = rig.store.attempts[rows_before:]
    assert (row.delivery_id, row.attempt, row.outcome, row.status) == (
        second.delivery_id,
        3,
        "rate_limited",
        None,
    )
    assert_next_attempt_in(row, tier, before, after)
    assert rig.store.state(second.delivery_id) == DeliveryState("RETRYING", 2)  # unchanged
    assert second.delivery_id not in rig.store.last_errors
    assert rig.reporter.reports == []
    assert rig.sink.seen_at_settle[-1] == (rows_before + 1, 1)  # published, recorded, then ack


async def test_a_rate_limited_copy_is_delivered_later_without_using_up_an_attempt(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(PacedAdapter(interval_seconds=10))
    first, last = message(1), message(2, attempt=5, max_attempts=5)  # the last attempt
    rig.store.add(first.delivery_id)
    rig.store.add(last.delivery_id, status="RETRYING", attempt=4)
    assert await rig.handle(first) is Settle.ACK

    assert await rig.handle(last) is Settle.ACK  # rate limited, not DEAD

    [out] = rig.broker.published
    copy = retry_copy(out)
    assert copy.attempt == 5
    assert rig.store.state(last.delivery_id) == DeliveryState("RETRYING", 4)
    await trio.sleep(15)  # the tier's TTL
    assert await rig.handle(copy) is Settle.ACK
    assert rig.adapter.messages == [first, copy]
    assert rig.store.state(last.delivery_id) == DeliveryState("DELIVERED", 5)
    assert [r.outcome for r in rig.store.attempts] == ["delivered", "rate_limited", "delivered"]


# -- a channel's own rate limit (rate_limit_per_second, read with the delivery's state) ---------


async def test_a_channels_rate_limit_paces_its_deliveries_without_using_attempts(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig()
    channel_id = uuid.uuid4()
    first, second = message(1, channel_id=channel_id), message(2, channel_id=channel_id)
    for m in (first, second):
        rig.store.add(m.delivery_id, rate_limit_per_second=0.5)  # one every 2 s
    assert await rig.handle(first) is Settle.ACK
    assert await rig.handle(second) is Settle.ACK  # rate limited: to the 5 s tier, attempt 1

    [out] = rig.broker.published
    assert out.routing_key == retry_queue("webhook", 5)
    copy = retry_copy(out)
    assert copy.attempt == 1
    assert rig.store.state(second.delivery_id) == DeliveryState(
        "PENDING", 0, rate_limit_per_second=0.5
    )
    assert rig.buckets.takes == [(f"channel:{channel_id}",)] * 2
    await trio.sleep(5)
    assert await rig.handle(copy) is Settle.ACK
    assert rig.adapter.messages == [first, copy]
    assert [(r.attempt, r.outcome) for r in rig.store.attempts] == [
        (1, "delivered"), (1, "rate_limited"), (1, "delivered"),
    ]  # fmt: skip


async def test_a_refused_take_is_answered_again_without_asking_until_its_time(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig()
    channel_id = uuid.uuid4()
    messages = [message(n, channel_id=channel_id) for n in range(1, 5)]
    for m in messages:
        rig.store.add(m.delivery_id, rate_limit_per_second=0.5)  # one every 2 s
    first, second, third, fourth = messages
    assert await rig.handle(first) is Settle.ACK  # taken
    assert await rig.handle(second) is Settle.ACK  # refused by the buckets: wait 2 s
    await trio.sleep(1.5)
    assert await rig.handle(third) is Settle.ACK  # refused here: 0.5 s left, no statement
    assert len(rig.buckets.takes) == 2
    await trio.sleep(0.5)
    assert await rig.handle(fourth) is Settle.ACK  # its time: the buckets are asked, and give
    assert len(rig.buckets.takes) == 3
    assert rig.adapter.messages == [first, fourth]
    limited = [r for r in rig.store.attempts if r.outcome == "rate_limited"]
    assert [r.delivery_id for r in limited] == [second.delivery_id, third.delivery_id]
    assert limited[1].error == "rate limited: wait 0.5 s"


async def test_channels_are_limited_apart(mock_clock: trio.testing.MockClock) -> None:
    rig = Rig()
    first, second = message(1, channel_id=uuid.uuid4()), message(2, channel_id=uuid.uuid4())
    for m in (first, second):
        rig.store.add(m.delivery_id, rate_limit_per_second=0.5)
    assert await rig.handle(first) is Settle.ACK
    assert await rig.handle(second) is Settle.ACK
    assert rig.adapter.messages == [first, second]


async def test_without_a_limit_no_bucket_is_asked() -> None:
    rig = Rig()
    m = message(1)
    rig.store.add(m.delivery_id)  # no rate_limit_per_second, and the adapter names no bucket
    assert await rig.handle(m) is Settle.ACK
    assert rig.buckets.takes == []


async def test_the_channels_and_the_adapters_buckets_are_taken_together(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(PacedAdapter(interval_seconds=10))
    limited, other = message(1, channel_id=uuid.uuid4()), message(2)
    rig.store.add(limited.delivery_id, rate_limit_per_second=100)
    rig.store.add(other.delivery_id)
    assert await rig.handle(limited) is Settle.ACK
    assert rig.buckets.takes == [(f"channel:{limited.channel_id}", "paced:webhook")]
    assert await rig.handle(other) is Settle.ACK  # the adapter's bucket is empty: rate limited
    assert rig.adapter.messages == [limited]


async def test_a_store_failure_taking_the_buckets_requeues_the_message_after_a_pause(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig()
    m = message(1)
    rig.store.add(m.delivery_id, rate_limit_per_second=1)
    rig.buckets.unavailable = True
    assert await rig.handle(m) is Settle.REQUEUE
    assert trio.current_time() == STORE_UNAVAILABLE_PAUSE_SECONDS
    assert rig.adapter.messages == []
    assert rig.store.attempts == []
    assert rig.reporter.reports == []


async def test_a_limit_in_a_handler_without_buckets_is_a_panic() -> None:
    store = MemoryDeliveries()
    adapter = RecordingAdapter()
    handler = Handler(
        store, adapter, routed_broker().publish, timeout_seconds=TIMEOUT, policy=POLICY
    )
    m = message(1)
    store.add(m.delivery_id, rate_limit_per_second=1)
    sink = SettleLog(store, MemoryBroker())
    await handler.handle(Incoming(encode_message(m), None, 1, False, sink))
    assert sink.settled == [(1, Settle.REJECT)]
    assert adapter.messages == []
    [row] = store.attempts
    assert row.outcome == "panic"


async def test_a_rate_limited_message_whose_retry_publish_fails_is_recorded_and_acked(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(PacedAdapter(interval_seconds=10))
    first, second = message(1), message(2)
    rig.store.add(first.delivery_id)
    rig.store.add(second.delivery_id)
    assert await rig.handle(first) is Settle.ACK
    rig.broker.nack_next = 1

    assert await rig.handle(second) is Settle.ACK

    # the reconciler enqueues it again from its next_attempt_at; status and attempt stay
    assert [(r.delivery_id, r.outcome) for r in rig.store.attempts] == [
        (first.delivery_id, "delivered"), (second.delivery_id, "rate_limited"),
    ]  # fmt: skip
    assert rig.store.attempts[1].next_attempt_at is not None
    assert rig.store.state(second.delivery_id) == DeliveryState("PENDING", 0)
    assert trio.current_time() == 0


# -- the destination's circuit: deferred (attempt row deferred, attempt unchanged) while open ---

CIRCUIT_POLICY = CircuitPolicy(
    failure_threshold=3, probe_base_seconds=5, probe_max_seconds=30, probe_lease_seconds=20
)
DESTINATION = f"channel:{uuid.UUID(int=8)}"  # worker_message's channel; no origin of its own


def breaker_rig(adapter: RecordingAdapter) -> tuple[Rig, MemoryCircuits]:
    circuits = MemoryCircuits()
    return Rig(adapter, circuits=Breaker(circuits, "webhook", CIRCUIT_POLICY)), circuits


async def test_consecutive_timeouts_open_the_circuit_and_defer_without_spending_attempts(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig, circuits = breaker_rig(RecordingAdapter(default=Delay(TIMEOUT + 1)))
    failing = [message(n) for n in range(1, 4)]
    for m in failing:
        rig.store.add(m.delivery_id)
        assert await rig.handle(m) is Settle.ACK  # retry
    assert circuits.circuits[("webhook", DESTINATION)].state is State.OPEN
    opened_at = trio.current_time()
    deferred = message(4, attempt=2)
    rig.store.add(deferred.delivery_id, status="RETRYING", attempt=1)
    rows_before, published_before = len(rig.store.attempts), len(rig.broker.published)
    before = datetime.now(UTC)

    assert await rig.handle(deferred) is Settle.ACK

    after = datetime.now(UTC)
    assert rig.adapter.messages == failing  # not attempted
    assert trio.current_time() == opened_at  # and no time spent on it
    [out] = rig.broker.published[published_before:]
    assert out.routing_key == retry_queue("webhook", 5)  # the tier ≥ the 5 s until the probe
    assert retry_copy(out) == deferred  # the same attempt
    [row] = rig.store.attempts[rows_before:]
    assert (row.attempt, row.outcome, row.status) == (2, "deferred", None)
    assert row.error is not None
    assert "circuit open" in row.error
    assert_next_attempt_in(row, 5, before, after)
    assert rig.store.state(deferred.delivery_id) == DeliveryState("RETRYING", 1)  # unchanged


async def test_the_probe_after_the_wait_closes_the_circuit(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig, circuits = breaker_rig(RecordingAdapter("webhook", *[Delay(TIMEOUT + 1)] * 3))
    for n in range(1, 4):
        rig.store.add(message(n).delivery_id)
        await rig.handle(message(n))
    rig.store.add(message(4).delivery_id)
    await rig.handle(message(4))  # deferred to the 5 s tier
    copy = retry_copy(rig.broker.published[-1])
    await trio.sleep(5)

    assert await rig.handle(copy) is Settle.ACK  # the probe: delivered

    assert rig.adapter.messages[-1] == copy
    assert rig.store.state(copy.delivery_id) == DeliveryState("DELIVERED", 1)
    assert circuits.circuits[("webhook", DESTINATION)] == Circuit()  # closed
    calls = len(circuits.calls)
    rig.store.add(message(5).delivery_id)
    assert await rig.handle(message(5)) is Settle.ACK
    assert rig.store.state(message(5).delivery_id) == DeliveryState("DELIVERED", 1)
    assert len(circuits.calls) == calls  # closed again: no statement


async def test_a_failed_probe_reopens_the_circuit_with_the_interval_doubled(
    mock_clock: trio.testing.MockClock,
) -> None:
    unreachable = RetriableError("connection failed: refused", unreachable=True)
    rig, circuits = breaker_rig(RecordingAdapter(default=unreachable))
    for n in range(1, 4):
        rig.store.add(message(n).delivery_id)
        await rig.handle(message(n))
    await trio.sleep(5)
    rig.store.add(message(4).delivery_id)

    await rig.handle(message(4))  # the probe, refused

    assert len(rig.adapter.messages) == 4
    c = circuits.circuits[("webhook", DESTINATION)]
    assert (c.state, c.probe_interval, c.consecutive_failures) == (State.OPEN, 10, 4)
    rig.store.add(message(5).delivery_id)
    await rig.handle(message(5))
    assert rig.broker.published[-1].routing_key == retry_queue("webhook", 15)  # ≥ 10 s
    assert rig.store.attempts[-1].outcome == "deferred"


async def test_an_answer_is_not_a_circuit_failure(mock_clock: trio.testing.MockClock) -> None:
    server_error = RetriableError("HTTP 503", status_code=503)  # the receiver answered
    rig, circuits = breaker_rig(RecordingAdapter(default=server_error))
    for n in range(1, 6):
        rig.store.add(message(n).delivery_id)
        await rig.handle(message(n))
    assert len(rig.adapter.messages) == 5  # every one attempted
    assert circuits.calls == []  # and the circuit never touched


# -- delivered: DELIVERED + attempt row, Ack ----------------------------------------------------


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
    assert row.next_attempt_at is None
    assert row.duration_ms >= 0
    assert rig.broker.published == []
    assert rig.reporter.reports == []
    assert rig.sink.seen_at_settle == [(1, 0)]  # recorded before the ack


async def test_delivered_without_a_receipt() -> None:
    rig = Rig()
    m = message()
    rig.store.add(m.delivery_id)
    assert await rig.handle(m) is Settle.ACK
    [row] = rig.store.attempts
    assert (row.outcome, row.status_code, row.response_excerpt) == ("delivered", None, None)
    assert rig.broker.published == []


async def test_the_next_attempt_after_a_recorded_one_is_made() -> None:
    rig = Rig()
    m = message(attempt=2)
    rig.store.add(m.delivery_id, status="RETRYING", attempt=1)
    assert await rig.handle(m) is Settle.ACK
    assert rig.adapter.messages == [m]
    assert rig.store.state(m.delivery_id) == DeliveryState("DELIVERED", 2)


# -- retriable with attempts left: publish retry (confirmed), RETRYING + row, then Ack ----------


@pytest.mark.parametrize(
    ("attempt", "tier"),
    [
        (1, 1),  # backoff 1 s
        (2, 5),  # 2 s → the 5 s tier
        (3, 5),  # 4 s
        (4, 15),  # 8 s
        (5, 30),  # 16 s
        (6, 30),  # 32 s capped at 30
    ],
)
async def test_a_retriable_failure_publishes_the_next_attempt_then_records_retrying(
    attempt: int, tier: int
) -> None:
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 503", status_code=503)))
    m = message(attempt=attempt, max_attempts=10)
    rig.store.add(m.delivery_id, status="RETRYING" if attempt > 1 else "PENDING",
                  attempt=attempt - 1)  # fmt: skip
    before = datetime.now(UTC)

    assert await rig.handle(m) is Settle.ACK

    after = datetime.now(UTC)
    [out] = rig.broker.published
    assert (out.exchange, out.routing_key, out.message_id) == (
        RETRY_EXCHANGE,
        f"deliveries.webhook.retry.{tier}s",
        str(m.delivery_id),
    )
    assert retry_copy(out) == msgspec.structs.replace(m, attempt=attempt + 1)
    assert rig.broker.queues[f"deliveries.webhook.retry.{tier}s"] == [out]  # confirmed
    assert rig.store.state(m.delivery_id) == DeliveryState("RETRYING", attempt)
    assert rig.store.last_errors[m.delivery_id] == "HTTP 503"
    [row] = rig.store.attempts
    assert (row.attempt, row.status, row.outcome, row.status_code, row.error) == (
        attempt,
        "RETRYING",
        "retry",
        503,
        "HTTP 503",
    )
    assert_next_attempt_in(row, tier, before, after)
    assert rig.reporter.reports == []
    assert rig.sink.seen_at_settle == [(1, 1)]


@pytest.mark.parametrize(
    ("attempt", "retry_after", "tier"),
    [
        (1, 12, 15),  # backoff 1, retry_after 12 wins → 15 s
        (1, 20, 30),  # → 30 s
        (1, 600, 30),  # beyond the last tier: the last tier
        (4, 2, 15),  # backoff 8 wins over a shorter retry_after (which would be 5 s)
    ],
)
async def test_a_longer_retry_after_picks_the_tier(
    attempt: int, retry_after: float, tier: int
) -> None:
    error = RetriableError("HTTP 429", retry_after=retry_after, status_code=429)
    rig = Rig(RecordingAdapter("webhook", error))
    m = message(attempt=attempt)
    rig.store.add(m.delivery_id, attempt=attempt - 1)

    assert await rig.handle(m) is Settle.ACK

    [out] = rig.broker.published
    assert out.routing_key == f"deliveries.webhook.retry.{tier}s"
    assert retry_copy(out).attempt == attempt + 1
    assert rig.store.state(m.delivery_id) == DeliveryState("RETRYING", attempt)


class SeesThePublish(MemoryDeliveries):
    """Remembers, for each attempt row, what the broker had confirmed when it was written."""

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__()
        self.broker = broker
        self.confirmed_at_record: list[int] = []

    async def record_attempt(self, rec: AttemptRecord) -> bool:
        self.confirmed_at_record.append(sum(len(q) for q in self.broker.queues.values()))
        return await super().record_attempt(rec)


async def test_the_retry_is_confirmed_before_the_attempt_is_recorded() -> None:
    broker = routed_broker()
    store = SeesThePublish(broker)
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 503")), store, broker=broker)
    m = message()
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.ACK

    assert store.confirmed_at_record == [1]


# -- retry publish returned: its tier is declared again -------------------------------------------


async def test_a_returned_retry_declares_its_tier_again_and_goes_on() -> None:
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 503")))
    tier = retry_queue("webhook", 1)  # backoff 1 s after the first attempt
    rig.broker.delete_queue(tier)
    m = message()
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.ACK

    assert rig.broker.declared == [routes_to(TOPOLOGY, RETRY_EXCHANGE, tier)]
    returned, again = rig.broker.published  # the first came back unroutable
    assert returned == again
    assert rig.broker.queues[tier] == [again]  # confirmed this time
    assert retry_copy(again) == msgspec.structs.replace(m, attempt=2)
    [row] = rig.store.attempts
    assert (row.attempt, row.status, row.outcome) == (1, "RETRYING", "retry")
    assert rig.store.state(m.delivery_id) == DeliveryState("RETRYING", 1)
    assert rig.sink.seen_at_settle == [(1, 2)]


# -- retry publish fails: the attempt is recorded, the original acked -----------------------------


async def _raises_broker_error(out: Outgoing) -> Confirm:
    await trio.lowlevel.checkpoint()
    raise BrokerError("channel closed")


async def _never_answers(out: Outgoing) -> Confirm:
    await trio.sleep_forever()
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    "failure",
    ["nacked", "unconfirmed", "returned, the tier cannot be declared", "raises BrokerError",
     "never answers"],
)  # fmt: skip
async def test_a_failed_retry_publish_records_the_attempt_and_acks(
    mock_clock: trio.testing.MockClock, failure: str
) -> None:
    broker = routed_broker()
    publish: Publish | None = None
    if failure == "nacked":
        broker.nack_next = 1
    elif failure == "unconfirmed":
        broker.drop_confirms = True
    elif failure.startswith("returned"):
        broker = MemoryBroker()  # no retry tiers, and no declaring them
        broker.refuse_declares = True
    elif failure == "raises BrokerError":
        publish = _raises_broker_error
    else:
        publish = _never_answers
    rig = Rig(
        RecordingAdapter("webhook", RetriableError("HTTP 503")), broker=broker, publish=publish
    )
    m = message(attempt=2)
    rig.store.add(m.delivery_id, status="RETRYING", attempt=1)
    before = datetime.now(UTC)

    assert await rig.handle(m) is Settle.ACK

    # the receiver was called: that is an attempt, with its next_attempt_at for the reconciler
    assert rig.adapter.messages == [m]
    [row] = rig.store.attempts
    assert (row.attempt, row.status, row.outcome, row.error) == (2, "RETRYING", "retry",
                                                                 "HTTP 503")  # fmt: skip
    assert_next_attempt_in(row, 5, before, datetime.now(UTC))  # backoff 2 s → tier 5 s
    assert rig.store.state(m.delivery_id) == DeliveryState("RETRYING", 2)
    assert rig.reporter.reports == []
    expected_time = RETRY_PUBLISH_TIMEOUT_SECONDS if failure == "never answers" else 0
    assert trio.current_time() == expected_time
    # the original, should the broker hand it out again, does not call the receiver again
    assert await rig.handle(m) is Settle.ACK
    assert rig.adapter.messages == [m]


async def test_a_retry_whose_publish_failed_is_made_when_the_reconciler_sends_it() -> None:
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 503"), None))
    m = message()
    rig.store.add(m.delivery_id)
    rig.broker.nack_next = 1

    assert await rig.handle(m) is Settle.ACK
    # the reconciler's copy: the next attempt (``reconcile`` in queries_maintenance.sql)
    assert await rig.handle(msgspec.structs.replace(m, attempt=2)) is Settle.ACK

    assert [x.attempt for x in rig.adapter.messages] == [1, 2]
    assert rig.store.state(m.delivery_id) == DeliveryState("DELIVERED", 2)


async def test_retries_that_can_never_be_published_wait_for_the_reconciler_and_end_dead(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Every retry publish comes back returned and the tier cannot be declared again. The
    broker redelivers a requeued message at once; the reconciler re-sends an unfinished
    delivery that has no message every ``STUCK`` seconds. The receiver is called once per
    attempt, never faster than the reconciler, and the budget ends the delivery DEAD."""
    stuck = 600.0
    broker = MemoryBroker()
    broker.refuse_declares = True
    rig = Rig(RecordingAdapter("webhook", default=RetriableError("HTTP 500")), broker=broker)
    m = message(max_attempts=3)
    rig.store.add(m.delivery_id)
    queue = [m]
    for _ in range(50):  # far more rounds than a correct run needs
        state = rig.store.state(m.delivery_id)
        assert state is not None
        if state.status in ("DELIVERED", "DEAD"):
            break
        if queue:
            took = queue.pop(0)
            if await rig.handle(took) is Settle.REQUEUE:
                queue.append(took)  # straight back to the head of the queue
        else:
            await trio.sleep(stuck)
            queue.append(msgspec.structs.replace(m, attempt=state.attempt + 1))

    assert [x.attempt for x in rig.adapter.messages] == [1, 2, 3]
    assert rig.adapter.called_at == [0, stuck, 2 * stuck]
    assert [(r.attempt, r.outcome) for r in rig.store.attempts] == [
        (1, "retry"), (2, "retry"), (3, "dead"),
    ]  # fmt: skip
    assert rig.store.state(m.delivery_id) == DeliveryState("DEAD", 3)
    assert [how for _, how in rig.sink.settled] == [Settle.ACK, Settle.ACK, Settle.REJECT]


# -- permanent failure or attempts exhausted: DEAD + row + Sentry, Reject -------------------------


async def test_exhausted_attempts_are_dead_reported_and_rejected() -> None:
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 503", status_code=503)))
    m = message(attempt=5, max_attempts=5)
    rig.store.add(m.delivery_id, status="RETRYING", attempt=4)

    assert await rig.handle(m) is Settle.REJECT

    assert rig.broker.published == []
    assert rig.store.state(m.delivery_id) == DeliveryState("DEAD", 5)
    assert rig.store.last_errors[m.delivery_id] == "HTTP 503"
    [row] = rig.store.attempts
    assert (row.attempt, row.status, row.outcome, row.status_code, row.next_attempt_at) == (
        5,
        "DEAD",
        "dead",
        503,
        None,
    )
    [report] = rig.reporter.reports
    assert report.tags["delivery_id"] == str(m.delivery_id)
    assert report.tags["channel_type"] == "webhook"
    assert report.tags["attempt"] == "5"
    assert "HTTP 503" in report.summary
    assert report.exc is None
    assert_no_secret(report)
    assert rig.sink.seen_at_settle == [(1, 0)]


async def test_a_retry_after_does_not_buy_an_attempt_past_the_budget() -> None:
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 429", retry_after=1)))
    m = message(attempt=3, max_attempts=3)
    rig.store.add(m.delivery_id, status="RETRYING", attempt=2)
    assert await rig.handle(m) is Settle.REJECT
    assert rig.broker.published == []
    assert rig.store.state(m.delivery_id) == DeliveryState("DEAD", 3)


async def test_a_permanent_error_is_dead_reported_and_rejected() -> None:
    rig = Rig(RecordingAdapter("webhook", PermanentError("HTTP 410: gone", status_code=410)))
    m = message()  # attempts left, but a permanent error is never retried
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
    assert rig.broker.published == []
    [report] = rig.reporter.reports
    assert (report.tags["delivery_id"], report.tags["channel_type"], report.tags["attempt"]) == (
        str(m.delivery_id),
        "webhook",
        "1",
    )
    assert "HTTP 410: gone" in report.summary
    assert_no_secret(report)
    assert row.disable_channel is False


@pytest.mark.parametrize("disable", [True, False])
async def test_a_permanent_error_carries_whether_the_channel_is_disabled(disable: bool) -> None:
    error = PermanentError("HTTP 410: gone", status_code=410, disable_channel=disable)
    rig = Rig(RecordingAdapter("webhook", error))
    m = message()
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.REJECT

    [row] = rig.store.attempts
    assert (row.status, row.disable_channel) == ("DEAD", disable)


# -- handler raised (bug, bad JSON, adapter crash): DEAD + panic row + Sentry, Reject; go on ----


async def test_an_adapter_crash_is_a_panic_and_the_next_message_is_delivered() -> None:
    boom = RuntimeError("boom")
    rig = Rig(RecordingAdapter("webhook", boom))
    crashing, fine = message(1), message(2)
    rig.store.add(crashing.delivery_id)
    rig.store.add(fine.delivery_id)

    assert await rig.handle(crashing) is Settle.REJECT
    assert await rig.handle(fine) is Settle.ACK

    assert rig.adapter.messages == [crashing, fine]
    assert rig.broker.published == []
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
    [report] = rig.reporter.reports
    assert report.exc is boom
    assert (report.tags["delivery_id"], report.tags["channel_type"], report.tags["attempt"]) == (
        str(crashing.delivery_id),
        "webhook",
        "1",
    )
    assert report.tags["outcome"] == "panic"
    assert_no_secret(report)


class CrashingLimiter(RecordingAdapter):
    """A ``RateLimiter`` whose ``rate_buckets`` raises once (a bug), then names none."""

    def __init__(self, error: Exception) -> None:
        super().__init__("webhook")
        self.error: Exception | None = error

    def rate_buckets(self, message: WorkerMessage) -> Sequence[Bucket]:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return ()


async def test_a_crashing_rate_limiter_is_a_panic_and_the_next_message_is_delivered() -> None:
    boom = ValueError("limiter bug")
    rig = Rig(CrashingLimiter(boom))
    crashing, fine = message(1), message(2)
    rig.store.add(crashing.delivery_id)
    rig.store.add(fine.delivery_id)

    assert await rig.handle(crashing) is Settle.REJECT
    assert rig.adapter.messages == []  # deliver was not called
    assert await rig.handle(fine) is Settle.ACK

    assert rig.adapter.messages == [fine]
    assert rig.broker.published == []
    first, _ = rig.store.attempts
    assert (first.delivery_id, first.status, first.outcome) == (
        crashing.delivery_id,
        "DEAD",
        "panic",
    )
    assert first.error is not None
    assert "limiter bug" in first.error
    assert rig.store.state(crashing.delivery_id) == DeliveryState("DEAD", 1)
    [report] = rig.reporter.reports
    assert report.exc is boom
    assert report.tags["delivery_id"] == str(crashing.delivery_id)
    assert_no_secret(report)


async def _publish_bug(out: Outgoing) -> Confirm:
    await trio.lowlevel.checkpoint()
    raise KeyError("a bug in the publisher")


async def test_a_bug_in_the_handler_after_decoding_is_dead_with_a_panic_row() -> None:
    # Not a BrokerError: not a refused publish but a bug, so the message goes to the DLQ.
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 503"), None), publish=_publish_bug)
    crashing, fine = message(1), message(2)
    rig.store.add(crashing.delivery_id)
    rig.store.add(fine.delivery_id)

    assert await rig.handle(crashing) is Settle.REJECT
    assert await rig.handle(fine) is Settle.ACK  # the handler goes on

    assert rig.store.state(crashing.delivery_id) == DeliveryState("DEAD", 1)
    first, second = rig.store.attempts
    assert (first.delivery_id, first.attempt, first.status, first.outcome) == (
        crashing.delivery_id,
        1,
        "DEAD",
        "panic",
    )
    assert first.error is not None
    assert "KeyError" in first.error
    assert (second.delivery_id, second.outcome) == (fine.delivery_id, "delivered")
    [report] = rig.reporter.reports
    assert isinstance(report.exc, KeyError)
    assert (report.tags["delivery_id"], report.tags["channel_type"], report.tags["attempt"]) == (
        str(crashing.delivery_id),
        "webhook",
        "1",
    )
    assert_no_secret(report)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",  # not JSON at all
        b"{}",  # JSON, but not a WorkerMessage
        b'{"delivery_id": "nope"}',  # wrong types
        b"[1, 2, 3]",  # JSON of the wrong shape
        b"",  # empty
    ],
)
async def test_an_undecodable_body_is_rejected_reported_and_the_next_message_delivered(
    body: bytes,
) -> None:
    rig = Rig()
    incoming = rig.incoming(body, "whatever")
    await rig.handler.handle(incoming)

    assert rig.sink.settled == [(incoming.delivery_tag, Settle.REJECT)]
    assert rig.adapter.messages == []
    assert rig.store.attempts == []
    assert rig.broker.published == []
    [report] = rig.reporter.reports
    assert isinstance(report.exc, msgspec.DecodeError)
    assert (report.tags["message_id"], report.tags["channel_type"]) == ("whatever", "webhook")

    fine = message()
    rig.store.add(fine.delivery_id)
    assert await rig.handle(fine) is Settle.ACK
    assert rig.adapter.messages == [fine]


# -- duplicates: acked without calling the adapter -----------------------------------------------


@pytest.mark.parametrize("status", ["DELIVERED", "DEAD"])
async def test_a_finished_delivery_is_acked_without_calling_the_adapter(status: str) -> None:
    rig = Rig()
    m = message(attempt=2)
    rig.store.add(m.delivery_id, status=status, attempt=1)

    assert await rig.handle(m) is Settle.ACK

    assert rig.adapter.messages == []
    assert rig.store.attempts == []
    assert rig.broker.published == []
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
    assert rig.broker.published == []
    assert rig.store.state(m.delivery_id) == DeliveryState("RETRYING", stored_attempt)


async def test_a_stale_copy_is_acked_without_asking_the_rate_limiter(
    mock_clock: trio.testing.MockClock,
) -> None:
    paced = PacedAdapter(interval_seconds=10)
    rig = Rig(paced)
    fresh, stale = message(1), message(2, attempt=1)
    rig.store.add(fresh.delivery_id)
    rig.store.add(stale.delivery_id, status="RETRYING", attempt=1)
    assert await rig.handle(fresh) is Settle.ACK
    assert await rig.handle(stale) is Settle.ACK
    assert paced.asked == [fresh]  # never asked about the stale copy: no rate_limited row
    assert rig.buckets.takes == [("paced:webhook",)]
    assert rig.broker.published == []
    assert [r.delivery_id for r in rig.store.attempts] == [fresh.delivery_id]


async def test_an_unknown_delivery_is_acked_without_calling_the_adapter() -> None:
    rig = Rig()
    assert await rig.handle(message()) is Settle.ACK
    assert rig.adapter.messages == []
    assert rig.store.attempts == []
    assert rig.broker.published == []


# -- timeout ------------------------------------------------------------------------------------


async def test_an_adapter_slower_than_the_timeout_is_retried_from_the_timeout(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(RecordingAdapter("webhook", Delay(TIMEOUT * 3)))
    m = message()
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.ACK

    assert trio.current_time() == TIMEOUT
    assert rig.adapter.called_at == [0.0]
    [out] = rig.broker.published
    assert out.routing_key == "deliveries.webhook.retry.1s"  # backoff 1 s after attempt 1
    assert retry_copy(out).attempt == 2
    [row] = rig.store.attempts
    assert (row.outcome, row.status) == ("retry", "RETRYING")
    assert row.error is not None
    assert "timed out" in row.error
    assert "10" in row.error
    assert rig.store.state(m.delivery_id) == DeliveryState("RETRYING", 1)


class DeadlineKeeper(RecordingAdapter):
    """An adapter that ends its attempts itself at ``ends_at`` (``KeepsDeadline``), with an
    error of its own, or overruns when ``ends_at`` is None."""

    keeps_deadline = True

    def __init__(self, ends_at: float | None) -> None:
        super().__init__("webhook")
        self.ends_at = ends_at

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        if self.ends_at is None:
            await trio.sleep_forever()
        await trio.sleep_until(self.ends_at)
        raise RetriableError("timed out after 10 s waiting for the answer")


async def test_an_adapter_keeping_its_deadline_has_its_own_error_recorded(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(DeadlineKeeper(ends_at=TIMEOUT))  # exactly when a plain adapter is cut
    m = message()
    rig.store.add(m.delivery_id)
    assert await rig.handle(m) is Settle.ACK
    [row] = rig.store.attempts
    assert row.error == "timed out after 10 s waiting for the answer"


async def test_an_adapter_keeping_its_deadline_is_still_cut_by_the_backstop(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(DeadlineKeeper(ends_at=None))
    m = message()
    rig.store.add(m.delivery_id)
    assert await rig.handle(m) is Settle.ACK
    assert trio.current_time() == TIMEOUT + DEADLINE_BACKSTOP_SECONDS
    [row] = rig.store.attempts
    assert row.error == f"timed out after {TIMEOUT:g} s"


async def test_a_timeout_on_the_last_attempt_is_dead(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(RecordingAdapter("webhook", Delay(TIMEOUT * 3)))
    m = message(attempt=5, max_attempts=5)
    rig.store.add(m.delivery_id, status="RETRYING", attempt=4)
    assert await rig.handle(m) is Settle.REJECT
    assert trio.current_time() == TIMEOUT
    assert rig.broker.published == []
    assert rig.store.state(m.delivery_id) == DeliveryState("DEAD", 5)
    assert len(rig.reporter.reports) == 1


async def test_an_adapter_just_inside_the_timeout_delivers(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(RecordingAdapter("webhook", Delay(TIMEOUT - 0.5)))
    m = message()
    rig.store.add(m.delivery_id)
    assert await rig.handle(m) is Settle.ACK
    assert trio.current_time() == TIMEOUT - 0.5
    assert rig.store.state(m.delivery_id) == DeliveryState("DELIVERED", 1)
    assert rig.broker.published == []


# -- store unavailable: requeue -----------------------------------------------------------------


async def test_store_unavailable_requeues_after_a_pause_without_calling_the_adapter(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig()
    m = message()
    rig.store.add(m.delivery_id)
    rig.store.unavailable = True

    assert await rig.handle(m) is Settle.REQUEUE

    assert STORE_UNAVAILABLE_PAUSE_SECONDS > 0
    assert trio.current_time() == STORE_UNAVAILABLE_PAUSE_SECONDS
    assert rig.adapter.messages == []
    assert rig.store.attempts == []
    assert rig.broker.published == []
    assert rig.store.state(m.delivery_id) == DeliveryState("PENDING", 0)


class RecordFails(MemoryDeliveries):
    """Answers reads, but Postgres is unreachable when the attempt is recorded."""

    async def record_attempt(self, rec: AttemptRecord) -> bool:
        await trio.lowlevel.checkpoint()
        raise StoreUnavailable("connection lost")


@pytest.mark.parametrize(
    "step",
    [
        None,  # delivered
        RetriableError("HTTP 503"),  # a retry (its copy is already confirmed)
        PermanentError("HTTP 410"),  # dead
    ],
)
async def test_store_unavailable_for_the_record_requeues_and_records_nothing(
    step: Exception | None,
) -> None:
    rig = Rig(RecordingAdapter("webhook", step), RecordFails())
    m = message()
    rig.store.add(m.delivery_id)

    assert await rig.handle(m) is Settle.REQUEUE

    assert rig.adapter.messages == [m]
    assert rig.store.attempts == []
    assert rig.store.state(m.delivery_id) == DeliveryState("PENDING", 0)
    assert rig.reporter.reports == []  # not DEAD, so no Sentry event yet


# -- cancellation -------------------------------------------------------------------------------


async def test_cancellation_propagates_and_leaves_the_message_unsettled(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(RecordingAdapter("webhook", Delay(5)))
    m = message()
    rig.store.add(m.delivery_id)
    with trio.move_on_after(1) as scope:
        await rig.handler.handle(rig.incoming(encode_message(m), str(m.delivery_id)))
        raise AssertionError("handle returned despite the cancellation")
    assert scope.cancelled_caught
    assert trio.current_time() == 1
    assert rig.sink.settled == []
    assert rig.store.attempts == []
    assert rig.broker.published == []
    assert rig.reporter.reports == []


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
