"""Connecting to a broker that accepts the TCP connection but never speaks AMQP fails in
bounded time (found by the fault suite: a relay reconnecting into a blackhole hung for ever)."""

from __future__ import annotations

import pytest
import trio

from notifier.bridge import open_bridge
from notifier.broker.amqp import open_connection
from notifier.errors import BrokerError


async def test_a_broker_that_never_answers_fails_the_connect_in_time() -> None:
    async def silent(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, silent, listeners)
        async with open_bridge():  # as the service has it open (open_store opens it first)
            began = trio.current_time()
            with trio.fail_after(10), pytest.raises(BrokerError, match=r"no answer in 0\.5 s"):
                async with open_connection(
                    f"amqp://guest:guest@127.0.0.1:{port}/", name="test",
                    connect_timeout_seconds=0.5,
                ):  # fmt: skip
                    pass  # pragma: no cover - the connection never opens
            assert trio.current_time() - began >= 0.5
        nursery.cancel_scope.cancel()
