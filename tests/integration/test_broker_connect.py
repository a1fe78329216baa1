"""Connecting to a broker that accepts the TCP connection but never speaks AMQP fails in
bounded time (found by the fault suite: a relay reconnecting into a blackhole hung for ever);
a node's URL that aiormq cannot read fails that node only; a probe of nodes that never answer
says why each failed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from notifier.bridge import open_bridge
from notifier.broker.amqp import open_connection, probe, queue_depths
from notifier.broker.base import Confirm, Outgoing, Settle
from notifier.broker.nodes import CHOOSER, node_address
from notifier.broker.topology import build_topology
from notifier.errors import BrokerError
from tests.integration.conftest import rabbitmqctl

# An unencoded / in the password: aiormq reads the URL with yarl, which finds the port "gu".
UNREADABLE = "amqp://guest:gu/est@127.0.0.1:5672/"


@asynccontextmanager
async def silent_node() -> AsyncIterator[int]:
    """A port that takes TCP connections and never says a word; yield it."""

    async def silent(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, silent, listeners)
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def test_a_broker_that_never_answers_fails_the_connect_in_time() -> None:
    # the bridge open, as the service has it (open_store opens it first)
    async with silent_node() as port, open_bridge():
        began = trio.current_time()
        with trio.fail_after(10), pytest.raises(BrokerError, match=r"no answer in 0\.5 s"):
            async with open_connection(
                f"amqp://guest:guest@127.0.0.1:{port}/", name="test", connect_timeout_seconds=0.5
            ):
                pass  # pragma: no cover - the connection never opens
        assert trio.current_time() - began >= 0.5


async def test_a_node_url_aiormq_cannot_read_fails_that_node_and_the_next_one_is_tried(
    broker_url: str,
) -> None:
    name = f"test-{uuid.uuid4().hex}"  # a name of its own: the chooser remembers names
    async with open_bridge():
        with trio.fail_after(30):
            async with open_connection([UNREADABLE, broker_url], name=name) as conn:
                assert conn.node == node_address(broker_url)
            # connected to node 1, the name starts at node 0 next time: the unreadable one
            assert CHOOSER.order(name, 2) == [0, 1]
            async with open_connection([UNREADABLE, broker_url], name=name) as conn:
                assert conn.node == node_address(broker_url)


async def test_a_single_unreadable_node_url_is_a_broker_failure_that_hides_the_password() -> None:
    async with open_bridge():
        with trio.fail_after(10), pytest.raises(BrokerError) as info:
            async with open_connection(UNREADABLE, name="test"):
                pass  # pragma: no cover - the connection never opens
        assert str(info.value) == "node 0: unreadable URL"
        assert info.value.__cause__ is None
        assert info.value.__suppress_context__
        # the readiness probe and the queue-depth reader (whose BrokerError the metrics
        # report as broker_up 0) fail the same way
        with trio.fail_after(10), pytest.raises(BrokerError, match="unreadable URL"):
            await probe([UNREADABLE])
        with trio.fail_after(10), pytest.raises(BrokerError, match="unreadable URL"):
            await queue_depths([UNREADABLE], ["deliveries.webhook"])


async def test_a_probe_of_nodes_that_never_answer_says_why_each_failed() -> None:
    async with silent_node() as one, silent_node() as two:
        urls = [f"amqp://guest:guest@127.0.0.1:{port}/" for port in (one, two)]
        async with open_bridge():
            with trio.fail_after(10), pytest.raises(BrokerError) as info:
                await probe(urls, timeout_seconds=1.0)
    message = str(info.value)
    assert message.startswith("no RabbitMQ node took the connection"), message
    assert f"127.0.0.1:{one}/" in message
    assert f"127.0.0.1:{two}/" in message


async def test_a_closed_channel_under_a_publish_or_an_ack_is_a_broker_failure(
    broker_url: str, vhost: str
) -> None:
    """aiormq raises ChannelInvalidStateError (a RuntimeError) on a closed channel; the
    publisher must answer UNCONFIRMED and the consumer's acknowledgements must fail quietly,
    not crash their component with a library error (found by the fault suite)."""
    out = Outgoing("deliveries", "webhook", b"{}", "m-1")
    async with open_bridge(), open_connection(broker_url, name="test") as conn:
        await conn.declare(build_topology(["webhook"], [1], "quorum"))
        async with (
            conn.open_publisher(5) as publisher,
            conn.open_consumer("deliveries.webhook", 8) as consumer,
        ):
            assert await publisher.publish_batch([out]) == [Confirm.CONFIRMED]
            with trio.fail_after(10):
                incoming = await consumer.receive.receive()
            await trio.to_thread.run_sync(rabbitmqctl, "close_all_connections", "-p", vhost, "test")
            with trio.fail_after(10):
                await conn.wait_closed()
            assert await publisher.publish_batch([out]) == [Confirm.UNCONFIRMED]
            incoming.settle(Settle.ACK)  # acknowledged on a channel that is gone
        # leaving open_consumer flushed that acknowledgement: it failed quietly


async def test_copies_with_one_message_id_are_each_confirmed_for_what_became_of_them(
    broker_url: str,
) -> None:
    """aiormq matches a returned message to its publish by ``message_id``: published together,
    a copy with no queue and a copy that lands, both with one id, would have their outcomes
    swapped (the lost copy counted as confirmed). The publisher keeps them apart itself."""
    lost = Outgoing("deliveries", "nowhere", b"{}", "same-id")
    lands = Outgoing("deliveries", "webhook", b"{}", "same-id")
    async with open_bridge(), open_connection(broker_url, name="test") as conn:
        await conn.declare(build_topology(["webhook"], [1], "quorum"))
        async with conn.open_publisher(5) as publisher:
            with trio.fail_after(10):
                confirms = await publisher.publish_batch([lost, lands, lost, lands])
    assert confirms == [Confirm.RETURNED, Confirm.CONFIRMED] * 2
