"""The bounded body reader the HTTP adapters share (``adapters.http.BoundedTransport``): an
answer longer than the limit ends there, the rest is never read, the connection is closed and
every generator on the way finishes; a complete answer leaves its connection reusable.

The tests run over an httpcore network backend passed to the transport's constructor (its
seam); Telegram's use of it, against a real socket, is in ``tests/integration/test_telegram.py``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx
import trio

from notifier.adapters.http import BoundedTransport, new_client

LIMIT = 10_000
CHUNK = 4096
ENDLESS_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"content-length: 1000000000\r\n\r\n" + b'{"ok": true, "result": "'
)


class AnswerStream(httpcore.AsyncNetworkStream):
    """A connection that answers every request with ``head`` and then ``body_bytes`` of body
    (without end when None), ``CHUNK`` bytes a read at the most."""

    def __init__(self, head: bytes, body_bytes: int | None) -> None:
        self._head = head
        self._body_bytes = body_bytes
        self._pending = b""
        self._body_left: int | None = 0
        self.served = 0
        self.closed = False

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await trio.lowlevel.checkpoint()
        if buffer.endswith(b"\r\n\r\n"):  # a request's head: answer it
            self._pending, self._body_left = self._head, self._body_bytes

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        await trio.lowlevel.checkpoint()
        assert not self.closed, "read from a closed connection"
        if self._pending:
            out, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        else:
            size = min(max_bytes, CHUNK)
            if self._body_left is not None:
                size = min(size, self._body_left)
                self._body_left -= size
            out = b"x" * size
        self.served += len(out)
        return out

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = True

    def get_extra_info(self, info: str) -> Any:
        return None


class AnswerBackend(httpcore.AsyncNetworkBackend):
    """Dials nothing real: hands out an ``AnswerStream`` a connection and keeps them."""

    def __init__(self, head: bytes, body_bytes: int | None = None) -> None:
        self._head = head
        self._body_bytes = body_bytes
        self.streams: list[AnswerStream] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        await trio.lowlevel.checkpoint()
        self.streams.append(AnswerStream(self._head, self._body_bytes))
        return self.streams[-1]

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


async def read_all(client: httpx.AsyncClient) -> bytes:
    data = b""
    async with client.stream("GET", "http://bot.test/answer") as resp:
        async for chunk in resp.aiter_raw():
            data += chunk
    return data


def assert_no_generator_was_abandoned() -> None:
    """An async generator left half-way is finalised by trio with a ``ResourceWarning``, which
    this suite turns into a failure: collect now so that it shows in this test."""
    gc.collect()


async def test_a_body_over_the_limit_ends_there_and_its_connection_is_closed() -> None:
    backend = AnswerBackend(ENDLESS_HEAD)
    transport = BoundedTransport(network_backend=backend, max_body_bytes=LIMIT)
    async with new_client(5.0, transport) as client:
        with trio.fail_after(5):
            data = await read_all(client)
        assert data.startswith(b'{"ok": true')
        assert LIMIT <= len(data) < LIMIT + CHUNK  # whole chunks: a little more at most
        (stream,) = backend.streams
        assert stream.closed
        assert stream.served < len(ENDLESS_HEAD) + LIMIT + 2 * CHUNK  # the rest is never read
        assert_no_generator_was_abandoned()


async def test_a_complete_body_under_the_limit_leaves_the_connection_reusable() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 3000\r\n\r\n"
    backend = AnswerBackend(head, body_bytes=3000)
    transport = BoundedTransport(network_backend=backend, max_body_bytes=3000)
    async with new_client(5.0, transport) as client:
        with trio.fail_after(5):
            first = await read_all(client)
            second = await read_all(client)
        assert first == second == b"x" * 3000
        (stream,) = backend.streams  # one connection served both
        assert not stream.closed
