"""A TCP fault proxy for fault-injection tests: it sits between a client and a service on
127.0.0.1 and forwards bytes, delays them, drops them, resets connections or refuses them.

    async with open_fault_proxy("127.0.0.1", 5672) as proxy:
        ...connect to 127.0.0.1:proxy.port instead of 5672...
        await proxy.set_mode("latency", seconds=0.2)
        await proxy.set_mode("blackhole")
        await proxy.set_mode("pass")

Modes (``set_mode`` applies each one to the connections already open as well):

- ``pass``: bytes are forwarded as they are.
- ``latency`` (``seconds``): every chunk waits ``seconds`` before it is forwarded, in both
  directions; each direction is one task, so order is kept (and a direction forwards one chunk
  per delay at most).
- ``blackhole``: nothing is forwarded in either direction, end of stream included. Open
  connections stay open; what they send is read and dropped, and forwarding resumes (with the
  bytes that arrive after the change) when the mode changes again. New connections are accepted
  but never connected upstream: they are read and dropped until they close, whatever the mode
  becomes later.
- ``reset``: every open connection is closed abruptly on both sides (``SO_LINGER`` ``(1, 0)``
  then close, so the peer gets an RST), and every new one is reset as soon as it is accepted.
- ``refuse``: the listener is closed, so connecting is refused, and open connections are reset
  as in ``reset``. The next other mode listens again on the same port.

``set_mode`` returns once the change is in effect: the listener closed or open again, the
connections it resets closed.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal, get_args

import trio

Mode = Literal["pass", "latency", "blackhole", "reset", "refuse"]

_MODES: frozenset[str] = frozenset(get_args(Mode))
_CHUNK_BYTES = 65536
_LINGER_RESET = struct.pack("ii", 1, 0)


@dataclass(frozen=True)
class ProxyStatistics:
    """What the proxy has done since it started."""

    mode: Mode
    listening: bool
    connections_accepted: int
    connections_active: int
    bytes_to_upstream: int
    bytes_to_client: int
    bytes_dropped: int


def _abort(stream: trio.SocketStream) -> None:
    """Close ``stream`` at once with an RST instead of a FIN (no-op when already closed)."""
    sock = stream.socket
    if sock.fileno() == -1:
        return
    try:
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, _LINGER_RESET)
    finally:
        sock.close()


def _close(stream: trio.SocketStream) -> None:
    """Close ``stream`` without waiting (a FIN); safe in a cancelled scope."""
    stream.socket.close()


class _Connection:
    """One accepted client connection and, once connected, its upstream connection."""

    def __init__(self, client: trio.SocketStream) -> None:
        self.client = client
        self.upstream: trio.SocketStream | None = None
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.reset_requested = False

    def reset(self) -> None:
        """Reset both sides now and stop the tasks serving this connection."""
        self.reset_requested = True
        self.scope.cancel()
        self.close()

    def close(self) -> None:
        finish = _abort if self.reset_requested else _close
        finish(self.client)
        if self.upstream is not None:
            finish(self.upstream)


class _Listening:
    """The accept loop currently running, with what it takes to stop it."""

    def __init__(self, scope: trio.CancelScope, closed: trio.Event) -> None:
        self.scope = scope
        self.closed = closed


class FaultProxy:
    """A fault-injecting TCP proxy listening on 127.0.0.1 in front of one upstream address.

    Run it with ``open_fault_proxy`` (or ``await nursery.start(proxy.run)``).
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        if not ipaddress.ip_address(upstream_host).is_loopback:
            raise ValueError(f"upstream must be a loopback address, got {upstream_host!r}")
        self._upstream_host = upstream_host
        self._upstream_port = upstream_port
        self._mode: Mode = "pass"
        self._latency_seconds = 0.0
        self._port = 0
        self._nursery: trio.Nursery | None = None
        self._listening: _Listening | None = None
        self._connections: set[_Connection] = set()
        self._lock = trio.Lock()
        self._changed = trio.Event()
        self._accepted = 0
        self._bytes_to_upstream = 0
        self._bytes_to_client = 0
        self._bytes_dropped = 0

    @property
    def port(self) -> int:
        """The port the proxy listens on (the same for the proxy's whole life)."""
        if self._port == 0:
            raise RuntimeError("the proxy is not running")
        return self._port

    @property
    def mode(self) -> Mode:
        return self._mode

    def statistics(self) -> ProxyStatistics:
        return ProxyStatistics(
            mode=self._mode,
            listening=self._listening is not None,
            connections_accepted=self._accepted,
            connections_active=len(self._connections),
            bytes_to_upstream=self._bytes_to_upstream,
            bytes_to_client=self._bytes_to_client,
            bytes_dropped=self._bytes_dropped,
        )

    async def wait_statistics(
        self, predicate: Callable[[ProxyStatistics], bool]
    ) -> ProxyStatistics:
        """Wait until ``predicate(self.statistics())`` holds, and return those statistics."""
        while True:
            stats = self.statistics()
            if predicate(stats):
                return stats
            await self._changed.wait()

    async def set_mode(self, mode: Mode, **params: float) -> None:
        """Switch to ``mode``; ``latency`` takes ``seconds``, the other modes nothing.

        Returns once the change is in effect (see the module docstring)."""
        if mode not in _MODES:
            raise ValueError(f"unknown mode {mode!r}, expected one of {sorted(_MODES)}")
        expected = {"seconds"} if mode == "latency" else set()
        if set(params) != expected:
            raise TypeError(f"mode {mode!r} takes {sorted(expected)}, got {sorted(params)}")
        seconds = params.get("seconds", 0.0)
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        if self._nursery is None:
            raise RuntimeError("the proxy is not running")
        async with self._lock:
            self._mode = mode
            self._latency_seconds = seconds
            if mode == "refuse":
                await self._stop_listening()
            elif self._listening is None:
                await self._start_listening()
            if mode in ("reset", "refuse"):
                resets = list(self._connections)
                for connection in resets:
                    connection.reset()
                for connection in resets:
                    await connection.done.wait()
            self._notify()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled; ``task_status.started(port)`` once listening.

        On cancellation every connection and the listener are closed before this returns."""
        if self._nursery is not None:
            raise RuntimeError("the proxy is already running")
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._start_listening()
                task_status.started(self._port)
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._listening = None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _start_listening(self) -> None:
        assert self._nursery is not None
        listeners = await trio.open_tcp_listeners(self._port, host="127.0.0.1")
        [listener] = listeners
        self._port = listener.socket.getsockname()[1]
        self._listening = await self._nursery.start(self._accept_loop, listener)

    async def _stop_listening(self) -> None:
        listening, self._listening = self._listening, None
        if listening is not None:
            listening.scope.cancel()
            await listening.closed.wait()

    async def _accept_loop(
        self,
        listener: trio.SocketListener,
        *,
        task_status: trio.TaskStatus[_Listening],
    ) -> None:
        assert self._nursery is not None
        listening = _Listening(trio.CancelScope(), trio.Event())
        try:
            with listening.scope:
                task_status.started(listening)
                while True:
                    stream = await listener.accept()
                    self._nursery.start_soon(self._serve_connection, stream)
        finally:
            listener.socket.close()
            listening.closed.set()

    async def _serve_connection(self, client: trio.SocketStream) -> None:
        connection = _Connection(client)
        self._accepted += 1
        self._connections.add(connection)
        self._notify()
        try:
            with connection.scope:
                if self._mode in ("reset", "refuse"):
                    connection.reset()
                elif self._mode == "blackhole":
                    await self._drain(client)
                else:
                    await self._forward(connection)
        finally:
            connection.close()
            self._connections.discard(connection)
            connection.done.set()
            self._notify()

    async def _drain(self, client: trio.SocketStream) -> None:
        """Read and drop everything the client sends until it closes."""
        try:
            while data := await client.receive_some(_CHUNK_BYTES):
                self._bytes_dropped += len(data)
                self._notify()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _forward(self, connection: _Connection) -> None:
        try:
            upstream = await trio.open_tcp_stream(self._upstream_host, self._upstream_port)
        except OSError:
            connection.reset_requested = True
            return
        connection.upstream = upstream
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, connection, connection.client, upstream, True)
            nursery.start_soon(self._pump, connection, upstream, connection.client, False)

    async def _pump(
        self,
        connection: _Connection,
        source: trio.SocketStream,
        destination: trio.SocketStream,
        to_upstream: bool,
    ) -> None:
        """Copy one direction chunk by chunk, applying the mode in force for each chunk; a
        broken or closed side ends the whole connection."""
        try:
            while data := await source.receive_some(_CHUNK_BYTES):
                if self._mode == "latency":
                    await trio.sleep(self._latency_seconds)
                if self._mode not in ("pass", "latency"):
                    self._bytes_dropped += len(data)
                    self._notify()
                    continue
                await destination.send_all(data)
                if to_upstream:
                    self._bytes_to_upstream += len(data)
                else:
                    self._bytes_to_client += len(data)
                self._notify()
            if self._mode in ("pass", "latency"):
                await destination.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            connection.scope.cancel()


@asynccontextmanager
async def open_fault_proxy(upstream_host: str, upstream_port: int) -> AsyncIterator[FaultProxy]:
    """Run a ``FaultProxy`` in front of ``upstream_host:upstream_port`` for the block; on exit
    every connection and the listener are closed before this returns."""
    proxy = FaultProxy(upstream_host, upstream_port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
