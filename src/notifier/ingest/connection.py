"""One connection of the ingest server: hypercorn's handler of it, with what notifier decides.

- **Admission**: over the connection limits (:mod:`notifier.ingest.limits`) a new connection
  is closed at once, before anything of it is read.
- **One writer**: every write on the socket and its close (``send_eof``, then ``aclose``) take
  one lock per connection. hypercorn locks its ``send_all`` calls only: its close, started by
  the task that read a half-close or a bad byte, ran ``send_eof`` while the task of a response
  was writing, and one of the two failed with ``BusyResourceError``. A close started that way
  (the read side, not the response) waits for a begun HTTP/1.1 response to end first.
- **Bounded writes**: each write keeps hypercorn's shield (a cancelled request does not cut an
  answer in half) but has a deadline, ``ingest.write_timeout_seconds``; a write that misses it
  closes the connection. An HTTP/2 connection whose answers wait on a flow-control window the
  client keeps shut is closed alike, once it has made no progress for that long (it writes
  nothing, so no write's deadline sees it; :meth:`Connection.close_when_due` looks). At the end
  of a stop's grace every connection is closed, whatever it is doing
  (:meth:`Server.close_all`).
- **When it closes** (:meth:`Connection.close_when_due`): hypercorn closes a connection, and
  restarts its idle timer, from inside the task of the request that ends, and quart-trio
  cancels that task once its answer is sent: the close can be cut short and the idle timer may
  never run again after a kept-alive answer. The ``Closed`` and ``Updated`` events are seen
  here before anything that can be cancelled, and the connection closes when hypercorn has
  asked to, when it has been idle for the keep-alive timeout, or at once when it is idle as the
  server stops. hypercorn's own idle timer, a task it starts again after every answer, is left
  stopped: this one keeps the time instead.
- **One write per answer**: :class:`H11Connection` keeps an HTTP/1.1 answer's head and hands
  it over with the body (or the end) that follows it, and hypercorn's empty writes (the end of
  an answer whose length was given) reach no socket.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING, cast

import h2.exceptions
import h11
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.events import Closed, RawData, Updated
from hypercorn.events import Event as HyperEvent
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState
from hypercorn.utils import repr_socket_addr

from notifier.ingest.limits import ConnectionLimits

if TYPE_CHECKING:
    from notifier.metrics import Metrics

log = logging.getLogger("notifier.ingest")


class Server:
    """What the connections of one run of the server share."""

    def __init__(
        self,
        app: AppWrapper,
        hc: HyperConfig,
        lifespan: Lifespan,
        *,
        http2: bool,
        max_body_bytes: int,
        write_timeout_seconds: float,
        limits: ConnectionLimits,
        metrics: Metrics | None,
    ) -> None:
        self.app = app
        self.hc = hc
        self.lifespan = lifespan
        self.context = WorkerContext(None)
        self.http2 = http2
        self.max_body_bytes = max_body_bytes
        self.write_timeout_seconds = write_timeout_seconds
        self.limits = limits
        self.metrics = metrics
        self.live: set[Connection] = set()

    async def terminate(self) -> None:
        """Tell every connection that the server stops: idle ones close at once."""
        await self.context.terminated.set()
        for conn in list(self.live):
            conn.poke()

    async def accept(self, listeners: list[trio.SocketListener], nursery: trio.Nursery) -> None:
        """Accept connections until cancelled, each handled in ``nursery``."""
        await trio.serve_listeners(self.handle, listeners, handler_nursery=nursery)

    def close_all(self) -> None:
        """Close every connection now, whatever it is doing (the end of a stop's grace)."""
        for conn in list(self.live):
            conn.close_now("shutdown")

    async def handle(self, stream: trio.SocketStream) -> None:
        """Run one connection. Whatever its protocol handling raises ends this connection
        only: logged once, without a traceback (hostile clients can repeat it at will) and
        without the exception's text, which may quote what the client sent."""
        address = _address(stream)
        refusal = self.limits.admit(address)
        if refusal is not None:
            if self.metrics is not None:
                self.metrics.ingest_connections_refused.labels(refusal).inc()
            await trio.aclose_forcefully(stream)
            return
        if self.metrics is not None:
            self.metrics.ingest_connections_open.inc()
        state = ConnectionState(self.lifespan.state.copy())
        conn = Connection(self, stream, state)
        self.live.add(conn)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.close_when_due)
                await conn.run()
                nursery.cancel_scope.cancel()
        except* Exception as group:
            names = ", ".join(sorted({type(e).__name__ for e in _leaves(group)}))
            log.warning("ingest: closed a connection from %s after a protocol error (%s)",
                        _peer(stream), names)  # fmt: skip
            log.debug("ingest: the protocol error", exc_info=group)
        finally:
            self.live.discard(conn)
            self.limits.release(address)
            if self.metrics is not None:
                self.metrics.ingest_connections_open.dec()
            await trio.aclose_forcefully(stream)


class Connection(TCPServer):
    """hypercorn's handler of one connection, with the writes, the close and the HTTP/1.1
    requests that may start decided by notifier (see the module and :class:`H11Connection`)."""

    def __init__(self, server: Server, stream: trio.SocketStream, state: ConnectionState) -> None:
        # Typed for TLS streams, hypercorn takes plain ones as well (it tells them apart).
        tls_typed = cast("trio.SSLStream[trio.SocketStream]", stream)
        super().__init__(server.app, server.hc, server.context, state, tls_typed)
        self._server = server
        self._socket_stream = stream
        self._idle = True
        self._closing = False
        self._closed = False
        self._changed = trio.Event()
        self._wrote = trio.Event()
        # Since when every HTTP/2 answer with data to send has waited on a shut window.
        self._stalled_since: float | None = None
        # The one writer: every send_all, send_eof and close of the socket holds it.
        self._writer = trio.Lock()

    def poke(self) -> None:
        """Wake :meth:`close_when_due` to look again."""
        self._changed.set()
        self._changed = trio.Event()

    def close_now(self, reason: str) -> None:
        """Close the socket at once, whatever is writing or reading on it (both wake with
        ``ClosedResourceError``), and count it under ``reason``."""
        if self._closed:
            return
        self._closed = True
        if self._server.metrics is not None:
            self._server.metrics.ingest_connections_closed.labels(reason).inc()
        log.info("ingest: closed a connection from %s (%s)", _peer(self._socket_stream), reason)
        self._socket_stream.socket.close()
        self._closing = True
        self.poke()

    async def protocol_send(self, event: HyperEvent) -> None:
        if isinstance(event, RawData):
            await self._write(event.data)
        elif isinstance(event, Closed):
            try:
                await self._close()
            finally:
                # A close cut short (a request task cancelled once its answer is sent) is
                # finished by close_when_due.
                self._closing = True
                self.poke()
            await self.protocol.handle(Closed())
        else:
            if isinstance(event, Updated):
                # Every time, not only when idle changes: the protocol may have changed under
                # it (HTTP/1.1 to HTTP/2), and with it how close_when_due watches.
                self._idle = event.idle
                self.poke()
                if event.idle:
                    # close_when_due keeps the idle timer: hypercorn's own would cost a task
                    # started after every answer. (The one it starts with the connection is
                    # stopped by the first request, below.)
                    return
            await super().protocol_send(event)

    async def _write(self, data: bytes) -> None:
        if not data:  # an answer's end with its length given, or a head kept for its body
            self._wrote.set()
            self._wrote = trio.Event()
            return
        failed = False
        async with self._writer:
            # hypercorn's shield (a cancelled request still ends its answer), with a deadline.
            deadline = trio.current_time() + self._server.write_timeout_seconds
            with trio.CancelScope(deadline=deadline, shield=True) as scope:
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    failed = True
            self._wrote.set()
            self._wrote = trio.Event()
        if scope.cancelled_caught:
            self.close_now("write_timeout")
            failed = True
        if failed:
            await self.protocol.handle(Closed())

    async def _close(self) -> None:
        if self._response_begun():
            # Started by the read side (a half-close, a bad byte): the response's own task
            # closes the connection once its answer is written.
            with trio.move_on_after(self._server.write_timeout_seconds):
                while self._response_begun() and not self._closed:
                    await self._wrote.wait()
        async with self._writer:
            deadline = trio.current_time() + self._server.write_timeout_seconds
            gone = contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError)
            with trio.CancelScope(deadline=deadline, shield=True), gone:
                await self._socket_stream.send_eof()
            await self._socket_stream.aclose()  # closes before its checkpoint

    def _stall_check_seconds(self) -> float:
        """How often a busy connection looks for a stall: HTTP/2 only (an HTTP/1.1 answer is
        bounded by its writes)."""
        if isinstance(self._inner(), H2Protocol):
            return min(1.0, self._server.write_timeout_seconds / 4)
        return math.inf

    def _stalled_too_long(self) -> bool:
        """Every HTTP/2 stream with data to send has waited on a flow-control window of zero
        (its own or the connection's) for ``write_timeout_seconds``, none of them sending."""
        inner = self._inner()
        if not isinstance(inner, H2Protocol):
            return False
        stalled, waiting = True, False
        for stream_id, buffer in list(inner.stream_buffers.items()):
            if not buffer.buffer:
                continue
            waiting = True
            try:
                window = inner.connection.local_flow_control_window(stream_id)
            except (h2.exceptions.H2Error, KeyError):
                continue
            stalled = stalled and window <= 0
        now = trio.current_time()
        if not (waiting and stalled):
            self._stalled_since = None
            return False
        if self._stalled_since is None:
            self._stalled_since = now
        return now - self._stalled_since >= self._server.write_timeout_seconds

    def _inner(self) -> object:
        protocol = getattr(self, "protocol", None)
        return protocol.protocol if protocol is not None else None

    def _response_begun(self) -> bool:
        """An HTTP/1.1 response has started and not ended, and its task may still write it
        (hypercorn's task group of the connection is open)."""
        protocol = getattr(self, "protocol", None)
        inner = protocol.protocol if protocol is not None else None
        tasks = getattr(self, "_task_group", None)
        return (
            isinstance(inner, H11Protocol)
            and inner.stream is not None
            and inner.connection.our_state is h11.SEND_BODY
            and tasks is not None
            and tasks._nursery is not None
        )

    async def _read_data(self) -> None:
        # Called once, after the protocol is set up and before the first byte is read.
        protocol = self.protocol.protocol
        if isinstance(protocol, H11Protocol):
            protocol.connection = H11Connection(
                http2=self._server.http2,
                max_body_bytes=self._server.max_body_bytes,
                max_incomplete_event_size=self.config.h11_max_incomplete_size,
            )
        await super()._read_data()

    async def close_when_due(self) -> None:
        while not self._closing:
            changed = self._changed
            if not self._idle:
                if self._stalled_too_long():
                    self.close_now("write_timeout")
                    break
                with trio.move_on_after(self._stall_check_seconds()):
                    await changed.wait()
                continue
            if self._server.context.terminated.is_set():
                break
            with trio.move_on_after(self.config.keep_alive_timeout) as timer:
                await changed.wait()
            if timer.cancelled_caught:
                break
        async with self._writer:
            await self.stream.aclose()


class H11Connection(h11.Connection):
    """h11's server side, deciding what hypercorn would decide on its own about a request.

    - With ``http2`` off, a request never switches the connection to HTTP/2: an ``Upgrade: h2c``
      is ignored (the request is answered in HTTP/1.1, as RFC 9110 allows) and the HTTP/2
      preface (``PRI * HTTP/2.0``) is refused with ``505`` and the connection closed.
    - ``Expect: 100-continue`` does not invite a body whose ``Content-Length`` is over
      ``max_body_bytes``: the answer is a refusal whatever the body (``413``, or ``401``), and
      hypercorn would send ``100 Continue`` before the app has seen the request. (Other early
      refusals, such as a missing key, still invite it: the app reads what is left of a body
      before it answers, so the connection can carry the next request.)
    - A final answer's head is sent with what follows it (:meth:`send_with_data_passthrough`).
    """

    def __init__(self, *, http2: bool, max_body_bytes: int, max_incomplete_event_size: int):
        super().__init__(h11.SERVER, max_incomplete_event_size=max_incomplete_event_size)
        self._http2 = http2
        self._max_body_bytes = max_body_bytes
        self._uninvited = False
        # The head of the answer begun, not sent yet (``send_with_data_passthrough``).
        self._head: list[bytes] = []

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        event = super().next_event()
        if isinstance(event, h11.Request):
            self._uninvited = _over_the_limit(event, self._max_body_bytes)
            if not self._http2:
                if event.http_version not in (b"1.0", b"1.1"):
                    raise h11.RemoteProtocolError("HTTP/2 is off", error_status_hint=505)
                event = _without_h2c_upgrade(event)
        return event

    def send_with_data_passthrough(self, event: h11.Event) -> list[bytes] | None:
        """``event``'s bytes (``send`` joins them); a final answer's head is kept and sent with
        what follows it (its body, or its end), so that an answer takes one write, not two.
        Every answer of the app sends its body right after its head (none streams, none waits
        between the two)."""
        data = super().send_with_data_passthrough(event)
        if isinstance(event, h11.Response) and data:
            self._head = data
            return []
        if self._head:
            head, self._head = self._head, []
            return head + (data or [])
        return data

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


def _address(stream: trio.SocketStream) -> str:
    """The client's address (no port): what ``ingest.max_connections_per_address`` counts."""
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:
        return "unknown"


def _peer(stream: trio.SocketStream) -> str:
    try:
        return repr_socket_addr(stream.socket.family, stream.socket.getpeername())
    except OSError:
        return "an unknown peer"
