"""One deadline per webhook attempt, against real local servers on 127.0.0.1 spare ports: a
server that answers ``102 Processing`` without end is cut off at the cap of informational
answers (at once, not at the deadline), and one that drips its body is cut at the attempt's one
deadline, not at a deadline per read. The clock-exact cases are in
``tests/unit/test_webhook_client.py``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from notifier.adapters.webhook import WebhookAdapter, generate_secret
from notifier.adapters.webhook.client import MAX_INFORMATIONAL
from notifier.errors import RetriableError
from notifier.messages import WorkerMessage
from notifier.testing import worker_message

pytestmark = pytest.mark.integration

Serve = Callable[[trio.SocketStream], Awaitable[None]]


@asynccontextmanager
async def open_server(serve: Serve) -> AsyncIterator[int]:
    """A TCP server on a spare port of 127.0.0.1 that reads a request's head and then runs
    ``serve`` on the connection; yields its port."""

    async def handle(stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = await stream.receive_some(65536)
            if not data:
                return
            head += data
        with contextlib.suppress(trio.BrokenResourceError):  # the client hung up, as expected
            await serve(stream)

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        yield listener.socket.getsockname()[1]
        nursery.cancel_scope.cancel()


def message(port: int) -> WorkerMessage:
    config = {"url": f"http://127.0.0.1:{port}/hook", "secret": generate_secret()}
    return worker_message(channel_config=config)


async def test_an_endless_stream_of_102_answers_ends_the_attempt_at_once() -> None:
    sent = 0

    async def processing_for_ever(stream: trio.SocketStream) -> None:
        nonlocal sent
        while True:
            await stream.send_all(b"HTTP/1.1 102 Processing\r\n\r\n")
            sent += 1
            await trio.sleep(0.001)

    adapter = WebhookAdapter(timeout_seconds=10, allow_private_networks=True)
    async with open_server(processing_for_ever) as port:
        start = trio.current_time()
        with trio.fail_after(5), pytest.raises(RetriableError) as info:
            await adapter.deliver(message(port))
        elapsed = trio.current_time() - start
    await adapter.aclose()
    assert str(info.value) == (
        "connection failed: RemoteProtocolError: more than 10 informational (1xx) answers"
    )
    assert elapsed < 2  # well before the 10 s deadline
    assert sent >= MAX_INFORMATIONAL + 1


async def test_a_dripping_body_ends_at_the_attempts_one_deadline() -> None:
    async def drip(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10000\r\n\r\n")
        while True:  # a byte every 50 ms: each read well inside the timeout
            await stream.send_all(b"x")
            await trio.sleep(0.05)

    adapter = WebhookAdapter(timeout_seconds=1.5, allow_private_networks=True)
    async with open_server(drip) as port:
        start = trio.current_time()
        with trio.fail_after(5), pytest.raises(RetriableError) as info:
            await adapter.deliver(message(port))
        elapsed = trio.current_time() - start
    await adapter.aclose()
    assert str(info.value) == "timed out after 1.5 s reading the answer's body"
    assert 1.5 <= elapsed < 2.5
