"""The consumer's settlement plan: individual frames first, then one ack(multiple=True) for the
longest fully-acked prefix of delivery tags (docs/architecture.md §7). No channel is touched."""

from __future__ import annotations

from notifier.broker.amqp import Consumer
from notifier.broker.base import Settle


def consumer(*tags: int) -> Consumer:
    c = Consumer(object(), prefetch=10)  # type: ignore[arg-type]
    c._pending = dict.fromkeys(tags)
    return c


def test_nothing_settled_plans_nothing() -> None:
    c = consumer(1, 2)
    assert c._take_settled() == []
    assert c._pending == {1: None, 2: None}


def test_all_acked_is_one_ack_multiple() -> None:
    c = consumer(1, 2, 3)
    for tag in (3, 1, 2):  # workers finish out of order
        c.settle(tag, Settle.ACK)
    assert c._take_settled() == [("ack_multiple", 3)]
    assert c._pending == {}
    assert c.unsettled == 0


def test_a_gap_stops_the_prefix_and_later_acks_go_singly() -> None:
    c = consumer(1, 2, 3, 4)
    c.settle(1, Settle.ACK)
    c.settle(3, Settle.ACK)
    c.settle(4, Settle.ACK)
    frames = c._take_settled()
    assert frames == [("ack", 3), ("ack", 4), ("ack_multiple", 1)]
    assert c._pending == {2: None}  # the unsettled one stays, the rest are gone


def test_the_gap_closes_on_the_next_plan() -> None:
    c = consumer(1, 2, 3)
    c.settle(1, Settle.ACK)
    c.settle(3, Settle.ACK)
    c._take_settled()
    c.settle(2, Settle.ACK)
    assert c._take_settled() == [("ack_multiple", 2)]
    assert c._pending == {}


def test_nothing_in_the_prefix_settled_means_no_ack_multiple() -> None:
    c = consumer(1, 2, 3)
    c.settle(2, Settle.ACK)
    c.settle(3, Settle.ACK)
    assert c._take_settled() == [("ack", 2), ("ack", 3)]
    assert c._pending == {1: None}


def test_reject_and_requeue_frames_come_before_the_ack_multiple_covering_them() -> None:
    c = consumer(1, 2, 3, 4)
    c.settle(1, Settle.ACK)
    c.settle(2, Settle.REJECT)
    c.settle(3, Settle.REQUEUE)
    c.settle(4, Settle.ACK)
    frames = c._take_settled()
    assert frames == [("reject", 2), ("requeue", 3), ("ack_multiple", 4)]
    # an ack(multiple) up to 4 sent first would have acked 2 and 3 instead
    assert frames.index(("reject", 2)) < frames.index(("ack_multiple", 4))
    assert frames.index(("requeue", 3)) < frames.index(("ack_multiple", 4))
    assert c._pending == {}


def test_rejects_after_a_gap_go_singly_and_unsettled_ones_stay() -> None:
    c = consumer(1, 2, 3, 4, 5)
    c.settle(1, Settle.REQUEUE)
    c.settle(3, Settle.REJECT)
    c.settle(5, Settle.ACK)
    assert c._take_settled() == [("requeue", 1), ("reject", 3), ("ack", 5)]
    assert c._pending == {2: None, 4: None}


def test_settling_an_unknown_tag_is_ignored() -> None:
    c = consumer(1)
    c.settle(7, Settle.ACK)
    assert c._pending == {1: None}
    assert c._take_settled() == []


def test_settling_a_tag_already_sent_is_ignored() -> None:
    c = consumer(1, 2)
    c.settle(1, Settle.ACK)
    assert c._take_settled() == [("ack_multiple", 1)]
    c.settle(1, Settle.REJECT)  # e.g. a duplicate settlement
    assert c._take_settled() == []
    assert c._pending == {2: None}


def test_a_second_plan_without_news_is_empty() -> None:
    c = consumer(1, 2)
    c.settle(1, Settle.ACK)
    c.settle(2, Settle.ACK)
    assert c._take_settled() == [("ack_multiple", 2)]
    assert c._take_settled() == []
