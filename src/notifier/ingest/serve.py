"""Serve the ingest app: notifier's own accept loop around hypercorn's handler of one connection.

hypercorn's ``serve`` runs every connection in one nursery, where anything a connection raises
(a protocol corner hypercorn does not handle) ends the whole server. Here the listening sockets
are bound once (:func:`open_listeners`) and outlive a restart of the server; each connection
runs inside a guard that ends that connection only; the rest is hypercorn's graceful stop: the
app's lifespan, ``WorkerContext.terminated`` and a deadline for requests in flight.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Mapping
from typing import cast

import h11
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.events import Closed, Updated
from hypercorn.events import Event as HyperEvent
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import (
    AppWrapper,
    ASGIFramework,
    ASGIReceiveCallable,
    ASGISendCallable,
    ASGISendEvent,
    ConnectionState,
    Scope,
)
from hypercorn.utils import repr_socket_addr, wrap_app
from quart_trio import QuartTrio

from notifier.lifecycle import Stop

log = logging.getLogger("notifier.ingest")

KEEP_ALIVE_SECONDS = 30.0
# The listening sockets a process of a launch inherits from its parent (``notifier.launch``):
# their file descriptors, comma separated.
LISTEN_FDS_ENV = "NOTIFIER_LISTEN_FDS"


class Listeners:
    """The ingest server's listening sockets: bound once, kept while the server restarts.

    Each run of the server accepts on duplicates of them, which it closes when it ends; the
    sockets themselves (and the connections waiting in their backlog) stay until :meth:`close`.
    """

    def __init__(self, sockets: list[socket.socket]) -> None:
        self._sockets = sockets

    @property
    def binds(self) -> list[str]:
        return [f"http://{repr_socket_addr(s.family, s.getsockname())}" for s in self._sockets]

    def filenos(self) -> list[int]:
        return [s.fileno() for s in self._sockets]

    def trio_listeners(self) -> list[trio.SocketListener]:
        return [trio.SocketListener(trio.socket.from_stdlib_socket(s.dup())) for s in self._sockets]

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> Listeners:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_listeners(bind: str, environ: Mapping[str, str] = os.environ) -> Listeners:
    """Bind and listen on ``bind`` (``HOST:PORT``); raises ``OSError`` when the port is taken.

    In a process of a launch (``$NOTIFIER_LISTEN_FDS`` set) the sockets are the ones the parent
    bound, inherited: every process of the launch accepts on the same port."""
    if fds := environ.get(LISTEN_FDS_ENV):
        return adopt_listeners(fds)
    hc = HyperConfig()
    hc.bind = [bind]
    sockets = hc.create_sockets().insecure_sockets
    try:
        for sock in sockets:
            sock.listen(hc.backlog)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return Listeners(sockets)


def adopt_listeners(fds: str) -> Listeners:
    """The listening sockets whose file descriptors ``fds`` (comma separated) names."""
    numbers = fds.split(",")
    if not all(fd.strip().isdigit() for fd in numbers):
        raise OSError(f"{LISTEN_FDS_ENV}: {fds!r} is not a list of file descriptors")
    sockets: list[socket.socket] = []
    for fd in numbers:
        sock = socket.socket(fileno=int(fd))
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) != 1:
            sock.detach()
            for adopted in sockets:
                adopted.close()
            raise OSError(f"{LISTEN_FDS_ENV}: file descriptor {fd} is not a listening socket")
        sockets.append(sock)
    return Listeners(sockets)


async def serve_ingest(
    app: QuartTrio,
    listeners: Listeners,
    stop: Stop,
    *,
    grace_seconds: float,
    http2: bool,
    max_body_bytes: int,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Serve on ``listeners`` until ``stop``; then stop accepting, close the
    idle connections and let requests in flight finish within ``grace_seconds``.

    A stop closes ``listeners`` (new connections are refused while requests drain); a failure
    leaves them open for the next run."""
    hc = HyperConfig()
    hc.graceful_timeout = grace_seconds
    hc.accesslog = None
    hc.errorlog = log
    hc.keep_alive_timeout = KEEP_ALIVE_SECONDS
    wrapped = wrap_app(shielded_sends(app), hc.wsgi_max_body_size, "asgi")
    lifespan = Lifespan(wrapped, hc, {})
    server = _Server(wrapped, hc, lifespan, http2=http2, max_body_bytes=max_body_bytes)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            try:
                with stop.intake():
                    task_status.started()
                    await server.accept(listeners, connections)
            finally:
                if stop.is_set():
                    listeners.close()
                await server.terminate()
                connections.cancel_scope.deadline = trio.current_time() + grace_seconds
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


class _Server:
    """What the connections of one run of the server share."""

    def __init__(
        self,
        app: AppWrapper,
        hc: HyperConfig,
        lifespan: Lifespan,
        *,
        http2: bool,
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self.hc = hc
        self.lifespan = lifespan
        self.context = WorkerContext(None)
        self.http2 = http2
        self.max_body_bytes = max_body_bytes
        self.live: set[_Connection] = set()

    async def terminate(self) -> None:
        """Tell every connection that the server stops: idle ones close at once."""
        await self.context.terminated.set()
        for conn in list(self.live):
            conn.poke()

    async def accept(self, listeners: Listeners, connections: trio.Nursery) -> None:
        """Accept connections until cancelled, each handled in ``connections``."""
        await trio.serve_listeners(
            self.handle, listeners.trio_listeners(), handler_nursery=connections
        )

    async def handle(self, stream: trio.SocketStream) -> None:
        """Run one connection. Whatever its protocol handling raises ends this connection
        only: logged once, without a traceback (hostile clients can repeat it at will) and
        without the exception's text, which may quote what the client sent."""
        peer = _peer(stream)
        state = ConnectionState(self.lifespan.state.copy())
        conn = _Connection(self, stream, state)
        self.live.add(conn)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.close_when_due)
                await conn.run()
                nursery.cancel_scope.cancel()
        except* Exception as group:
            names = ", ".join(sorted({type(e).__name__ for e in _leaves(group)}))
            log.warning("ingest: closed a connection from %s after a protocol error (%s)",
                        peer, names)  # fmt: skip
            log.debug("ingest: the protocol error", exc_info=group)
        finally:
            self.live.discard(conn)
            await trio.aclose_forcefully(stream)


class _Connection(TCPServer):
    """hypercorn's handler of one connection, with two things decided by notifier: when the
    connection closes, and what HTTP/1.1 requests may start (see :class:`_H11Connection`).

    hypercorn closes a connection, and restarts its idle timer, from inside the task of the
    request that ends, and quart-trio cancels that task once its answer is sent: the close can
    be cut short (the socket stays open until the client leaves) and the idle timer may never
    run again after a kept-alive answer. The ``Closed`` and ``Updated`` events that ask for
    these are seen here before anything that can be cancelled, and :meth:`close_when_due`
    closes the connection when hypercorn has asked to, when it has been idle for the
    keep-alive timeout, or at once when it is idle as the server stops."""

    def __init__(self, server: _Server, stream: trio.SocketStream, state: ConnectionState) -> None:
        # Typed for TLS streams, hypercorn takes plain ones as well (it tells them apart).
        tls_typed = cast("trio.SSLStream[trio.SocketStream]", stream)
        super().__init__(server.app, server.hc, server.context, state, tls_typed)
        self._server = server
        self._idle = True
        self._closing = False
        self._changed = trio.Event()

    def poke(self) -> None:
        """Wake :meth:`close_when_due` to look again."""
        self._changed.set()
        self._changed = trio.Event()

    async def protocol_send(self, event: HyperEvent) -> None:
        if isinstance(event, Updated) and event.idle != self._idle:
            self._idle = event.idle
            self.poke()
        elif isinstance(event, Closed):
            self._closing = True
            self.poke()
        await super().protocol_send(event)

    async def _read_data(self) -> None:
        # Called once, after the protocol is set up and before the first byte is read.
        protocol = self.protocol.protocol
        if isinstance(protocol, H11Protocol):
            protocol.connection = _H11Connection(
                http2=self._server.http2,
                max_body_bytes=self._server.max_body_bytes,
                max_incomplete_event_size=self.config.h11_max_incomplete_size,
            )
        await super()._read_data()

    async def close_when_due(self) -> None:
        while not self._closing:
            changed = self._changed
            if not self._idle:
                await changed.wait()
                continue
            if self._server.context.terminated.is_set():
                break
            with trio.move_on_after(self.config.keep_alive_timeout) as timer:
                await changed.wait()
            if timer.cancelled_caught:
                break
        await self.stream.aclose()


class _H11Connection(h11.Connection):
    """h11's server side, deciding what hypercorn would decide on its own about a request.

    - With ``http2`` off, a request never switches the connection to HTTP/2: an ``Upgrade: h2c``
      is ignored (the request is answered in HTTP/1.1, as RFC 9110 allows) and the HTTP/2
      preface (``PRI * HTTP/2.0``) is refused with ``505`` and the connection closed.
    - ``Expect: 100-continue`` does not invite a body whose ``Content-Length`` is over
      ``max_body_bytes``: the answer is a refusal whatever the body (``413``, or ``401``), and
      hypercorn would send ``100 Continue`` before the app has seen the request. (Other early
      refusals, such as a missing key, still invite it: the app reads what is left of a body
      before it answers, so the connection can carry the next request.)
    """

    def __init__(self, *, http2: bool, max_body_bytes: int, max_incomplete_event_size: int):
        super().__init__(h11.SERVER, max_incomplete_event_size=max_incomplete_event_size)
        self._http2 = http2
        self._max_body_bytes = max_body_bytes
        self._uninvited = False

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        event = super().next_event()
        if isinstance(event, h11.Request):
            self._uninvited = _over_the_limit(event, self._max_body_bytes)
            if not self._http2:
                if event.http_version not in (b"1.0", b"1.1"):
                    raise h11.RemoteProtocolError("HTTP/2 is off", error_status_hint=505)
                event = _without_h2c_upgrade(event)
        return event

    @property
    def they_are_waiting_for_100_continue(self) -> bool:
        return bool(super().they_are_waiting_for_100_continue) and not self._uninvited


def _over_the_limit(request: h11.Request, max_body_bytes: int) -> bool:
    lengths = [v for n, v in request.headers if n == b"content-length"]
    return bool(lengths) and lengths[0].isdigit() and int(lengths[0]) > max_body_bytes


def _without_h2c_upgrade(request: h11.Request) -> h11.Request:
    headers = [
        (n, v) for n, v in request.headers if not (n == b"upgrade" and v.strip().lower() == b"h2c")
    ]
    if len(headers) == len(request.headers):
        return request
    return h11.Request(
        method=request.method, target=request.target, headers=headers,
        http_version=request.http_version,
    )  # fmt: skip


def _leaves(group: BaseExceptionGroup[Exception]) -> list[Exception]:
    leaves: list[Exception] = []
    for exc in group.exceptions:
        leaves.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves


def _peer(stream: trio.SocketStream) -> str:
    try:
        return repr_socket_addr(stream.socket.family, stream.socket.getpeername())
    except OSError:
        return "an unknown peer"


def shielded_sends(app: ASGIFramework) -> ASGIFramework:
    """``app``, with the sends of an answer after which the connection closes shielded from
    cancellation.

    quart-trio cancels a request's tasks as soon as its answer is sent, and hypercorn closes a
    connection that is not kept alive (HTTP/1.0, or ``Connection: close`` on either side) from
    inside that last ``send``: cancelled there, the close never happens, and the socket stays
    open until the client gives up. Answers on kept-alive connections are left alone: there the
    cancellation only skips hypercorn's idle timer (``_Connection`` keeps its own), which would
    otherwise hold a socket the client has closed for ``keep_alive_timeout``."""

    async def wrapped(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        closing = scope["type"] == "http" and (
            scope["http_version"] == "1.0" or _says_close(scope["headers"])
        )

        async def send_shielded(message: ASGISendEvent) -> None:
            nonlocal closing
            if message["type"] == "http.response.start" and _says_close(message["headers"]):
                closing = True
            if not closing:
                await send(message)
                return
            with trio.CancelScope(shield=True):
                await send(message)

        await app(scope, receive, send_shielded)

    return wrapped


def _says_close(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(
        name.lower() == b"connection" and b"close" in value.lower() for name, value in headers
    )
