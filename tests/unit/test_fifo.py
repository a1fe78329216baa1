"""FIFO channels' lines (``worker.fifo``) with the in-memory store and broker, a scripted adapter
and trio's mock clock: the order of the line, whatever order its wake-ups come in; a retrying
head holding the line; DEAD releasing it; the tokens."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import msgspec
import trio
import trio.lowlevel
import trio.testing

from notifier.broker.base import Incoming, Settle
from notifier.broker.topology import (
    FIFO_EXCHANGE,
    FIFO_WAIT_EXCHANGE,
    build_topology,
    fifo_partition,
    fifo_routing_key,
    fifo_wait_queue,
)
from notifier.errors import PermanentError, RetriableError
from notifier.lifecycle import Stop
from notifier.messages import WorkerMessage, decode_message, encode_message
from notifier.metrics import Metrics
from notifier.relay.relay import route
from notifier.store.rows import MetricsSnapshot, OutboxRow
from notifier.testing import Delay, MemoryBroker, RecordingAdapter, worker_message
from notifier.testing.buckets import MemoryBuckets
from notifier.testing.fifo import MemoryFifo
from notifier.worker.decide import RetryPolicy
from notifier.worker.fifo import (
    CC_HEADER,
    LINE_TURN_SECONDS,
    TOKEN_HOLD_SECONDS,
    FifoLines,
    FifoRetries,
)
from notifier.worker.handle import Handler
from tests.unit.test_metrics import families

TIERS = (1, 5, 15, 30)
PARTITIONS = 4
CHANNEL = uuid.UUID(int=8)
OTHER = uuid.UUID(int=9)
# The in-memory store puts the handler's next_attempt_at (the system clock's) on trio's clock as
# the time from its record: the microseconds between the decision and the record are lost.
CLOCKS = 0.01


class Settled:
    """A settle sink keeping each message's settlement by its tag."""

    def __init__(self) -> None:
        self.by_tag: dict[int, Settle] = {}

    def settle(self, delivery_tag: int, how: Settle) -> None:
        assert delivery_tag not in self.by_tag, "settled twice"
        self.by_tag[delivery_tag] = how


class Rig:
    def __init__(
        self, adapter: RecordingAdapter, *, base_seconds: float = 5, concurrency: int = 4
    ) -> None:
        self.store = MemoryFifo()
        self.broker = MemoryBroker()
        self.broker.declare(build_topology(["webhook"], TIERS, "quorum", PARTITIONS))
        self.adapter = adapter
        self.stop = Stop()
        policy = RetryPolicy(base_seconds=base_seconds, max_seconds=30, tiers_seconds=TIERS)
        retries = FifoRetries(self.broker.publish, "webhook", TIERS, PARTITIONS)
        handler = Handler(
            self.store, adapter, retries, timeout_seconds=10, policy=policy,
            limits=MemoryBuckets(),
        )  # fmt: skip
        self.lines = FifoLines(self.store, handler, retries, self.stop, concurrency=concurrency)
        self.settled = Settled()
        self._tag = 0

    def add(self, n: int, channel: uuid.UUID = CHANNEL, **changes: object) -> WorkerMessage:
        m = worker_message(n, channel_id=channel, **changes)
        self.store.add_fifo(m)
        return m

    def wake(self, m: WorkerMessage | bytes) -> int:
        """Hand the lines a message (its wake-up); its tag."""
        self._tag += 1
        body = m if isinstance(m, bytes) else encode_message(m)
        self.lines.take(Incoming(body, None, self._tag, False, self.settled))
        return self._tag

    def delivered(self, channel: uuid.UUID = CHANNEL) -> list[int]:
        """The payload numbers the adapter was called with for ``channel``, in call order."""
        return [m.payload["n"] for m in self.adapter.messages if m.channel_id == channel]

    async def idle(self, *channels: uuid.UUID) -> None:
        with trio.fail_after(3600):
            for c in channels or (CHANNEL,):
                await self.lines.wait_idle(c)


@asynccontextmanager
async def running(rig: Rig) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        await nursery.start(rig.lines.run)
        yield
        nursery.cancel_scope.cancel()


async def test_a_line_goes_in_acceptance_order_whatever_order_its_wakeups_come_in() -> None:
    rig = Rig(RecordingAdapter())
    messages = [rig.add(n) for n in range(1, 7)]
    async with running(rig):
        # the relays published them out of order, and one twice
        tags = [rig.wake(messages[i]) for i in (4, 1, 5, 0, 4, 2, 3)]
        await rig.idle()
    assert rig.delivered() == [1, 2, 3, 4, 5, 6]
    # one line: its token acked when it ended, the others as they came
    assert [rig.settled.by_tag[t] for t in tags] == [Settle.ACK] * len(tags)
    assert {s.status for s in rig.store.states.values()} == {"DELIVERED"}


async def test_two_channels_have_lines_of_their_own() -> None:
    rig = Rig(RecordingAdapter())
    ours = [rig.add(n) for n in (1, 2, 3)]
    theirs = [rig.add(n, OTHER) for n in (11, 12, 13)]
    async with running(rig):
        for a, b in zip(ours[::-1], theirs[::-1], strict=True):
            rig.wake(a)
            rig.wake(b)
        await rig.idle(CHANNEL, OTHER)
    assert rig.delivered(CHANNEL) == [1, 2, 3]
    assert rig.delivered(OTHER) == [11, 12, 13]


async def test_a_retrying_head_holds_the_line_until_its_next_attempt(
    mock_clock: trio.testing.MockClock,
) -> None:
    fails = RetriableError("503 from the receiver", status_code=503)
    rig = Rig(RecordingAdapter("webhook", None, fails))  # 1 delivered, 2 fails once
    messages = [rig.add(n) for n in (1, 2, 3)]
    async with running(rig):
        first = rig.wake(messages[0])
        await rig.idle()
        assert rig.delivered() == [1, 2]  # 3 waits behind the retrying 2
        assert rig.settled.by_tag[first] is Settle.ACK  # the line holds no message meanwhile
        # the handler's retry copy went to the FIFO tier of its backoff (5 s), with CC naming
        # the channel's partition: it comes back there, never to the type's work queue
        [copy] = rig.broker.published
        assert (copy.exchange, copy.routing_key) == (
            FIFO_WAIT_EXCHANGE, fifo_wait_queue("webhook", 5)
        )  # fmt: skip
        partition = fifo_partition(CHANNEL, PARTITIONS)
        assert copy.headers is not None
        assert copy.headers[CC_HEADER] == [fifo_routing_key("webhook", partition)]
        assert decode_message(copy.body).attempt == 2
        # a wake-up before the head's wake-up is back (a new event, a copy) is acked: the
        # one in the tier will come
        early = rig.wake(messages[2])
        await trio.sleep(1)
        assert rig.settled.by_tag[early] is Settle.ACK
        assert rig.delivered() == [1, 2]
        # the tier gives the copy back after 5 s (a moment before the time this process
        # worked out): the line starts at the head's time, in order
        await trio.sleep(3.5)
        back = rig.wake(copy.body)
        await rig.idle()
    assert rig.delivered() == [1, 2, 2, 3]
    assert rig.adapter.called_at[2] - rig.adapter.called_at[1] >= 5 - CLOCKS
    assert rig.settled.by_tag[back] is Settle.ACK
    assert {s.status for s in rig.store.states.values()} == {"DELIVERED"}


async def test_a_head_due_in_a_moment_is_waited_for_in_the_line(
    mock_clock: trio.testing.MockClock,
) -> None:
    fails = RetriableError("503 from the receiver", status_code=503)
    rig = Rig(RecordingAdapter("webhook", fails), base_seconds=1)
    messages = [rig.add(n) for n in (1, 2)]
    async with running(rig):
        started = trio.current_time()
        rig.wake(messages[0])
        await rig.idle()
    assert rig.delivered() == [1, 1, 2]
    assert rig.adapter.called_at[1] - started >= 1 - CLOCKS  # after its backoff
    assert {s.status for s in rig.store.states.values()} == {"DELIVERED"}


async def test_dead_releases_the_line() -> None:
    rig = Rig(RecordingAdapter("webhook", PermanentError("410 gone", status_code=400)))
    messages = [rig.add(1, max_attempts=1), rig.add(2), rig.add(3)]
    async with running(rig):
        rig.wake(messages[1])
        await rig.idle()
    assert rig.delivered() == [1, 2, 3]
    assert [rig.store.states[m.delivery_id].status for m in messages] == [
        "DEAD", "DELIVERED", "DELIVERED",
    ]  # fmt: skip


async def test_a_long_line_swaps_its_token_before_the_broker_would_give_up(
    mock_clock: trio.testing.MockClock,
) -> None:
    # each delivery takes 9 s (within the 10 s timeout): the line outlasts TOKEN_HOLD_SECONDS
    count = int(TOKEN_HOLD_SECONDS // 9) + 3
    rig = Rig(RecordingAdapter("webhook", default=Delay(9)))
    messages = [rig.add(n) for n in range(1, count + 1)]
    async with running(rig):
        token = rig.wake(messages[0])
        # the swap publishes a fresh wake-up straight to the partition, then acks the token
        await trio.sleep(TOKEN_HOLD_SECONDS + 20)  # a delivery's time past the hold
        assert rig.settled.by_tag[token] is Settle.ACK
        [fresh] = rig.broker.published
        partition = fifo_partition(CHANNEL, PARTITIONS)
        assert (fresh.exchange, fresh.routing_key) == (
            FIFO_EXCHANGE, fifo_routing_key("webhook", partition)
        )  # fmt: skip
        second = rig.wake(fresh.body)  # the broker hands it back: the new token
        await rig.idle()
        assert rig.settled.by_tag[second] is Settle.ACK
    assert rig.delivered() == list(range(1, count + 1))


async def test_a_line_that_never_runs_dry_gives_its_turn_up(
    mock_clock: trio.testing.MockClock,
) -> None:
    # one turn for two channels; ours has 20 deliveries of 3 s each, theirs one
    rig = Rig(RecordingAdapter("webhook", default=Delay(3)), concurrency=1)
    ours = [rig.add(n) for n in range(1, 21)]
    [theirs] = [rig.add(100, OTHER)]
    async with running(rig):
        rig.wake(ours[0])
        await trio.lowlevel.checkpoint()
        rig.wake(theirs)
        await rig.idle(CHANNEL, OTHER)
    assert rig.delivered() == list(range(1, 21))
    calls = [m.payload["n"] for m in rig.adapter.messages]
    # theirs went after about LINE_TURN_SECONDS of ours, not after all of ours
    assert calls.index(100) <= LINE_TURN_SECONDS // 3 + 1
    assert calls[-1] == 20


async def test_a_stop_lets_each_line_finish_its_attempt(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(RecordingAdapter("webhook", default=Delay(3)))
    messages = [rig.add(n) for n in (1, 2, 3)]
    async with running(rig):
        token = rig.wake(messages[0])
        await trio.sleep(1)  # the first attempt is under way
        rig.stop.set()
        with trio.fail_after(10):
            await rig.lines.wait_stopped()
    assert rig.delivered() == [1]
    assert rig.store.states[messages[0].delivery_id].status == "DELIVERED"  # recorded
    assert token not in rig.settled.by_tag  # back to the queue with the channel


async def test_an_undecodable_wakeup_is_rejected() -> None:
    rig = Rig(RecordingAdapter())
    async with running(rig):
        tag = rig.wake(b"{not json")
    assert rig.settled.by_tag[tag] is Settle.REJECT
    assert rig.adapter.messages == []


def test_the_memory_line_numbers_like_the_fanout() -> None:
    store = MemoryFifo()
    for n in (3, 1, 2):
        store.add_fifo(worker_message(n, channel_id=CHANNEL))
    assert [m.payload["n"] for m in store.lines[CHANNEL]] == [3, 1, 2]
    assert msgspec.json.decode(encode_message(store.lines[CHANNEL][0]))["attempt"] == 1


def test_the_fifo_lines_furthest_behind_are_rendered() -> None:
    m = Metrics()
    m.scrape_time.snapshot = MetricsSnapshot(
        outbox_depth=0, pending=0, retrying=0, oldest_open_age_seconds=None,
        fifo_lines=(("webhook", str(CHANNEL), 12, 30.5),),
    )  # fmt: skip
    got = families(m)
    labels = {"channel_type": "webhook", "channel_id": str(CHANNEL)}
    assert got["notifier_fifo_lag_seconds"] == [("notifier_fifo_lag_seconds", labels, 30.5)]
    assert got["notifier_fifo_backlog"] == [("notifier_fifo_backlog", labels, 12.0)]
    assert "notifier_fifo_lag_seconds" not in families(Metrics())


def test_the_relay_sends_a_fifo_row_to_its_channels_partition() -> None:
    body = encode_message(worker_message(1, channel_id=CHANNEL))
    row = OutboxRow(id=1, delivery_id=uuid.UUID(int=1), routing_key="webhook.fifo", body=body,
                    created_at=datetime(2024, 1, 1, tzinfo=UTC))  # fmt: skip
    partition = fifo_partition(CHANNEL, PARTITIONS)
    assert route(row, PARTITIONS) == (FIFO_EXCHANGE, fifo_routing_key("webhook", partition))
    ordinary = msgspec.structs.replace(row, routing_key="webhook")
    assert route(ordinary, PARTITIONS) == ("deliveries", "webhook")
    broken = msgspec.structs.replace(row, body=b"{")
    assert route(broken, PARTITIONS) == ("deliveries", "webhook")


def test_fifo_partitions_have_a_single_active_consumer_and_tiers_that_keep_cc() -> None:
    topology = build_topology(["webhook"], (1, 5), "quorum", 2)
    by_name = {q.name: q for q in topology.queues}
    assert {"deliveries.fifo", "deliveries.fifo.wait"} <= set(topology.exchanges)
    partition = by_name["deliveries.webhook.fifo.1"]
    assert partition.arguments["x-single-active-consumer"] is True
    assert (partition.exchange, partition.routing_key) == ("deliveries.fifo", "webhook.fifo.1")
    tier = by_name["deliveries.webhook.fifo.wait.5s"]
    assert tier.arguments["x-message-ttl"] == 5000
    assert tier.arguments["x-dead-letter-exchange"] == "deliveries.fifo"
    assert "x-dead-letter-routing-key" not in tier.arguments  # the message's own keys, CC too
    # without partitions, the topology is the one before FIFO channels
    assert not any(".fifo" in q.name for q in build_topology(["webhook"], (1,), "quorum").queues)
