"""Serve the ingest app: notifier's own accept loop around hypercorn's handler of one connection.

hypercorn's ``serve`` runs every connection in one nursery, where anything a connection raises
(a protocol corner hypercorn does not handle) ends the whole server. Here the listening sockets
are bound once (:func:`open_listeners`) and outlive a restart of the server; each connection
runs inside a guard that ends that connection only (:mod:`notifier.ingest.connection`, with
the connection limits, bounded writes and one writer per connection); the rest is hypercorn's
graceful stop: the app's lifespan, ``WorkerContext.terminated`` and a deadline for requests in
flight, after which every connection still open is closed.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)
from hypercorn.utils import repr_socket_addr, wrap_app
from quart_trio import QuartTrio

from notifier.ingest.api.hot import ingest_routes
from notifier.ingest.connection import Server
from notifier.ingest.limits import ConnectionLimits
from notifier.lifecycle import Stop

if TYPE_CHECKING:
    from notifier.metrics import Metrics

log = logging.getLogger("notifier.ingest")

KEEP_ALIVE_SECONDS = 30.0
DEFAULT_WRITE_TIMEOUT_SECONDS = 30.0
# No connection limit (tests and embedders that pass none): more than descriptors can be.
UNBOUNDED = 2**31
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
    write_timeout_seconds: float = DEFAULT_WRITE_TIMEOUT_SECONDS,
    limits: ConnectionLimits | None = None,
    metrics: Metrics | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Serve on ``listeners`` until ``stop``; then stop accepting, close the
    idle connections and let requests in flight finish within ``grace_seconds``; at the end of
    the grace every connection still open is closed, whatever it is doing (a write to a client
    that does not read, an HTTP/2 stream stalled by flow control).

    A stop closes ``listeners`` (new connections are refused while requests drain); a failure
    leaves them open for the next run. ``limits`` bounds the connections (none without it)."""
    hc = HyperConfig()
    hc.graceful_timeout = grace_seconds
    hc.accesslog = None
    hc.errorlog = log
    hc.keep_alive_timeout = KEEP_ALIVE_SECONDS
    # The ingest routes answered in front of quart (``api.hot``); the rest goes on to ``app``.
    wrapped = wrap_app(shielded_sends(ingest_routes(app)), hc.wsgi_max_body_size, "asgi")
    lifespan = Lifespan(wrapped, hc, {})
    server = Server(
        wrapped, hc, lifespan, http2=http2, max_body_bytes=max_body_bytes,
        write_timeout_seconds=write_timeout_seconds,
        limits=limits or ConnectionLimits(max_total=UNBOUNDED, max_per_address=0),
        metrics=metrics,
    )  # fmt: skip
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            try:
                with stop.intake():
                    task_status.started()
                    await server.accept(listeners.trio_listeners(), connections)
            finally:
                if stop.is_set():
                    listeners.close()
                await server.terminate()
                # Cancelling is not enough: a shielded write waits for its own deadline.
                lifespan_nursery.start_soon(
                    _close_after, server, connections.cancel_scope, grace_seconds
                )
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def _close_after(server: Server, connections: trio.CancelScope, seconds: float) -> None:
    await trio.sleep(seconds)
    server.close_all()
    connections.cancel()


def shielded_sends(app: ASGIFramework) -> ASGIFramework:
    """``app``, with the sends of an answer after which the connection closes shielded from
    cancellation.

    quart-trio cancels a request's tasks as soon as its answer is sent, and hypercorn closes a
    connection that is not kept alive (HTTP/1.0, or ``Connection: close`` on either side) from
    inside that last ``send``: cancelled there, the close never happens, and the socket stays
    open until the client gives up. Answers on kept-alive connections are left alone: there the
    cancellation only skips hypercorn's idle timer (``Connection`` keeps its own), which would
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
