"""A publisher under a broker block (a memory alarm), against the real RabbitMQ: it waits
while blocked, goes on when the block lifts, and fails — instead of waiting for ever — when its
connection is lost meanwhile. The alarm is global to the broker, so these carry the
``stops_services`` marker and restore the watermark in ``finally``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from notifier.bridge import open_bridge
from notifier.broker.amqp import AmqpPublisher, open_connection
from notifier.broker.base import Confirm, Outgoing
from notifier.errors import BrokerError
from tests.chaos import services
from tests.integration.conftest import rabbitmqctl

pytestmark = pytest.mark.stops_services


@asynccontextmanager
async def memory_alarm() -> AsyncIterator[None]:
    before = await trio.to_thread.run_sync(services.rabbitmq_memory_watermark)
    try:
        await trio.to_thread.run_sync(services.rabbitmq_set_memory_watermark, "0")
        yield
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(services.rabbitmq_set_memory_watermark, before)


async def publish_into_the_block(publisher: AmqpPublisher) -> None:
    """RabbitMQ blocks a connection when it publishes during an alarm: the publish is held
    past its timeout (1 s here)."""
    out = Outgoing("", "nowhere", b"{}", "m-1")
    assert await publisher.publish_batch([out]) == [Confirm.UNCONFIRMED]


async def blocked(publisher: AmqpPublisher) -> bool:
    """Whether the publisher is still waiting after 2 s."""
    with trio.move_on_after(2):
        await publisher.wait_publishable()
        return False
    return True


async def test_a_blocked_publisher_waits_and_goes_on_when_the_block_lifts(
    broker_url: str,
) -> None:
    async with (
        open_bridge(),
        open_connection(broker_url, name="test") as conn,
        conn.open_publisher(1) as publisher,
    ):
        with trio.fail_after(5):
            await publisher.wait_publishable()  # not blocked: at once
        async with memory_alarm():
            await publish_into_the_block(publisher)
            assert await blocked(publisher)
        with trio.fail_after(10):
            await publisher.wait_publishable()  # the block lifted


async def test_a_connection_lost_while_blocked_fails_the_wait(broker_url: str, vhost: str) -> None:
    async with (
        open_bridge(),
        open_connection(broker_url, name="test") as conn,
        conn.open_publisher(1) as publisher,
        memory_alarm(),
    ):
        await publish_into_the_block(publisher)
        assert await blocked(publisher)
        async with trio.open_nursery() as nursery:

            async def close_connections() -> None:  # while the wait below is under way
                await trio.to_thread.run_sync(
                    rabbitmqctl, "close_all_connections", "-p", vhost, "test"
                )

            nursery.start_soon(close_connections)
            with trio.fail_after(15), pytest.raises(BrokerError, match="closed"):
                await publisher.wait_publishable()
