"""A publish that declares its route again when it comes back returned, over the in-memory
broker."""

from __future__ import annotations

import trio
import trio.testing

from notifier.broker.base import Confirm, Outgoing
from notifier.broker.repair import DECLARE_TIMEOUT_SECONDS, RepairingPublish
from notifier.broker.topology import (
    RETRY_EXCHANGE,
    Topology,
    build_topology,
    retry_queue,
    routes_to,
)
from notifier.testing import MemoryBroker

TOPOLOGY = build_topology(["webhook"], [2, 5], "quorum")
TIER = retry_queue("webhook", 2)


def retry(n: int = 1) -> Outgoing:
    return Outgoing(RETRY_EXCHANGE, TIER, b"{}", f"delivery-{n}")


def rig() -> tuple[MemoryBroker, RepairingPublish]:
    broker = MemoryBroker()
    broker.declare(TOPOLOGY)
    return broker, RepairingPublish(broker.publish, broker.declare_topology, TOPOLOGY)


def test_routes_to_is_the_exchange_and_the_queues_a_publish_needs() -> None:
    needed = routes_to(TOPOLOGY, RETRY_EXCHANGE, TIER)
    assert needed.exchanges == (RETRY_EXCHANGE,)
    [queue] = needed.queues
    assert queue.name == TIER
    assert queue.arguments["x-message-ttl"] == 2000  # declared exactly as at start-up
    assert routes_to(TOPOLOGY, RETRY_EXCHANGE, "elsewhere").queues == []


async def test_a_route_in_place_is_published_once_without_declaring() -> None:
    broker, publish = rig()
    assert await publish(retry()) is Confirm.CONFIRMED
    assert len(broker.published) == 1
    assert broker.declared == []


async def test_a_returned_publish_declares_its_route_again_and_is_published_again() -> None:
    broker, publish = rig()
    broker.delete_queue(TIER)

    assert await publish(retry()) is Confirm.CONFIRMED

    assert broker.declared == [routes_to(TOPOLOGY, RETRY_EXCHANGE, TIER)]
    assert broker.queues[TIER] == [retry()]
    assert len(broker.published) == 2
    assert publish.redeclared == 1


async def test_concurrent_returns_for_one_route_declare_it_once() -> None:
    broker, publish = rig()
    broker.delete_queue(TIER)
    results: list[Confirm] = []

    async def send(n: int) -> None:
        results.append(await publish(retry(n)))

    async with trio.open_nursery() as nursery:
        for n in range(10):
            nursery.start_soon(send, n)

    assert results == [Confirm.CONFIRMED] * 10
    assert len(broker.declared) == 1
    assert sorted(m.message_id for m in broker.queues[TIER]) == sorted(
        retry(n).message_id for n in range(10)
    )


async def test_a_route_deleted_again_later_is_declared_again() -> None:
    broker, publish = rig()
    for _ in range(2):
        broker.delete_queue(TIER)
        assert await publish(retry()) is Confirm.CONFIRMED
    assert len(broker.declared) == 2


async def test_a_route_outside_the_topology_stays_returned_without_declaring() -> None:
    broker, publish = rig()
    out = Outgoing(RETRY_EXCHANGE, "deliveries.webhook.retry.7s", b"{}", "x")
    assert await publish(out) is Confirm.RETURNED
    assert broker.declared == []
    assert len(broker.published) == 1


async def test_a_refused_declaration_leaves_the_publish_returned() -> None:
    broker, publish = rig()
    broker.delete_queue(TIER)
    broker.refuse_declares = True

    assert await publish(retry()) is Confirm.RETURNED

    assert len(broker.declared) == 1
    assert len(broker.published) == 1  # not published again into the same hole
    assert publish.redeclared == 0


async def test_a_declaration_without_an_answer_gives_up_in_time(
    mock_clock: trio.testing.MockClock,
) -> None:
    broker, _ = rig()
    broker.delete_queue(TIER)

    async def hangs(topology: Topology) -> None:
        await trio.sleep_forever()

    publish = RepairingPublish(broker.publish, hangs, TOPOLOGY)
    assert await publish(retry()) is Confirm.RETURNED
    assert trio.current_time() == DECLARE_TIMEOUT_SECONDS


async def test_other_failures_are_passed_on_without_declaring() -> None:
    broker, publish = rig()
    broker.nack_next = 1
    assert await publish(retry()) is Confirm.NACKED
    broker.drop_confirms = True
    assert await publish(retry()) is Confirm.UNCONFIRMED
    assert broker.declared == []
