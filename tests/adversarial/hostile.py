"""A real `notifier run --role ingest` process and the hostile clients of its ingest port:
sockets with a tiny receive buffer that never read, raw HTTP/1.1 and HTTP/2 bytes."""

from __future__ import annotations

import fcntl
import re
import signal
import socket
import struct
import termios
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import httpx
import trio

from tests.chaos.harness import ServiceProcess, free_port, wait_ready, write_config
from tests.integration.conftest import poll

BUNDLE_PATH = "/docs/redoc.standalone.js"  # 1.1 MB: more than any socket buffer holds
START_SECONDS = 60.0


class Ingest:
    """A running ingest process: its port, its log, its ``/metrics``."""

    def __init__(self, process: ServiceProcess, port: int) -> None:
        self.process = process
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        return self.process.log()

    async def metric(self, name: str, **labels: str) -> float | None:
        """One sample of ``/metrics`` (on a connection of its own), or None if absent."""
        async with httpx.AsyncClient(base_url=self.base, timeout=10) as client:
            text = (await client.get("/metrics")).text
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if labels else "")
        found = re.search(rf"^{pattern} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else None

    async def wait_metric(self, value: float, name: str, **labels: str) -> None:
        async def reached() -> bool:
            return await self.metric(name, **labels) == value

        with trio.fail_after(20):
            await poll(reached)

    async def sigterm_exit_seconds(self, bound_seconds: float) -> float | None:
        """SIGTERM; the seconds until the process exited, or None if it had not within
        ``bound_seconds`` (it is then killed)."""
        started = trio.current_time()
        self.process.signal(signal.SIGTERM)
        code = await self.process.wait_exit(bound_seconds)
        if code is None:
            await self.process.stop(0)
            return None
        return trio.current_time() - started


@asynccontextmanager
async def ingest_process(
    tmp_path: Path,
    database_url: str,
    broker_url: str,
    *,
    grace_seconds: float = 2.0,
    **ingest: Any,
) -> AsyncIterator[Ingest]:
    port = free_port()
    config = write_config(tmp_path / "notifier.toml", {
        "service": {"shutdown_grace_seconds": grace_seconds},
        "database": {"url": database_url, "pool_max_size": 4},
        "broker": {"url": broker_url},
        "ingest": {"bind": f"127.0.0.1:{port}", **ingest},
        "logging": {"format": "console", "level": "INFO"},
    })  # fmt: skip
    process = ServiceProcess(config, tmp_path / "notifier.log", args=("run", "--role", "ingest"))
    process.start()
    try:
        await wait_ready(f"http://127.0.0.1:{port}", START_SECONDS)
        yield Ingest(process, port)
    finally:
        await process.stop(5)


def tiny_socket(source: str = "127.0.0.1") -> socket.socket:
    """A TCP socket whose receive buffer is as small as the kernel allows (set before the
    connect, so the window it announces is small too)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    sock.bind((source, 0))
    return sock


def readable_bytes(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive buffer."""
    buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    count: int = struct.unpack("i", buf)[0]
    return count


def bundle_request() -> bytes:
    return f"GET {BUNDLE_PATH} HTTP/1.1\r\nHost: t\r\n\r\n".encode()


def h2_bundle_request() -> bytes:
    """The bytes of an HTTP/2 (prior knowledge) connection asking for the bundle."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(
        1, [(":method", "GET"), (":path", BUNDLE_PATH), (":scheme", "http"), (":authority", "t")],
        end_stream=True,
    )  # fmt: skip
    return conn.data_to_send()


async def stuck_readers(port: int, count: int, request: bytes) -> list[socket.socket]:
    """``count`` connections that sent ``request`` and read nothing, returned once the answer
    has started to arrive on each (the server is then writing into a full socket)."""
    socks = []
    for _ in range(count):
        sock = tiny_socket()
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        socks.append(sock)

    async def arriving() -> bool:
        return all(readable_bytes(s) for s in socks)

    with trio.fail_after(20):
        await poll(arriving)
    return socks


async def closed_by_server(sock: socket.socket) -> bool:
    """Read ``sock`` (non-blocking) to its end: True once the server has closed it."""
    sock.setblocking(False)
    while True:
        try:
            if not sock.recv(1 << 20):
                return True
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
        except ConnectionResetError:
            return True
