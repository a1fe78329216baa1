"""SIGTERM while deliveries are in flight loses nothing: a real `notifier run` process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from notifier.testing import open_sink
from tests.integration.conftest import create_tenant, poll, scalar, sql, verify_all

EVENTS = 40


def write_config(path: Path, database_url: str, broker_url: str, port: int) -> None:
    path.write_text(
        f"""
[service]
shutdown_grace_seconds = 8

[database]
url = "{database_url}"

[broker]
url = "{broker_url}"

[ingest]
bind = "127.0.0.1:{port}"

[relay]
poll_interval_seconds = 0.5

[workers.webhook]
concurrency = 4
prefetch = 16
timeout_seconds = 5
allow_private_networks = true
# one slow receiver may hold every task: each of the four holds a delivery at the SIGTERM
max_in_flight_per_destination = 4
"""
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_notifier(config_path: Path, log: Path) -> trio.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    with log.open("ab") as out:
        return await trio.lowlevel.open_process(
            [sys.executable, "-m", "notifier", "run", "--config", str(config_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def read_log(log: Path | None) -> str:
    return log.read_text(errors="replace") if log else ""


async def wait_ready(
    base: str, process: trio.Process | None = None, log: Path | None = None
) -> None:
    """Return once ``/healthz`` answers 200; fail at once (showing ``log``) if ``process``
    exits first."""
    async with httpx.AsyncClient(base_url=base) as client:

        async def healthy() -> bool:
            if process is not None and process.returncode is not None:
                raise AssertionError(f"notifier exited {process.returncode}:\n{read_log(log)}")
            try:
                return (await client.get("/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        with trio.fail_after(30):
            await poll(healthy)


async def test_sigterm_with_deliveries_in_flight_loses_nothing(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    port = free_port()
    config_path = tmp_path / "notifier.toml"
    log = tmp_path / "notifier.log"
    write_config(config_path, database_url, broker_url, port)
    base = f"http://127.0.0.1:{port}"
    key = await create_tenant(database_url)

    async with open_sink(delay_seconds=1.0) as sink:
        proc = await start_notifier(config_path, log)
        try:
            await wait_ready(base)
            async with httpx.AsyncClient(
                base_url=base, headers={"Authorization": f"Bearer {key}"}
            ) as api:
                ch = await api.post(
                    "/v1/channels", json={"type": "webhook", "config": {"url": sink.url}}
                )
                assert ch.status_code == 201, ch.text
                secret = ch.json()["config"]["secret"]
                for i in range(EVENTS):
                    resp = await api.post("/v1/events", json={"type": "t.x", "payload": {"i": i}})
                    assert resp.status_code == 202, resp.text
            with trio.fail_after(20):
                await sink.wait_for(4)  # the four workers are each holding one delivery
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(15):
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
        assert code == 0, log.read_text()
        delivered_before = {
            r[0]
            for r in await sql(database_url, "SELECT id FROM deliveries WHERE status = 'DELIVERED'")
        }
        assert delivered_before, "the in-flight deliveries finished within the grace period"
        assert len(delivered_before) < EVENTS, "some deliveries were still queued at shutdown"

        async def all_delivered() -> bool:
            query = "SELECT count(*) FROM deliveries WHERE status = 'DELIVERED'"
            return bool(await scalar(database_url, query) == EVENTS)

        sink.delay_seconds = 0.0
        proc = await start_notifier(config_path, log)
        try:
            with trio.fail_after(30):
                await poll(all_delivered)
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(15):
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()

    ids = {str(r[0]) for r in await sql(database_url, "SELECT id FROM deliveries")}
    received = [r.headers["webhook-id"] for r in sink.received]
    assert set(received) == ids  # every accepted event reached the receiver
    assert len(received) == len(set(received)), "a graceful shutdown causes no duplicates"
    verify_all(sink.received, secret)
    assert (await sql(database_url, "SELECT count(*) FROM outbox"))[0][0] == 0


async def read_response(stream: trio.SocketStream, buffer: bytearray) -> tuple[bytes, bytes]:
    """The next response head and body (by its Content-Length) on ``stream``; ``buffer`` keeps
    what came after them."""
    while b"\r\n\r\n" not in buffer:
        chunk = await stream.receive_some(65536)
        assert chunk, f"closed after {bytes(buffer)!r}"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lengths = [line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")]
    length = int(lengths[0].partition(b":")[2]) if lengths else 0
    while len(rest) < length:
        chunk = await stream.receive_some(65536)
        assert chunk, f"closed after {head + rest!r}"
        rest += chunk
    buffer[:] = rest[length:]
    return head, rest[:length]


async def test_sigterm_closes_idle_connections_at_once_and_lets_requests_finish(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    port = free_port()
    config_path, log = tmp_path / "notifier.toml", tmp_path / "notifier.log"
    write_config(config_path, database_url, broker_url, port)  # a grace of 8 s
    key = await create_tenant(database_url)
    body = b'{"type": "t.x", "payload": {}}'
    proc = await start_notifier(config_path, log)
    try:
        await wait_ready(f"http://127.0.0.1:{port}")
        async with (
            await trio.open_tcp_stream("127.0.0.1", port) as idle,
            await trio.open_tcp_stream("127.0.0.1", port) as busy,
        ):
            idle_buffer, busy_buffer = bytearray(), bytearray()
            # A kept-alive connection, idle after its answer.
            await idle.send_all(b"GET /healthz HTTP/1.1\r\nHost: notifier\r\n\r\n")
            with trio.fail_after(10):
                head, _ = await read_response(idle, idle_buffer)
            assert head.startswith(b"HTTP/1.1 200 "), head
            # A request in flight: its head is in (the server invited the body), not its body.
            await busy.send_all(
                b"POST /v1/events HTTP/1.1\r\nHost: notifier\r\nAuthorization: Bearer %s\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                b"Expect: 100-continue\r\n\r\n" % (key.encode(), len(body))
            )
            with trio.fail_after(10):
                head, _ = await read_response(busy, busy_buffer)
            assert head.startswith(b"HTTP/1.1 100 "), head
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(2):  # at once, not after the grace period
                while chunk := await idle.receive_some(65536):
                    idle_buffer += chunk
            assert not idle_buffer, "closed without a word"
            await busy.send_all(body)
            with trio.fail_after(5):
                head, _ = await read_response(busy, busy_buffer)
                assert head.startswith(b"HTTP/1.1 202 "), head
                code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0, log.read_text()
    assert await scalar(database_url, "SELECT count(*) FROM events") == 1
