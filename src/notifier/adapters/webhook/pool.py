"""The webhook client's pool of kept-alive connections (``client.WebhookClient`` uses it).

Connections are pooled by ``Origin`` (scheme, host, port, client identity), and one is reused
only when the address it was dialed at is among the addresses the request carries. Idle
connections expire after ``keepalive_seconds``, at most ``max_idle`` are kept (the least
recently used go first), and one that has something to read while idle is closed rather than
reused: the server closed it, or sent something nobody asked for. "Something to read" is the
socket's (the kernel holds bytes or the end of the stream) or, over TLS, the stream's own: a
server that sends its answer and its close_notify (or a stray answer) in one segment leaves
the second record inside the TLS stream, read from the socket with the first, and the socket
itself is then quiet.

Closing never waits on the peer and is done even in a cancelled scope (``close_stream``).
"""

from __future__ import annotations

import contextlib
import select
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from notifier.adapters.webhook.http11 import ResponseReader

BROKEN = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a request goes: the scheme, the host as dialed and verified (IDNA-mapped, an IPv6
    address without brackets), the port, and the client identity presented over TLS (a name
    of ``tls.Tls.identities``; None: no client certificate). Connections are pooled by origin,
    so one with an identity never serves a request without it, nor one with another."""

    scheme: str
    host: str
    port: int
    identity: str | None = None


class Connection:
    """A connection of the pool: its stream, the address it was dialed at, the reader of its
    answers."""

    __slots__ = ("address", "idle_since", "origin", "reader", "stream")

    def __init__(self, origin: Origin, address: str, stream: trio.abc.Stream) -> None:
        self.origin = origin
        self.address = address
        self.stream = stream
        self.reader = ResponseReader()
        self.idle_since = 0.0


def _socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    return stream.socket if isinstance(stream, trio.SocketStream) else None


def held_by_tls(stream: trio.abc.Stream) -> bool:
    """Whether a TLS stream holds data it read from its socket and has not handed out yet:
    decrypted bytes in the SSL object, or records not yet decrypted in its incoming buffer
    (trio's SSLStream reads whatever the socket has, and decrypts one record per read)."""
    if not isinstance(stream, trio.SSLStream):
        return False
    if stream.pending():
        return True
    incoming = getattr(stream, "_incoming", None)  # trio's MemoryBIO: no public accessor
    return isinstance(incoming, ssl.MemoryBIO) and incoming.pending > 0


def readable(stream: trio.abc.Stream) -> bool:
    """Whether an idle connection has something to read, in its TLS stream or its socket: the
    server closed it (or sent something nobody asked for). A stream that is neither a
    socket's nor TLS over a socket is taken as quiet."""
    if held_by_tls(stream):
        return True
    sock = _socket_of(stream)
    if sock is None:
        return False
    fd = sock.fileno()
    if fd < 0:
        return True  # closed under us: not reusable
    poller = select.poll()  # not select(): no limit on the descriptor's number
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


async def close_stream(stream: trio.abc.Stream, seconds: float) -> None:
    """Close ``stream`` even in a cancelled scope, without waiting on the peer: a TLS
    connection's socket is closed without a close_notify (HTTP marks its own ends)."""
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    with trio.CancelScope(shield=True), trio.move_on_after(seconds), contextlib.suppress(*BROKEN):
        await stream.aclose()


class Pool:
    """Idle connections by origin, at most ``max_idle``, each kept ``keepalive_seconds``;
    ``close_seconds`` bounds closing one."""

    def __init__(self, *, max_idle: int, keepalive_seconds: float, close_seconds: float) -> None:
        self._max_idle = max_idle
        self._keepalive = keepalive_seconds
        self._close_seconds = close_seconds
        # Idle connections by origin, and all of them, each oldest first (dicts as ordered sets).
        self._idle: dict[Origin, dict[Connection, None]] = {}
        self._lru: dict[Connection, None] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._lru)

    async def checkout(self, origin: Origin, addresses: Sequence[str]) -> Connection | None:
        """The most recently used idle connection to ``origin`` at one of ``addresses`` that is
        still good; stale ones on the way are closed."""
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = trio.current_time()
        found: Connection | None = None
        stale: list[Connection] = []
        for conn in reversed(idle):
            if (
                now - conn.idle_since < self._keepalive
                and conn.address in addresses
                and not readable(conn.stream)
            ):
                found = conn
                break
            if conn.address in addresses or now - conn.idle_since >= self._keepalive:
                stale.append(conn)
        for conn in [*stale, *([found] if found else [])]:
            del idle[conn]
            del self._lru[conn]
        if not idle:
            del self._idle[origin]
        for conn in stale:
            await self.discard(conn)
        return found

    async def checkin(self, conn: Connection) -> None:
        """Keep ``conn`` idle (closed at once once the pool is closed)."""
        if self._closed:
            await self.discard(conn)
            return
        conn.idle_since = now = trio.current_time()
        self._idle.setdefault(conn.origin, {})[conn] = None
        self._lru[conn] = None
        while self._lru:  # the oldest first: past the bound, or expired
            oldest = next(iter(self._lru))
            if len(self._lru) <= self._max_idle and now - oldest.idle_since < self._keepalive:
                break
            del self._lru[oldest]
            idle = self._idle[oldest.origin]
            del idle[oldest]
            if not idle:
                del self._idle[oldest.origin]
            await self.discard(oldest)

    async def discard(self, conn: Connection) -> None:
        await close_stream(conn.stream, self._close_seconds)

    async def aclose(self) -> None:
        self._closed = True
        conns, self._lru = list(self._lru), {}
        self._idle.clear()
        for conn in conns:
            await self.discard(conn)
