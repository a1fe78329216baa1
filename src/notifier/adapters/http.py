"""Telegram's httpx clients and their bounded transport, and what an exception from sending a
request means for a delivery of either HTTP adapter (``delivery_error``; the webhook's own
client, ``webhook.client``, raises httpx's exception types so that the one table serves both).

One client per concurrent delivery: a single shared httpx client degrades sharply with
concurrency under trio (docs/architecture.md §9). A delivery borrows an idle client or makes one and
gives it back afterwards, so the pool grows to the peak concurrency and its connections are reused.

``BoundedTransport`` is httpx over an httpcore pool whose response bodies end at a size limit.
An adapter only keeps an excerpt of an answer, and a receiver that streams without end must not
hold a delivery: past the limit the connection's reads are cut, so httpcore closes the
connection and every async generator on the way finishes, rather than an adapter breaking out
of a body half-way and leaving them abandoned (which trio reports as a ``ResourceWarning``).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from contextlib import contextmanager
from types import UnionType
from typing import Any

import httpcore
import httpx

from notifier.errors import DeliveryError, PermanentError, RetriableError
from notifier.logs import KnownSecretsFilter
from notifier.secrets import register_secret

_HTTP_LOGGERS = (
    "httpx", "httpcore", "httpcore.connection", "httpcore.http11", "httpcore.http2",
    "httpcore.proxy", "httpcore.socks",
)  # fmt: skip


def new_client(timeout_seconds: float, transport: httpx.AsyncBaseTransport) -> httpx.AsyncClient:
    """An httpx client as every adapter wants it: no redirects, no environment proxies."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_seconds),
        follow_redirects=False,
        trust_env=False,  # environment proxies are never used
        transport=transport,  # its pool sets the connection limits
    )


class ClientPool:
    """Idle clients to borrow; ``make`` builds a new one when none is idle."""

    def __init__(self, make: Callable[[], httpx.AsyncClient]) -> None:
        self._make = make
        self._idle: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []

    @contextmanager
    def borrow(self) -> Iterator[httpx.AsyncClient]:
        if self._idle:
            client = self._idle.pop()
        else:
            client = self._make()
            self._all.append(client)
        try:
            yield client
        finally:
            self._idle.append(client)

    async def aclose(self) -> None:
        for client in self._all:
            await client.aclose()
        self._all.clear()
        self._idle.clear()


# -- the bounded body reader --------------------------------------------------------------------


class CuttableStream(httpcore.AsyncNetworkStream):
    """A network stream whose reads can be made to fail (``cut``) without closing it, so that
    httpcore ends a response it is reading and closes the connection itself."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self.cut = False

    async def read(
        self,
        max_bytes: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> bytes:
        if self.cut:
            raise httpcore.ReadError("response body limit reached")
        return await self._inner.read(max_bytes, timeout)

    async def write(
        self,
        buffer: bytes,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> httpcore.AsyncNetworkStream:
        return CuttableStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class CuttableBackend(httpcore.AsyncNetworkBackend):
    """A network backend whose connections are ``CuttableStream``s of ``inner``'s (the system's
    by default)."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._inner = inner if inner is not None else httpcore.TrioBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address,
            socket_options=socket_options,
        )  # fmt: skip
        return CuttableStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(path, timeout, socket_options)
        return CuttableStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


# httpcore's errors as httpx's, most specific first (what httpx's own transport does).
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
)


@contextmanager
def as_httpx_errors() -> Iterator[None]:
    """httpcore's exceptions raised as the httpx ones callers of an httpx client expect."""
    try:
        yield
    except Exception as exc:
        for theirs, ours in _ERRORS:
            if isinstance(exc, theirs):
                raise ours(str(exc)) from exc
        raise


# What an exception from sending a request means for a delivery, most specific first: the
# error raised in its place and how its text starts ("{url}" names what the adapter calls its
# URL). A timeout's own words are left out; anything not here is a bug (the adapter's crash).
_DELIVERY_ERRORS: tuple[tuple[type[Exception] | UnionType, type[DeliveryError], str], ...] = (
    (httpx.TimeoutException, RetriableError, "timed out: {name}"),
    (httpx.InvalidURL | httpx.UnsupportedProtocol, PermanentError, "unusable {url}: {text}"),
    (httpx.HTTPError | OSError, RetriableError, "connection failed: {text}"),
)
# Of those, the ones that say the receiver could not be reached or did not answer (connect
# refused or timed out, a read or write that timed out or broke): they count towards opening
# the destination's circuit (docs/architecture.md §5). A protocol error is an answer, if a bad
# one.
_UNREACHABLE: tuple[type[Exception], ...] = (httpx.TimeoutException, httpx.NetworkError, OSError)


def delivery_error(
    exc: Exception, scrub: Callable[[str], str], crash: type[Exception], url: str = "URL"
) -> Exception:
    """What to raise in place of ``exc``, an exception from sending a request: its text
    scrubbed (an HTTP library's error may quote the request's URL or headers). The caller
    raises it outside its ``except`` block, so nothing chains back to ``exc``."""
    text = scrub(describe(exc))
    for kind, error, form in _DELIVERY_ERRORS:
        if isinstance(exc, kind):
            message = form.format(name=type(exc).__name__, url=url, text=text)
            if error is RetriableError:
                return RetriableError(message, unreachable=isinstance(exc, _UNREACHABLE))
            return error(message)
    return crash(text)


def describe(exc: BaseException) -> str:
    """The error and its innermost cause (an SSL verification failure, a refused connection)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    root = exc
    for _ in range(10):  # bounded: a chain is short, and could in theory loop
        inner = root.__cause__ or root.__context__
        if inner is None:
            break
        root = inner
    if root is not exc and str(root) and str(root) not in text:
        text += f" ({type(root).__name__}: {root})"
    return text


_HTTP_LOGS_FILTER = KnownSecretsFilter(marker="***")


def protect_in_http_logs(secret: str) -> None:
    """Register ``secret`` and keep it out of the httpx/httpcore log records of this process
    (httpx logs every request URL at INFO), whatever level those loggers are configured at."""
    register_secret(secret)
    for name in _HTTP_LOGGERS:
        logging.getLogger(name).addFilter(_HTTP_LOGS_FILTER)  # adding it twice is a no-op


class BoundedBody(httpx.AsyncByteStream):
    """A response body that ends after ``max_bytes`` (or a little more: whole chunks).

    Past the limit the connection's reads are cut: httpcore then either ends the body from
    what it has buffered or fails its next read and closes the connection, so every async
    generator on the way (httpcore's and httpx's) finishes rather than being abandoned half-way
    (which trio reports as a ``ResourceWarning``), and the pool is left consistent."""

    def __init__(
        self, stream: AsyncIterable[bytes], network_stream: object, max_bytes: int | None
    ) -> None:
        self._stream = stream
        self._network_stream = network_stream
        self._max_bytes = max_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        parts = aiter(self._stream)
        seen = 0
        cutter = self._network_stream if isinstance(self._network_stream, CuttableStream) else None
        cut = False
        while True:
            try:
                with as_httpx_errors():
                    part = await anext(parts)
            except StopAsyncIteration:
                if cutter is not None:
                    cutter.cut = False  # the body was complete: the connection stays usable
                return
            except httpx.ReadError:
                if cut:
                    return  # the read we cut: httpcore has closed the connection
                raise
            if cut:
                continue  # what httpcore had buffered before the cut
            seen += len(part)
            yield part
            if cutter is not None and self._max_bytes is not None and seen >= self._max_bytes:
                cut = cutter.cut = True

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()


class BoundedTransport(httpx.AsyncBaseTransport):
    """httpx over an httpcore pool (at most 4 connections) whose connections are cuttable
    (``network_backend``, the system's by default, wrapped in a ``CuttableBackend``) and whose
    response bodies end at ``max_body_bytes``: the rest is never read."""

    def __init__(
        self,
        *,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        self._max_body_bytes = max_body_bytes
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=4,
            max_keepalive_connections=4,
            keepalive_expiry=5.0,
            network_backend=CuttableBackend(network_backend),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with as_httpx_errors():
            resp = await self._pool.handle_async_request(core)
        assert isinstance(resp.stream, AsyncIterable)
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=BoundedBody(
                resp.stream, resp.extensions.get("network_stream"), self._max_body_bytes
            ),
            extensions=resp.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
