"""A flood of connections over the ingest server's limits: those over the total or over their
address's share are closed at once, before anything is read, and counted; the others, and the
other addresses, are still served."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.adversarial.hostile import ingest_process

pytestmark = pytest.mark.slow

MAX_CONNECTIONS = 20
PER_ADDRESS = 8
HEALTH = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"


async def answer(stream: trio.SocketStream) -> bytes:
    """The bytes the server sends after ``HEALTH`` until a whole answer has arrived, or until it
    closes the connection (b"" for a connection closed without an answer)."""
    await stream.send_all(HEALTH)
    data = b""
    with trio.fail_after(10):
        while not complete(data):
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:  # reset: it read nothing of the request
                return data
            if not chunk:
                return data
            data += chunk
    return data


def complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    lengths = [
        line.split(b":", 1)[1] for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    ]  # fmt: skip
    return bool(sep) and bool(lengths) and len(body) >= int(lengths[0])


async def served(source: str, port: int) -> trio.SocketStream:
    """A connection from ``source`` that was admitted: its request answered 200, kept open."""
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    got = await answer(stream)
    assert got.startswith(b"HTTP/1.1 200 "), got
    return stream


async def refused(source: str, port: int) -> None:
    """A connection from ``source`` that is closed at once: no answer at all."""
    async with await trio.open_tcp_stream("127.0.0.1", port, local_address=source) as stream:
        assert await answer(stream) == b""


async def test_connections_over_the_limits_are_closed_at_once_and_counted(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    async with ingest_process(
        tmp_path, database_url, broker_url, max_connections=MAX_CONNECTIONS,
        max_connections_per_address=PER_ADDRESS,
    ) as ingest:  # fmt: skip
        held: list[trio.SocketStream] = []
        try:
            # One address takes its share; more from it are refused, not from another.
            held += [await served("127.0.0.1", ingest.port) for _ in range(PER_ADDRESS)]
            for _ in range(5):
                await refused("127.0.0.1", ingest.port)
            held += [await served("127.0.0.2", ingest.port) for _ in range(PER_ADDRESS)]
            # 16 open; four more from two other addresses fill the total, then no one gets in.
            held += [await served(f"127.0.0.{n}", ingest.port) for n in (3, 3, 4, 4)]
            for n in (5, 6, 7):
                await refused(f"127.0.0.{n}", ingest.port)
            # Every held connection still carries requests.
            for stream in held:
                assert (await answer(stream)).startswith(b"HTTP/1.1 200 ")
        finally:
            for stream in held:
                await stream.aclose()
        # Places free again once the flood leaves.
        await ingest.wait_metric(1, "notifier_ingest_connections_open")  # the scrape's own
        refusals = [
            await ingest.metric("notifier_ingest_connections_refused_total", reason=reason)
            for reason in ("per_address", "total")
        ]
        assert refusals == [5, 3]
        assert "Error in ASGI Framework" not in ingest.log()
