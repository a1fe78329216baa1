"""The fault proxy against a local echo server, on real sockets and the real clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import pytest
import trio

from tests.chaos.proxy import FaultProxy, open_fault_proxy

TIMEOUT_SECONDS = 5


async def _echo(stream: trio.SocketStream) -> None:
    try:
        async for data in stream:
            await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the proxy reset or closed the upstream side


@pytest.fixture
async def echo_port(nursery: trio.Nursery) -> int:
    serve = partial(trio.serve_tcp, _echo, 0, host="127.0.0.1")
    listeners: list[trio.SocketListener] = await nursery.start(serve)
    port: int = listeners[0].socket.getsockname()[1]
    return port


@pytest.fixture
async def proxy(echo_port: int) -> AsyncIterator[FaultProxy]:
    async with open_fault_proxy("127.0.0.1", echo_port) as proxy:
        yield proxy


async def _connect(proxy: FaultProxy) -> trio.SocketStream:
    with trio.fail_after(TIMEOUT_SECONDS):
        return await trio.open_tcp_stream("127.0.0.1", proxy.port)


async def _receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    received = b""
    while len(received) < size:
        data = await stream.receive_some(size - len(received))
        assert data, f"end of stream after {received!r}"
        received += data
    return received


async def _round_trip(stream: trio.SocketStream, message: bytes) -> bytes:
    with trio.fail_after(TIMEOUT_SECONDS):
        await stream.send_all(message)
        return await _receive_exactly(stream, len(message))


async def _assert_reset(stream: trio.SocketStream) -> None:
    """The proxy ended ``stream``: a read sees a reset or the end of the stream."""
    with trio.fail_after(TIMEOUT_SECONDS):
        try:
            data = await stream.receive_some(1024)
        except trio.BrokenResourceError:
            return
    assert data == b""


async def test_pass_echoes_and_counts(proxy: FaultProxy) -> None:
    async with await _connect(proxy) as client:
        assert await _round_trip(client, b"hello") == b"hello"
        assert await _round_trip(client, b"x" * 100_000) == b"x" * 100_000
        # The client may read the echo before the proxy has counted what it sent.
        with trio.fail_after(TIMEOUT_SECONDS):
            stats = await proxy.wait_statistics(
                lambda s: s.bytes_to_upstream == s.bytes_to_client == 100_005
            )
        assert stats.mode == "pass"
        assert stats.connections_accepted == 1
        assert stats.connections_active == 1
        assert stats.bytes_dropped == 0

    # The client's end of stream travels to the echo server, whose close travels back.
    with trio.fail_after(TIMEOUT_SECONDS):
        await proxy.wait_statistics(lambda s: s.connections_active == 0)


async def test_latency_delays_both_directions_of_an_open_connection(proxy: FaultProxy) -> None:
    delay_seconds = 0.2
    async with await _connect(proxy) as client:
        assert await _round_trip(client, b"before") == b"before"
        await proxy.set_mode("latency", seconds=delay_seconds)
        started = trio.current_time()
        assert await _round_trip(client, b"slow") == b"slow"
        assert trio.current_time() - started >= 2 * delay_seconds

        await proxy.set_mode("pass")
        assert await _round_trip(client, b"after") == b"after"


async def test_blackhole_drops_then_pass_serves_new_and_open_connections(
    proxy: FaultProxy,
) -> None:
    async with await _connect(proxy) as opened:
        assert await _round_trip(opened, b"before") == b"before"
        await proxy.set_mode("blackhole")

        async with await _connect(proxy) as blackholed:
            await blackholed.send_all(b"into the void")
            with trio.move_on_after(0.5) as waited:
                await blackholed.receive_some(1024)
            assert waited.cancelled_caught

        dropped = proxy.statistics().bytes_dropped
        await opened.send_all(b"lost")
        with trio.fail_after(TIMEOUT_SECONDS):
            await proxy.wait_statistics(lambda s: s.bytes_dropped == dropped + len(b"lost"))

        await proxy.set_mode("pass")
        async with await _connect(proxy) as fresh:
            assert await _round_trip(fresh, b"hello") == b"hello"
        # The open connection resumes; what it sent during the blackhole is gone.
        assert await _round_trip(opened, b"again") == b"again"


async def test_reset_ends_open_connections_and_new_ones(proxy: FaultProxy) -> None:
    async with await _connect(proxy) as client:
        assert await _round_trip(client, b"hello") == b"hello"
        await proxy.set_mode("reset")
        await _assert_reset(client)
    assert proxy.statistics().connections_active == 0

    async with await _connect(proxy) as client:
        await _assert_reset(client)

    await proxy.set_mode("pass")
    async with await _connect(proxy) as client:
        assert await _round_trip(client, b"hello") == b"hello"


async def test_refuse_then_pass_listens_again_on_the_same_port(proxy: FaultProxy) -> None:
    port = proxy.port
    async with await _connect(proxy) as client:
        assert await _round_trip(client, b"hello") == b"hello"
        await proxy.set_mode("refuse")
        await _assert_reset(client)
    assert not proxy.statistics().listening

    with trio.fail_after(TIMEOUT_SECONDS), pytest.raises(OSError, match="all attempts to connect"):
        await trio.open_tcp_stream("127.0.0.1", port)

    await proxy.set_mode("pass")
    assert proxy.port == port
    async with await _connect(proxy) as client:
        assert await _round_trip(client, b"hello") == b"hello"


async def test_exit_closes_connections_and_listener(echo_port: int) -> None:
    async with open_fault_proxy("127.0.0.1", echo_port) as proxy:
        port = proxy.port
        client = await _connect(proxy)
        assert await _round_trip(client, b"hello") == b"hello"

    async with client:
        with trio.fail_after(TIMEOUT_SECONDS):
            assert await client.receive_some(1024) == b""
    with trio.fail_after(TIMEOUT_SECONDS), pytest.raises(OSError, match="all attempts to connect"):
        await trio.open_tcp_stream("127.0.0.1", port)


@pytest.mark.parametrize(
    ("mode", "params", "error"),
    [
        ("latency", {}, TypeError),  # latency needs its delay
        ("pass", {"seconds": 1.0}, TypeError),  # only latency takes seconds
        ("latency", {"seconds": -1.0}, ValueError),  # a delay cannot be negative
        ("slow", {}, ValueError),  # not a mode
    ],
)
async def test_set_mode_refuses_bad_arguments(
    proxy: FaultProxy, mode: str, params: dict[str, float], error: type[Exception]
) -> None:
    with pytest.raises(error):
        await proxy.set_mode(mode, **params)  # type: ignore[arg-type]
    assert proxy.mode == "pass"


def test_upstream_must_be_loopback() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("10.0.0.1", 80)
