"""The worker group's fair share between destinations (docs/architecture.md §5): the pure
bookkeeping as tables, then worker tasks with an in-memory broker, store and a scripted adapter
on trio's mock clock."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import trio
import trio.testing

from notifier.adapters.base import destination_of
from notifier.adapters.webhook import WebhookAdapter
from notifier.broker.base import Incoming, Settle
from notifier.broker.topology import build_topology, retry_queue
from notifier.config import WorkerGroupConfig
from notifier.lifecycle import Stop
from notifier.messages import WorkerMessage, decode_message, encode_message
from notifier.testing import DestinationsAdapter, MemoryBroker, MemoryDeliveries, worker_message
from notifier.worker.decide import RetryPolicy
from notifier.worker.fair import FairDispatch, FairShare, Verdict
from notifier.worker.group import fair_share, worker_task
from notifier.worker.handle import Handler
from notifier.worker.republish import DEFER_FAILED_PAUSE_SECONDS

TIERS = (1, 5, 15, 30, 60, 120)
POLICY = RetryPolicy(base_seconds=1, max_seconds=30, tiers_seconds=TIERS)
TOPOLOGY = build_topology(["webhook"], TIERS, "quorum")
TIER_OF = {retry_queue("webhook", t): t for t in TIERS}
HUNG = "https://hung.example"
HEALTHY = "https://healthy.example"
SLOW = "https://slow.example"
FAST = "https://fast.example"


# -- the bookkeeping ------------------------------------------------------------------------------


def test_a_destination_runs_up_to_its_cap_then_waits_then_is_deferred() -> None:
    share = FairShare[str](cap=2, waiting_per_destination=2, waiting_total=10)
    verdicts = [share.admit("a", f"a{i}", 0.0) for i in range(6)]
    R, W, D = Verdict.RUN, Verdict.WAIT, Verdict.DEFER
    assert verdicts == [R, R, W, W, D, D]
    # another destination is not held by the first one's
    assert share.admit("b", "b0", 0.0) is R
    assert share.statistics().running == 3
    assert share.statistics().waiting == 2


def test_waiting_is_bounded_over_the_whole_group() -> None:
    share = FairShare[str](cap=1, waiting_per_destination=5, waiting_total=3)
    for key in "abc":
        assert share.admit(key, key, 0.0) is Verdict.RUN
    assert [share.admit(key, f"{key}1", 0.0) for key in "abc"] == [Verdict.WAIT] * 3
    assert share.admit("a", "a2", 0.0) is Verdict.DEFER  # the group's 3 are taken
    assert share.admit("d", "d0", 0.0) is Verdict.RUN  # a destination below its cap still runs


def test_no_waiting_when_the_prefetch_leaves_no_room() -> None:
    share = FairShare[str](cap=1, waiting_per_destination=1, waiting_total=0)
    assert share.admit("a", "a0", 0.0) is Verdict.RUN
    assert share.admit("a", "a1", 0.0) is Verdict.DEFER


def test_a_finished_delivery_hands_over_the_destinations_next_waiting_message_in_order() -> None:
    share = FairShare[str](cap=1, waiting_per_destination=3, waiting_total=3)
    for item in ("m0", "m1", "m2"):
        share.admit("a", item, 0.0)
    assert share.finished("a", 0.0, 1.0) == "m1"  # still running: the same slot goes on
    assert share.running("a") == 1
    assert share.finished("a", 1.0, 2.0) == "m2"
    assert share.finished("a", 2.0, 3.0) is None
    assert share.running("a") == 0
    assert share.admit("a", "m3", 0.0) is Verdict.RUN


def test_deferrals_queue_up_behind_each_other_at_the_destinations_pace() -> None:
    share = FairShare[str](cap=2, waiting_per_destination=0, waiting_total=0)
    share.admit("a", "m0", 99.0)
    share.admit("a", "m1", 99.0)
    # not measured yet: the shortest tier, joining no queue
    assert share.defer_seconds("a", 99.0) == 0.0
    assert share.finished("a", 99.0, 100.0) is None  # 1 s a delivery, 2 at a time
    share.admit("a", "m2", 100.0)
    # -> each deferral 0.5 s further back
    assert [share.defer_seconds("a", 100.0) for _ in range(3)] == [0.5, 1.0, 1.5]
    # later, the virtual queue has drained by the time passed
    assert share.defer_seconds("a", 101.25) == pytest.approx(0.75)


def test_a_slow_destinations_deliveries_stretch_its_deferrals() -> None:
    share = FairShare[str](cap=1, waiting_per_destination=0, waiting_total=0)
    share.admit("a", "m0", 0.0)
    for i in range(30):
        share.finished("a", 10.0 * i, 10.0 * (i + 1))
        share.admit("a", "m", 10.0 * (i + 1))
    assert share.defer_seconds("a", 300.0) == pytest.approx(10.0)


def test_a_fast_destination_borrows_idle_tasks_beyond_its_cap() -> None:
    share = FairShare[str](cap=1, waiting_per_destination=1, waiting_total=4)
    assert share.admit("a", "m0", 0.0) is Verdict.RUN
    assert share.finished("a", 0.0, 0.01) is None  # measured: 10 ms, under the threshold
    assert [share.admit("a", f"m{i}", 0.02) for i in range(1, 4)] == [Verdict.RUN] * 3
    assert share.running("a") == 3


def test_a_destination_stops_borrowing_once_a_delivery_of_it_runs_long() -> None:
    share = FairShare[str](cap=1, waiting_per_destination=1, waiting_total=4)
    share.admit("a", "m0", 0.0)
    share.finished("a", 0.0, 0.01)  # fast so far
    assert share.admit("a", "m1", 1.0) is Verdict.RUN
    assert share.admit("a", "m2", 1.5) is Verdict.RUN  # borrowed: m1 is 0.5 s old
    # m1 has run for a second now: the receiver may have hung; back to its cap
    assert share.admit("a", "m3", 2.0) is Verdict.WAIT
    assert share.admit("a", "m4", 2.0) is Verdict.DEFER


def test_a_slow_or_new_destination_never_borrows() -> None:
    share = FairShare[str](cap=1, waiting_per_destination=0, waiting_total=0)
    assert share.admit("new", "m0", 0.0) is Verdict.RUN
    assert share.admit("new", "m1", 0.0) is Verdict.DEFER  # not measured yet
    for i in range(5):
        share.finished("new", 2.0 * i, 2.0 * i + 2.0)  # 2 s each
        share.admit("new", "m", 2.0 * i + 2.0)
    assert share.admit("new", "m9", 10.0) is Verdict.DEFER


def test_give_up_waiting_returns_every_waiting_message_once() -> None:
    share = FairShare[str](cap=1, waiting_per_destination=2, waiting_total=4)
    for key in "ab":
        for i in range(3):
            share.admit(key, f"{key}{i}", 0.0)
    assert sorted(share.give_up_waiting()) == ["a1", "a2", "b1", "b2"]
    assert share.give_up_waiting() == []
    assert share.statistics().waiting == 0
    assert share.finished("a", 0.0, 0.0) is None


@pytest.mark.parametrize(
    ("concurrency", "prefetch", "setting", "cap", "waiting_total"),
    [
        (16, 64, None, 4, 48),  # the default: a quarter of concurrency
        (3, 3, None, 1, 0),  # never below 1; no room left in the prefetch: no waiting
        (8, 32, 8, 8, 24),  # as many as concurrency: no cap at all
    ],
)
def test_the_groups_share_comes_from_its_config(
    concurrency: int, prefetch: int, setting: int | None, cap: int, waiting_total: int
) -> None:
    cfg = WorkerGroupConfig(
        concurrency=concurrency, prefetch=prefetch, max_in_flight_per_destination=setting
    )
    share = fair_share(cfg)
    assert share.cap == cap
    items = [share.admit("a", i, 0.0) for i in range(cap + waiting_total + 1)]
    waited = items.count(Verdict.WAIT)
    assert waited == min(cap, waiting_total)


def test_the_webhooks_destination_is_its_urls_origin() -> None:
    adapter = WebhookAdapter(timeout_seconds=1.0, allow_private_networks=False)

    def dest(url: str) -> str:
        return destination_of(adapter, worker_message(channel_config={"url": url}))

    assert dest("https://Example.COM/a?b=1") == "https://example.com:443"
    assert dest("https://example.com:443/other") == "https://example.com:443"
    assert dest("http://example.com/") == "http://example.com:80"
    assert dest("https://[2606:4700::1111]:8443/x") == "https://[2606:4700::1111]:8443"
    # a URL no attempt could use is a destination of its own: its channel
    channel = uuid.UUID(int=8)
    assert dest("ftp://example.com/") == f"channel:{channel}"


def test_a_type_without_destinations_has_one_per_channel() -> None:
    m = worker_message(channel_type="email", channel_id=uuid.UUID(int=42))
    assert destination_of(object(), m) == f"channel:{uuid.UUID(int=42)}"


# -- worker tasks ---------------------------------------------------------------------------------


class Group:
    """A worker group in memory: ``concurrency`` worker tasks, a consumer that keeps at most
    ``prefetch`` messages unacked, a broker whose delay tiers hand deferred and retried
    messages back after their tier's time, and the handler with an in-memory store."""

    def __init__(
        self, adapter: DestinationsAdapter, *, concurrency: int, prefetch: int, cap: int,
        timeout: float,
    ) -> None:  # fmt: skip
        self.adapter = adapter
        self.store = MemoryDeliveries()
        self.broker = MemoryBroker()
        self.broker.declare(TOPOLOGY)
        self.stop = Stop()
        self.handler = Handler(
            self.store, adapter, self.broker.publish, timeout_seconds=timeout, policy=POLICY
        )
        cfg = WorkerGroupConfig(
            concurrency=concurrency, prefetch=prefetch, max_in_flight_per_destination=cap
        )
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.dispatch = FairDispatch(self.handler, adapter, fair_share(cfg), self.stop)
        self.queue: list[bytes] = []  # the main queue
        self.unacked = 0
        self.settled: list[Settle] = []
        self.changed = trio.Event()
        self._tag = 0

    def settle(self, delivery_tag: int, how: Settle) -> None:
        self.unacked -= 1
        self.settled.append(how)
        self.changed.set()

    def enqueue(self, url: str, n: int) -> WorkerMessage:
        m = worker_message(n, channel_config={"url": url}, channel_id=uuid.UUID(int=n))
        self.store.add(m.delivery_id)
        self.queue.append(encode_message(m))
        self.changed.set()
        return m

    async def _consume(self, send: trio.MemorySendChannel[Incoming]) -> None:
        while True:
            while self.queue and self.unacked < self.prefetch:
                self._tag += 1
                self.unacked += 1
                await send.send(Incoming(self.queue.pop(0), None, self._tag, False, self))
            self.changed = trio.Event()
            await self.changed.wait()

    async def _tiers(self) -> None:
        """Each message published to a delay tier comes back to the main queue after it."""
        seen = 0
        while True:
            await trio.sleep(0.05)
            for out in self.broker.published[seen:]:
                self._return_after(out.body, TIER_OF[out.routing_key])
            seen = len(self.broker.published)

    def _return_after(self, body: bytes, seconds: float) -> None:
        async def back() -> None:
            await trio.sleep(seconds)
            self.queue.append(body)
            self.changed.set()

        self._nursery.start_soon(back)

    async def run(self, seconds: float) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            send, receive = trio.open_memory_channel[Incoming](self.prefetch)
            nursery.start_soon(self._consume, send)
            nursery.start_soon(self._tiers)
            for _ in range(self.concurrency):
                nursery.start_soon(worker_task, receive, self.dispatch, self.stop)
            await trio.sleep(seconds)
            nursery.cancel_scope.cancel()

    def deferred(self) -> list[WorkerMessage]:
        """The messages sent through a tier at their own attempt (deferred, not retried)."""
        copies = [decode_message(out.body) for out in self.broker.published]
        return [m for m in copies if m.attempt == 1]


async def test_a_hung_receiver_does_not_delay_a_healthy_one_of_the_same_type(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The trial's numbers: concurrency 8, timeout 3 s; 40 deliveries to a receiver that never
    # answers, then 40 to a healthy one.
    adapter = DestinationsAdapter({HUNG: 3600.0, HEALTHY: 0.05})
    group = Group(adapter, concurrency=8, prefetch=32, cap=2, timeout=3.0)
    hung = [group.enqueue(HUNG, n) for n in range(40)]
    healthy = [group.enqueue(HEALTHY, 100 + n) for n in range(40)]
    start = trio.current_time()
    await group.run(60.0)

    done = adapter.finished_at[HEALTHY]
    assert len(done) == len(healthy)
    # every healthy delivery was made well within 2 s, never behind the hung receiver's 3 s
    # timeouts (the trial measured 14.5 s each): the first ones at once, the rest of its burst
    # once it was measured fast, after the shortest tier
    assert max(done) - start < 2.0
    assert adapter.most_running[HUNG] == 2  # its share, and no more
    # what did not fit went through a delay tier at its own attempt: no attempt row for it
    deferred = {m.delivery_id for m in group.deferred()}
    assert deferred & {m.delivery_id for m in hung}
    delivered = [r.delivery_id for r in group.store.attempts if r.outcome == "delivered"]
    assert sorted(delivered) == sorted(m.delivery_id for m in healthy)  # once each
    outcomes = {rec.outcome for rec in group.store.attempts}
    assert outcomes <= {"delivered", "retry", "dead"}  # timeouts; a deferral writes no row
    recorded_hung = [r for r in group.store.attempts if r.outcome != "delivered"]
    # only attempts that called the receiver were recorded: 2 at a time, each 3 s
    assert len(recorded_hung) == len(
        [m for m in adapter.messages if adapter.destination(m) == HUNG]
    )


async def test_a_slow_receiver_gets_its_share_while_a_fast_one_is_not_delayed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    adapter = DestinationsAdapter({SLOW: 2.0, FAST: 0.01})
    group = Group(adapter, concurrency=8, prefetch=32, cap=2, timeout=10.0)
    slow = [group.enqueue(SLOW, n) for n in range(20)]
    fast = []
    for n in range(200):
        fast.append(group.enqueue(FAST, 1000 + n))
    start = trio.current_time()
    await group.run(120.0)

    # the fast receiver: every delivery made, at its own pace (200 at 2 at a time, 10 ms each
    # = 1 s), never waiting behind the slow one's 2 s answers
    assert len(adapter.finished_at[FAST]) == len(fast)
    assert max(adapter.finished_at[FAST]) - start < 2.0
    # the slow one kept its share busy: 2 at a time until its backlog was done, every message
    # delivered once, none failed
    assert adapter.most_running[SLOW] == 2
    assert len(adapter.finished_at[SLOW]) == len(slow)
    assert all(rec.outcome == "delivered" for rec in group.store.attempts)
    assert len(group.store.attempts) == len(slow) + len(fast)
    # its deferrals were spread over the tiers at its pace, not bounced through the shortest
    # one every second: a few per message over its ~20 s backlog
    slow_ids = {m.delivery_id for m in slow}
    assert len([m for m in group.deferred() if m.delivery_id in slow_ids]) < 4 * len(slow)


async def test_stopping_hands_waiting_messages_back_untouched(
    autojump_clock: trio.testing.MockClock,
) -> None:
    adapter = DestinationsAdapter({SLOW: 5.0})
    group = Group(adapter, concurrency=4, prefetch=16, cap=1, timeout=10.0)
    for n in range(3):
        group.enqueue(SLOW, n)

    async def stop_soon() -> None:
        await trio.sleep(1.0)
        group.stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_soon)
        nursery.start_soon(group.run, 20.0)
    # the one delivery under way finished (acked); the one waiting went back to the queue
    # unattempted (requeued); the third had been deferred through a tier (acked once its copy
    # was published)
    assert len(adapter.finished_at[SLOW]) == 1
    assert len(adapter.messages) == 1
    assert sorted(s.value for s in group.settled) == ["ack", "ack", "requeue"]
    assert len(group.deferred()) == 1


def test_the_dispatch_falls_back_to_the_channel_when_naming_a_destination_fails() -> None:
    class Broken(DestinationsAdapter):
        def destination(self, message: WorkerMessage) -> str:
            raise RuntimeError("bug")

    adapter = Broken({})
    handler = Handler(
        MemoryDeliveries(), adapter, MemoryBroker().publish, timeout_seconds=1, policy=POLICY
    )
    share = FairShare[Any](cap=1, waiting_per_destination=0, waiting_total=0)
    dispatch = FairDispatch(handler, adapter, share, Stop())
    m = worker_message(channel_id=uuid.UUID(int=9))
    assert dispatch.destination(m) == f"channel:{uuid.UUID(int=9)}"


# -- Handler.defer --------------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.settled: list[Settle] = []

    def settle(self, delivery_tag: int, how: Settle) -> None:
        self.settled.append(how)


@pytest.mark.parametrize(("seconds", "tier"), [(0.0, 1), (1.0, 1), (4.2, 5), (999.0, 120)])
async def test_a_deferred_message_goes_to_the_tier_covering_its_wait_at_the_same_attempt(
    seconds: float, tier: int
) -> None:
    store, broker, sink = MemoryDeliveries(), MemoryBroker(), Sink()
    broker.declare(TOPOLOGY)
    handler = Handler(store, DestinationsAdapter({}), broker.publish, timeout_seconds=1,
                      policy=POLICY)  # fmt: skip
    m = worker_message(3, attempt=2)
    store.add(m.delivery_id, status="RETRYING", attempt=1)
    body = encode_message(m)
    await handler.defer(Incoming(body, "x", 1, False, sink), m, seconds, destination=HUNG)
    [out] = broker.published
    assert (out.routing_key, out.body) == (retry_queue("webhook", tier), body)  # unchanged
    assert sink.settled == [Settle.ACK]
    assert store.attempts == []  # no attempt, no row
    assert store.state(m.delivery_id) == store.states[m.delivery_id]  # untouched


async def test_a_deferral_the_broker_does_not_take_is_requeued_after_a_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker, sink = MemoryBroker(), Sink()  # no topology: the tier is not routable
    handler = Handler(MemoryDeliveries(), DestinationsAdapter({}), broker.publish,
                      timeout_seconds=1, policy=POLICY)  # fmt: skip
    m = worker_message(4)
    start = trio.current_time()
    await handler.defer(Incoming(encode_message(m), "x", 1, False, sink), m, 1.0, destination=HUNG)
    assert sink.settled == [Settle.REQUEUE]
    assert trio.current_time() - start == DEFER_FAILED_PAUSE_SECONDS


async def test_a_worker_task_takes_what_waits_and_nothing_once_stopped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    adapter = DestinationsAdapter({HEALTHY: 0.0})
    group = Group(adapter, concurrency=1, prefetch=8, cap=1, timeout=3.0)
    send, receive = trio.open_memory_channel[Incoming](8)
    first = [group.enqueue(HEALTHY, n) for n in range(3)]
    for tag, body in enumerate(group.queue, start=1):  # already waiting when the task starts
        send.send_nowait(Incoming(body, None, tag, False, group))
    group.queue.clear()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker_task, receive, group.dispatch, group.stop)
        with trio.fail_after(5):
            while len(group.settled) < len(first):
                await group.changed.wait()
                group.changed = trio.Event()
        # the channel is empty: the task waits on it, and a stop ends that wait
        group.stop.set()
    assert [m.delivery_id for m in adapter.messages] == [m.delivery_id for m in first]
    # once stopped, a message that arrives is left for the channel's close to hand back
    late = group.enqueue(HEALTHY, 9)
    send.send_nowait(Incoming(group.queue.pop(), None, 9, False, group))
    with trio.fail_after(5):
        await worker_task(receive, group.dispatch, group.stop)
    assert late.delivery_id not in [m.delivery_id for m in adapter.messages]
    assert group.settled == [Settle.ACK] * 3
