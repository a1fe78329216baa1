"""Clients that ask for a large answer and never read it: every write of the ingest server is
bounded, so they neither keep the process alive after SIGTERM nor hold a connection forever."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.adversarial.hostile import (
    bundle_request,
    closed_by_server,
    h2_bundle_request,
    ingest_process,
    stuck_readers,
)
from tests.integration.conftest import poll

pytestmark = pytest.mark.slow

GRACE_SECONDS = 2.0
READERS = 40


async def flow_stalled(port: int, count: int, nursery: trio.Nursery) -> None:
    """``count`` HTTP/2 connections that read every byte but never open their flow-control
    window: their streams stall after the first 64 KiB, with nothing waiting in a socket."""
    arrived = [0] * count

    async def drain(i: int, stream: trio.SocketStream) -> None:
        async with stream:
            while chunk := await stream.receive_some(65536):
                arrived[i] += len(chunk)

    for i in range(count):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(h2_bundle_request())
        nursery.start_soon(drain, i, stream)

    async def stalled() -> bool:
        return min(arrived) >= 65535

    with trio.fail_after(20):
        await poll(stalled)


async def test_readers_that_never_read_do_not_keep_the_process_alive_after_sigterm(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    async with ingest_process(
        tmp_path, database_url, broker_url, grace_seconds=GRACE_SECONDS
    ) as ingest:
        socks = await stuck_readers(ingest.port, READERS, bundle_request())
        try:
            seconds = await ingest.sigterm_exit_seconds(GRACE_SECONDS + 10)
        finally:
            for sock in socks:
                sock.close()
        assert seconds is not None, "still running 10 s after the grace:\n" + ingest.log()
        assert seconds <= GRACE_SECONDS + 1, seconds
        assert "Error in ASGI Framework" not in ingest.log()


async def test_http2_streams_stalled_by_flow_control_or_a_full_socket_do_not_either(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    async with (
        ingest_process(
            tmp_path, database_url, broker_url, grace_seconds=GRACE_SECONDS, http2=True
        ) as ingest,
        trio.open_nursery() as readers,
    ):
        socks = await stuck_readers(ingest.port, READERS // 2, h2_bundle_request())
        await flow_stalled(ingest.port, READERS // 2, readers)
        try:
            seconds = await ingest.sigterm_exit_seconds(GRACE_SECONDS + 10)
        finally:
            for sock in socks:
                sock.close()
            readers.cancel_scope.cancel()
        assert seconds is not None, "still running 10 s after the grace:\n" + ingest.log()
        assert seconds <= GRACE_SECONDS + 1, seconds


async def test_a_write_that_misses_the_write_timeout_closes_its_connection(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    async with ingest_process(
        tmp_path, database_url, broker_url, write_timeout_seconds=1
    ) as ingest:
        [sock] = await stuck_readers(ingest.port, 1, bundle_request())
        with sock:
            await ingest.wait_metric(
                1, "notifier_ingest_connections_closed_total", reason="write_timeout"
            )
            with trio.fail_after(10):
                assert await closed_by_server(sock)
        assert await ingest.metric("notifier_ingest_connections_open") == 1  # /metrics' own
        assert "Error in ASGI Framework" not in ingest.log()


async def test_an_http2_answer_stalled_by_a_shut_window_closes_its_connection(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    """Clients that read every byte but never open their flow-control window: nothing is
    written for them, so no write's deadline sees them; their connections are closed once they
    have made no progress for write_timeout_seconds (the readers then see the end)."""
    async with ingest_process(
        tmp_path, database_url, broker_url, http2=True, write_timeout_seconds=1
    ) as ingest:
        with trio.fail_after(20):
            async with trio.open_nursery() as readers:  # ends when the server closed them
                await flow_stalled(ingest.port, 2, readers)
        assert (
            await ingest.metric("notifier_ingest_connections_closed_total", reason="write_timeout")
            == 2
        )
    assert "Error in ASGI Framework" not in ingest.log()
