"""The webhook's HTTP/1.1 client: ``http11`` over trio streams, a bounded pool of kept-alive
connections, and connections dialed only at the addresses the SSRF guard checked.

Why not httpx: a POST through httpx's client layers and httpcore's pool cost several times the
CPU of the same request written with h11 over a trio stream (``bench/webhook_client.py``), and
h11's general state machine itself four to five times what ``http11`` costs for one exchange
(about 60 µs against 14 µs, a signed POST and a 200); a webhook needs none of what those layers
add (redirects, cookies, environment proxies, decoding, HTTP/2; the egress proxy is a dialer,
``proxy.ProxyDialer``).
What it does need is here, in one place:

- pinning (docs/architecture.md §9): a request carries the addresses the adapter resolved and
  checked; a new connection is dialed at those only, in order, and never resolves a name; a
  kept-alive connection is reused only when the address it was dialed at is among them;
- the URL is not rewritten: ``Host``, TLS SNI and certificate verification are for the hostname;
- redirects are answers like any other (never followed);
- one deadline: the caller gives the attempt's absolute deadline, and the connect (each of
  several addresses gets an equal share of what is left), the TLS handshake, the request, every
  informational answer and the body all end at it; the timeout's error names the phase it cut
  (``PHASES``). At most ``MAX_INFORMATIONAL`` 1xx answers are read before the final one (a
  server streaming ``102 Processing`` is cut off at once, not parsed until the deadline).
  There is no pool wait: a delivery that finds no idle connection dials a new one (the
  worker's concurrency bounds how many are busy);
- a bounded body read: an answer is read up to ``max_body_bytes`` and the connection then
  closed, the rest never read; only an excerpt is kept;
- keep-alive: a connection goes back to the pool (``pool.Pool``) only when both sides
  finished the exchange (not after ``Connection: close``, an HTTP/1.0 answer, an answer
  delimited by the close, an error or a cut body); idle connections expire after
  ``keepalive_seconds``, at most ``max_idle`` are kept (the least recently used go first),
  and one that has become readable while idle (the server closed it, or sent something
  unasked) is closed rather than reused;
- no retries: a request that fails on a reused connection is not sent again (it may have
  reached the receiver); the attempt fails as retriable and the worker's retry path takes over.

Errors are raised as httpx's exception types (``httpx.ConnectError``, ``httpx.ReadTimeout``,
...), so ``adapters.http.delivery_error`` maps them as it maps Telegram's. Their texts never
name the address dialed (a tenant reads them; the address may be what an internal name
resolves to), and they do not chain to the socket's error, whose text does.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import httpx
import trio

from notifier.adapters.webhook import http11
from notifier.adapters.webhook.pool import BROKEN, Connection, Origin, Pool, close_stream

# host or address, port -> a connected stream (tests pass a dialer that records or fakes)
Dialer = Callable[[str, int], Awaitable[trio.abc.Stream]]
READ_BYTES = 65536
# Informational (1xx) answers read before the final one; past it the attempt fails (retriable).
MAX_INFORMATIONAL = 10
# What each phase of an exchange is called in a timeout's error.
PHASES = {
    "connect": "connecting", "tls": "in the TLS handshake", "write": "sending the request",
    "read": "waiting for the answer", "body": "reading the answer's body",
}  # fmt: skip
_TIMEOUTS: dict[str, type[httpx.TimeoutException]] = {
    "connect": httpx.ConnectTimeout, "tls": httpx.ConnectTimeout, "write": httpx.WriteTimeout,
    "read": httpx.ReadTimeout, "body": httpx.ReadTimeout,
}  # fmt: skip
_ERRORS: dict[str, type[httpx.TransportError]] = {
    "connect": httpx.ConnectError, "tls": httpx.ConnectError, "write": httpx.WriteError,
    "read": httpx.ReadError, "body": httpx.ReadError,
}  # fmt: skip


def _reason(exc: BaseException, depth: int = 0) -> str:
    """What went wrong with a socket, without the address trio's texts name (a TLS error
    names the URL's host, never the address, and is kept whole)."""
    if isinstance(exc, ssl.SSLError):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{type(exc).__name__}: {os.strerror(exc.errno)}"
    inner: BaseException | None = exc.__cause__
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = exc.exceptions[-1]
    if inner is not None and depth < 5:  # trio: "all attempts to connect to ... failed"
        return _reason(inner, depth + 1)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def tcp_dialer(address: str, port: int) -> trio.abc.Stream:
    """A TCP connection to ``address`` (an IP address: nothing is resolved)."""
    return await trio.open_tcp_stream(address, port)


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: its status, headers (names lowercased) and the start of its body."""

    status: int
    headers: Sequence[tuple[bytes, bytes]]
    excerpt: bytes

    def header(self, name: bytes) -> str | None:
        """The first value of the header ``name`` (lowercase), decoded, or None."""
        for key, value in self.headers:
            if key == name:
                try:
                    return value.decode("utf-8")
                except UnicodeDecodeError:
                    return value.decode("latin-1")
        return None


class WebhookClient:
    """POSTs over kept-alive HTTP/1.1 connections, dialed only at checked addresses."""

    def __init__(
        self,
        *,
        timeout_seconds: float,
        dialer: Dialer | None = None,
        ssl_context: ssl.SSLContext | None = None,
        identities: Mapping[str, ssl.SSLContext] | None = None,
        max_body_bytes: int = 64 * 1024,
        excerpt_bytes: int = 2048,
        max_idle: int = 64,
        keepalive_seconds: float = 5.0,
    ) -> None:
        """``dialer`` connects to an address (TCP by default; tests fake it); ``ssl_context``
        verifies servers (httpx's default context when None, made once on first use);
        ``timeout_seconds`` is an exchange's when ``post`` is given no deadline, and bounds
        closing a connection; ``identities`` are the contexts of the client identities an
        origin may name."""
        self._timeout = timeout_seconds
        self._dial = dialer if dialer is not None else tcp_dialer
        self._ssl_context = ssl_context
        self._identities = dict(identities or {})
        self._max_body = max_body_bytes
        self._excerpt = excerpt_bytes
        self._pool = Pool(
            max_idle=max_idle, keepalive_seconds=keepalive_seconds, close_seconds=timeout_seconds
        )

    @property
    def idle_connections(self) -> int:
        return len(self._pool)

    async def post(
        self,
        origin: Origin,
        addresses: Sequence[str],
        target: bytes,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        deadline: float | None = None,
    ) -> Answer:
        """POST ``body`` to ``target`` at ``origin`` over a connection to one of ``addresses``
        (the caller's checked ones), all of it by ``deadline`` (``trio.current_time()``'s;
        ``timeout_seconds`` from now when None). ``headers`` must hold ``Host`` and
        ``Content-Length``."""
        if deadline is None:
            deadline = trio.current_time() + self._timeout
        conn = await self._pool.checkout(origin, addresses)
        phase = ["connect"]  # where the exchange is (a list: _connect and _read move it)
        answer: Answer | None = None
        reusable = False
        failure: Exception | None = None
        with trio.CancelScope(deadline=deadline):
            try:
                if conn is None:
                    conn = await self._connect(origin, addresses, deadline, phase)
                phase[0] = "write"
                conn.reader.start_next()
                await conn.stream.send_all(http11.request_bytes(target, headers, body))
                phase[0] = "read"
                answer, reusable = await self._read(conn, phase)
            except BROKEN as exc:
                failure = _ERRORS[phase[0]](_reason(exc))
            except http11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            except http11.LocalProtocolError as exc:
                raise httpx.LocalProtocolError(str(exc)) from exc
            finally:
                if conn is not None:
                    if reusable:
                        await self._pool.checkin(conn)
                    else:
                        await self._pool.discard(conn)
        if failure is not None:
            raise failure  # outside the except: not chained to the socket's text (the address)
        if answer is None:  # only the deadline leaves the scope without an answer or an error
            raise _TIMEOUTS[phase[0]](PHASES[phase[0]])
        return answer

    async def _read(self, conn: Connection, phase: list[str]) -> tuple[Answer, bool]:
        """The answer, and whether the connection may be reused."""
        reader = conn.reader
        status: int = 0
        headers: Sequence[tuple[bytes, bytes]] = ()
        parts: list[bytes] = []
        kept = seen = informational = 0
        while True:
            event = reader.next_event()
            if event is http11.NEED_DATA:
                reader.feed(await conn.stream.receive_some(READ_BYTES))
            elif type(event) is bytes:
                seen += len(event)
                if kept < self._excerpt:
                    parts.append(event[: self._excerpt - kept])
                    kept += len(parts[-1])
                if seen >= self._max_body:  # the rest is never read: the connection goes
                    return Answer(status, headers, b"".join(parts)), False
            elif event is http11.END:
                # Reusable when both sides are done, the server has not closed its end (an
                # answer delimited by the close also ends) and sent nothing more.
                return Answer(status, headers, b"".join(parts)), reader.reusable
            else:
                head = cast(http11.Head, event)
                if head.status >= 200:
                    status, headers = head.status, head.headers
                    phase[0] = "body"
                    continue
                # an informational (1xx) answer: the final one follows, within a bound
                informational += 1
                if informational > MAX_INFORMATIONAL:
                    raise httpx.RemoteProtocolError(
                        f"more than {MAX_INFORMATIONAL} informational (1xx) answers"
                    )

    async def _connect(
        self, origin: Origin, addresses: Sequence[str], deadline: float, phase: list[str]
    ) -> Connection:
        """A new connection to the first of ``addresses`` that answers (never anywhere else),
        TLS-wrapped for ``origin.host`` when the scheme is https. Each address may take an
        equal share of the time left before ``deadline``."""
        if not addresses:  # fail closed
            raise httpx.ConnectError(f"refusing to connect to {origin.host}: no checked address")
        error: Exception | None = None
        for i, address in enumerate(addresses):
            now = trio.current_time()
            with trio.move_on_at(now + (deadline - now) / (len(addresses) - i)):
                try:
                    stream = await self._dial(address, origin.port)
                except BROKEN as exc:
                    error = httpx.ConnectError(_reason(exc))
                    continue
                break
            error = httpx.ConnectTimeout(PHASES["connect"])
        else:
            assert error is not None
            raise error
        if origin.scheme == "https":
            phase[0] = "tls"
            stream = await self._start_tls(stream, origin)
        return Connection(origin, address, stream)

    def _context(self, identity: str | None) -> ssl.SSLContext:
        if identity is not None:
            try:
                return self._identities[identity]
            except KeyError:  # the adapter checks the name first: fail closed all the same
                raise httpx.ConnectError(f"no client certificate named {identity!r}") from None
        if self._ssl_context is None:
            self._ssl_context = httpx.create_ssl_context(trust_env=False)
            self._ssl_context.set_alpn_protocols(["http/1.1"])
        return self._ssl_context

    async def _start_tls(self, stream: trio.abc.Stream, origin: Origin) -> trio.abc.Stream:
        """``stream`` after a TLS handshake for ``origin``'s host, presenting its identity's
        certificate when it names one (the caller's deadline bounds it)."""
        try:
            context = self._context(origin.identity)
            tls = trio.SSLStream(
                stream, context, server_hostname=origin.host, https_compatible=True
            )
            await tls.do_handshake()
        except BaseException:  # no identity, a host SNI refuses, a failed or cancelled handshake
            await close_stream(stream, self._timeout)  # the dialed socket goes at once
            raise
        return tls

    async def aclose(self) -> None:
        await self._pool.aclose()
