"""The outbox relay over the in-memory outbox and broker: claim → publish → delete."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
import trio
import trio.testing

from notifier.broker.base import Confirm, Outgoing
from notifier.errors import BrokerError
from notifier.lifecycle import Stop
from notifier.relay.relay import relay_loop, relay_once
from notifier.store.rows import OutboxRow
from notifier.testing import MemoryBroker, MemoryOutbox

POLL = 1.0


def delivery(n: int) -> uuid.UUID:
    return uuid.UUID(int=n)


def broker() -> MemoryBroker:
    b = MemoryBroker()
    b.bind("deliveries", "webhook", "deliveries.webhook")
    return b


class TimedBroker(MemoryBroker):
    """Notes the trio time of every non-empty publish and lets a test wait for the next one."""

    def __init__(self) -> None:
        super().__init__()
        self.bind("deliveries", "webhook", "deliveries.webhook")
        self.published_at: list[float] = []
        self._published = trio.Event()

    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        self.published_at.append(trio.current_time())
        results = await super().publish_batch(messages)
        self._published.set()
        self._published = trio.Event()
        return results

    async def wait_published(self) -> None:
        await self._published.wait()


class SilentFor(MemoryBroker):
    """A broker whose confirms for the given message ids never arrive (the rest are normal)."""

    def __init__(self, silent: set[str]) -> None:
        super().__init__()
        self.bind("deliveries", "webhook", "deliveries.webhook")
        self.silent = silent

    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        results = await super().publish_batch(messages)
        return [
            Confirm.UNCONFIRMED if m.message_id in self.silent else c
            for m, c in zip(messages, results, strict=True)
        ]


class BlocksUnder(TimedBroker):
    """A broker that raises an alarm while the next batch is in flight: the batch goes
    unconfirmed and the connection stays blocked until ``unblock()``."""

    def __init__(self) -> None:
        super().__init__()
        self.block_next = True

    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        if self.block_next:
            self.block_next = False
            self.block()
        return await super().publish_batch(messages)


# -- relay_once ---------------------------------------------------------------------------------


async def test_claims_publishes_and_deletes() -> None:
    outbox, mq = MemoryOutbox(), broker()
    outbox.add(delivery(1), "webhook", b"one")
    outbox.add(delivery(2), "webhook", b"two")

    assert await relay_once(outbox, mq, batch_size=10) == 2

    assert mq.published == [
        Outgoing("deliveries", "webhook", b"one", str(delivery(1))),
        Outgoing("deliveries", "webhook", b"two", str(delivery(2))),
    ]
    assert mq.queues["deliveries.webhook"] == mq.published
    assert outbox.rows == {}
    assert outbox.refused == {}


async def test_an_empty_outbox_publishes_nothing() -> None:
    outbox, mq = MemoryOutbox(), broker()
    assert await relay_once(outbox, mq, batch_size=10) == 0
    assert mq.published == []


async def test_claims_at_most_batch_size_rows_in_id_order() -> None:
    outbox, mq = MemoryOutbox(), broker()
    ids = [outbox.add(delivery(n), "webhook", b"") for n in range(5)]

    assert await relay_once(outbox, mq, batch_size=3) == 3

    assert [m.message_id for m in mq.published] == [str(delivery(n)) for n in range(3)]
    assert sorted(outbox.rows) == ids[3:]


async def test_a_returned_message_keeps_its_row_and_the_refusal_is_recorded() -> None:
    outbox, mq = MemoryOutbox(), broker()
    first = outbox.add(delivery(1), "webhook", b"")
    lost = outbox.add(delivery(2), "telegram", b"")  # no queue is bound for it
    last = outbox.add(delivery(3), "webhook", b"")

    assert await relay_once(outbox, mq, batch_size=10) == 3

    assert sorted(outbox.rows) == [lost]
    assert list(outbox.refused) == [lost]
    assert "returned" in outbox.refused[lost]
    assert "'telegram'" in outbox.refused[lost]
    assert first not in outbox.refused
    assert last not in outbox.refused
    assert [m.message_id for m in mq.queues["deliveries.webhook"]] == [
        str(delivery(1)),
        str(delivery(3)),
    ]


async def test_a_nacked_message_keeps_its_row_and_the_refusal_is_recorded() -> None:
    outbox, mq = MemoryOutbox(), broker()
    nacked = outbox.add(delivery(1), "webhook", b"")
    outbox.add(delivery(2), "webhook", b"")
    mq.nack_next = 1

    assert await relay_once(outbox, mq, batch_size=10) == 2

    assert sorted(outbox.rows) == [nacked]
    assert list(outbox.refused) == [nacked]
    assert "nacked" in outbox.refused[nacked]


async def test_a_refused_row_is_published_again_and_then_deleted() -> None:
    outbox, mq = MemoryOutbox(), broker()
    row = outbox.add(delivery(1), "webhook", b"")
    mq.nack_next = 1
    await relay_once(outbox, mq, batch_size=10)
    assert row in outbox.refused

    assert await relay_once(outbox, mq, batch_size=10) == 1

    assert outbox.rows == {}
    assert outbox.refused == {}
    assert len(mq.published) == 2


async def test_unconfirmed_publishes_keep_their_rows_and_raise() -> None:
    outbox, mq = MemoryOutbox(), broker()
    outbox.add(delivery(1), "webhook", b"")
    outbox.add(delivery(2), "webhook", b"")
    mq.drop_confirms = True

    with pytest.raises(BrokerError, match="2 publishes were not confirmed"):
        await relay_once(outbox, mq, batch_size=10)

    assert len(outbox.rows) == 2
    assert outbox.refused == {}  # not a refusal: it may have landed, so it goes again as it is


async def test_confirmed_rows_are_deleted_before_unconfirmed_ones_raise() -> None:
    outbox = MemoryOutbox()
    mq = SilentFor({str(delivery(2))})
    outbox.add(delivery(1), "webhook", b"")
    silent = outbox.add(delivery(2), "webhook", b"")
    outbox.add(delivery(3), "webhook", b"")

    with pytest.raises(BrokerError, match="1 publishes were not confirmed"):
        await relay_once(outbox, mq, batch_size=10)

    assert sorted(outbox.rows) == [silent]
    assert outbox.refused == {}


async def test_unconfirmed_publishes_on_a_closed_broker_raise_its_error() -> None:
    outbox, mq = MemoryOutbox(), broker()
    outbox.add(delivery(1), "webhook", b"")
    mq.drop_confirms = True
    mq.closed = True

    with pytest.raises(BrokerError, match="memory broker closed"):
        await relay_once(outbox, mq, batch_size=10)
    assert len(outbox.rows) == 1


async def test_two_rows_of_one_delivery_are_published_in_the_same_batch() -> None:
    """Rows of one delivery share a message id; the publisher keeps such copies apart (see
    ``broker.amqp.id_rounds``), so the relay just publishes them."""
    outbox, mq = MemoryOutbox(), broker()
    outbox.add(delivery(1), "webhook", b"first")
    outbox.add(delivery(1), "webhook", b"second")
    outbox.add(delivery(2), "webhook", b"other")

    assert await relay_once(outbox, mq, batch_size=10) == 3

    assert [m.body for m in mq.published] == [b"first", b"second", b"other"]
    assert outbox.rows == {}


async def test_concurrent_relays_never_publish_a_row_twice() -> None:
    outbox, mq = MemoryOutbox(), broker()
    for n in range(25):
        outbox.add(delivery(n), "webhook", str(n).encode())
    claimed: list[int] = []

    async def relay() -> None:
        while n := await relay_once(outbox, mq, batch_size=4):
            claimed.append(n)

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(relay)

    ids = [m.message_id for m in mq.published]
    assert sorted(ids) == sorted(str(delivery(n)) for n in range(25))
    assert len(ids) == len(set(ids))
    assert sum(claimed) == 25
    assert outbox.rows == {}


async def test_two_concurrent_relays_over_one_small_outbox_share_it() -> None:
    outbox, mq = MemoryOutbox(), broker()
    for n in range(3):
        outbox.add(delivery(n), "webhook", b"")
    counts: list[int] = []

    async def relay() -> None:
        counts.append(await relay_once(outbox, mq, batch_size=10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay)
        nursery.start_soon(relay)

    assert sorted(counts) == [0, 3]
    assert len(mq.published) == 3


# -- relay_loop ---------------------------------------------------------------------------------


async def test_loop_returns_promptly_after_stop(mock_clock: trio.testing.MockClock) -> None:
    outbox, mq, stop = MemoryOutbox(), broker(), Stop()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop)
        await trio.sleep(0.25)
        stop.set()
    assert trio.current_time() == 0.25


async def test_loop_relays_what_is_waiting_at_start(mock_clock: trio.testing.MockClock) -> None:
    outbox, mq, stop = MemoryOutbox(), TimedBroker(), Stop()
    outbox.add(delivery(1), "webhook", b"")
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop)
        if not mq.published:
            await mq.wait_published()
        stop.set()
    assert mq.published_at == [0.0]
    assert outbox.rows == {}


async def test_loop_wakes_on_the_doorbell_without_waiting_for_the_poll(
    mock_clock: trio.testing.MockClock,
) -> None:
    outbox, mq, stop = MemoryOutbox(), TimedBroker(), Stop()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop)
        await trio.sleep(0.3)
        outbox.add(delivery(1), "webhook", b"")  # rings the doorbell
        await mq.wait_published()
        assert trio.current_time() == 0.3
        stop.set()
    assert mq.published_at == [0.3]
    assert outbox.rows == {}


async def test_loop_polls_for_a_row_added_without_ringing(
    mock_clock: trio.testing.MockClock,
) -> None:
    outbox, mq, stop = MemoryOutbox(), TimedBroker(), Stop()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop)
        await trio.sleep(0.3)
        # committed, but its NOTIFY never came: only the poll finds it
        outbox.rows[100] = OutboxRow(100, delivery(1), "webhook", b"", datetime.now(UTC))
        await mq.wait_published()
        assert trio.current_time() == POLL
        stop.set()
    assert mq.published_at == [POLL]
    assert outbox.rows == {}


async def test_loop_goes_on_at_once_while_batches_are_full(
    mock_clock: trio.testing.MockClock,
) -> None:
    outbox, mq, stop = MemoryOutbox(), TimedBroker(), Stop()
    for n in range(5):
        outbox.add(delivery(n), "webhook", b"")
    outbox.bell.clear()  # nothing rings: only full batches keep the loop from waiting
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop, 2)
        while len(mq.published) < 5:
            await mq.wait_published()
        stop.set()  # the batch in hand is finished (its rows deleted) before the loop returns
    assert mq.published_at == [0.0, 0.0, 0.0]
    assert len(mq.published) == 5
    assert outbox.rows == {}


async def test_loop_raises_when_publishes_go_unconfirmed(
    mock_clock: trio.testing.MockClock,
) -> None:
    outbox, mq, stop = MemoryOutbox(), broker(), Stop()
    outbox.add(delivery(1), "webhook", b"")
    mq.drop_confirms = True
    with pytest.raises(BrokerError):
        await relay_loop(outbox, mq, stop, batch_size=10, poll_interval_seconds=POLL)
    assert len(outbox.rows) == 1


async def test_loop_claims_nothing_while_the_broker_blocks_publishing(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    outbox, mq, stop = MemoryOutbox(), TimedBroker(), Stop()
    outbox.add(delivery(1), "webhook", b"")
    mq.block()  # a memory alarm: publishes would only time out
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop)
        await trio.sleep(30)
        assert (mq.published, len(outbox.rows)) == ([], 1)
        mq.unblock()
        await mq.wait_published()
        stop.set()
    assert mq.published_at == [30.0]  # at once when the block lifted
    assert outbox.rows == {}
    assert [r.getMessage() for r in caplog.records if r.name == "notifier.relay"] == [
        "the broker is blocking publishes (a memory or disk alarm); the relay waits",
        "the broker accepts publishes again; the relay goes on",
    ]


def blocked_with_one_row() -> tuple[MemoryOutbox, MemoryBroker, Stop]:
    """An outbox with one row, a broker blocking publishes, a stop not yet requested."""
    outbox, mq = MemoryOutbox(), broker()
    outbox.add(delivery(1), "webhook", b"")
    mq.block()
    return outbox, mq, Stop()


async def test_loop_stops_promptly_while_the_broker_blocks_publishing(
    mock_clock: trio.testing.MockClock,
) -> None:
    outbox, mq, stop = blocked_with_one_row()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop)
        await trio.sleep(5)
        stop.set()
    assert trio.current_time() == 5.0
    assert (mq.published, len(outbox.rows)) == ([], 1)


async def test_loop_fails_when_the_connection_is_lost_while_blocked(
    mock_clock: trio.testing.MockClock,
) -> None:
    outbox, mq, stop = blocked_with_one_row()

    async def lose_the_connection() -> None:
        await trio.sleep(10)
        mq.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lose_the_connection)
        with pytest.raises(BrokerError, match="closed"):
            await relay_loop(outbox, mq, stop, batch_size=10, poll_interval_seconds=POLL)
    assert trio.current_time() == 10.0  # at once, so the supervisor reconnects
    assert (mq.published, len(outbox.rows)) == ([], 1)


async def test_a_batch_held_by_a_broker_block_keeps_its_rows_without_failing(
    mock_clock: trio.testing.MockClock,
) -> None:
    outbox, mq = MemoryOutbox(), BlocksUnder()
    outbox.add(delivery(1), "webhook", b"")
    assert await relay_once(outbox, mq, batch_size=10) == 1  # no BrokerError: not broken
    assert (len(mq.published), len(outbox.rows)) == (1, 1)  # sent, unconfirmed, kept
    assert trio.current_time() == 0.5  # the probe of the publisher's readiness


async def test_loop_waits_out_a_block_that_began_under_a_batch(
    mock_clock: trio.testing.MockClock,
) -> None:
    outbox, mq, stop = MemoryOutbox(), BlocksUnder(), Stop()
    outbox.add(delivery(1), "webhook", b"")
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop)
        await trio.sleep(20)
        assert (len(mq.published), len(outbox.rows)) == (1, 1)  # only the held batch
        mq.unblock()
        await mq.wait_published()
        stop.set()
    assert mq.published_at == [0.0, 20.0]  # the held batch, again as soon as the block lifted
    assert outbox.rows == {}


async def run_loop(
    outbox: MemoryOutbox,
    mq: MemoryBroker,
    stop: Stop,
    batch_size: int = 10,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    await relay_loop(
        outbox,
        mq,
        stop,
        batch_size=batch_size,
        poll_interval_seconds=POLL,
        task_status=task_status,
    )


# -- the doorbell is a hint: losing LISTEN never stops the relay ----------------------------------


async def test_a_lost_doorbell_leaves_the_relay_polling_without_failing(
    mock_clock: trio.testing.MockClock,
) -> None:
    outbox, mq, stop = MemoryOutbox(), TimedBroker(), Stop()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop)
        outbox.listen_failures = 1000  # once lost, LISTEN never comes back
        await trio.sleep(0.3)
        outbox.lose_doorbell()
        for n in range(1, 6):  # rows over a minute, their NOTIFY heard by nobody
            await trio.sleep(12.25)
            added = trio.current_time()
            outbox.add(delivery(n), "webhook", b"")
            await mq.wait_published()
            assert added < trio.current_time() <= added + POLL  # found by the next poll
        stop.set()
    assert len(mq.published) == 5
    assert outbox.rows == {}
    assert len(outbox.listened_at) > 5  # it kept trying to listen again, in the background


async def test_the_relay_listens_again_with_a_backoff_of_its_own(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="notifier.relay")
    outbox, mq, stop = MemoryOutbox(), TimedBroker(), Stop()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop)
        outbox.listen_failures = 2
        await trio.sleep(0.5)
        outbox.lose_doorbell()
        await trio.sleep(10)
        # lost at 0.5: tried again after 0.5 s, then 1 s and 2 s (two refusals), then listening
        assert outbox.listened_at == pytest.approx([0, 1.0, 2.0, 4.0])
        outbox.add(delivery(1), "webhook", b"")  # rings the new doorbell
        await mq.wait_published()
        assert trio.current_time() == pytest.approx(10.5)  # at once, not at the next poll
        await trio.sleep(10)
        outbox.lose_doorbell()  # after a connection that held: the backoff starts over
        await trio.sleep(1)
        assert outbox.listened_at[4:] == pytest.approx([21.0])
        stop.set()
    lost = "the outbox LISTEN connection was lost; the relay polls until it is back"
    refused = (
        "listening for the outbox doorbell failed (the relay polls): "
        "StoreUnavailable('memory outbox: LISTEN failed')"
    )
    back = "listening for the outbox doorbell again"
    assert [r.getMessage() for r in caplog.records if r.name == "notifier.relay"] == [
        lost, refused, refused, back, lost, back,
    ]  # fmt: skip


async def test_a_relay_whose_first_listen_fails_starts_and_polls(
    mock_clock: trio.testing.MockClock,
) -> None:
    outbox, mq, stop = MemoryOutbox(), TimedBroker(), Stop()
    outbox.listen_failures = 1
    outbox.add(delivery(1), "webhook", b"")
    async with trio.open_nursery() as nursery:
        await nursery.start(run_loop, outbox, mq, stop)
        assert trio.current_time() == 0
        if not mq.published:
            await mq.wait_published()
        await trio.sleep(1)
        stop.set()
    assert mq.published_at == [0.0]
    assert outbox.listened_at == [0.0, 0.5]
