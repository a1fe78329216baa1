"""Webhook adapter: POST a Standard Webhooks envelope to the channel's URL.

Pure parts (``build_request``, ``sign``, ``signing_secrets``, ``rotate_secret``, ``classify``,
``check_address``, ``validate_url``) are separate from the thin I/O in ``deliver`` so they are
tested as tables without sockets.

SSRF guard (DESIGN §7): every delivery resolves the host itself, checks every address with
``check_address`` and hands the checked addresses to the HTTP layer with the request; the
network backend dials only those (``PinnedBackend``), so there is no second resolution that
could answer differently. The URL is left as it is, so the ``Host`` header, TLS SNI and
certificate verification are all for the hostname.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
import ssl
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx
import msgspec
import trio

from notifier.adapters.base import InvalidChannelConfig, Receipt
from notifier.adapters.http import ClientPool, new_client
from notifier.errors import PermanentError, RetriableError
from notifier.logs import REDACTED
from notifier.messages import WorkerMessage
from notifier.validation import describe

SECRET_PREFIX = "whsec_"
MAX_URL_LENGTH = 2048
EXCERPT_BYTES = 2048
READ_LIMIT_BYTES = 64 * 1024
# Headers a channel may not set: the signature headers and what HTTP itself owns.
RESERVED_HEADERS = frozenset(
    {
        "host", "content-length", "content-type", "transfer-encoding", "connection",
        "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
        "trailer", "upgrade",
    }
)  # fmt: skip
# RFC 9110 §5.1: a field name is a token (tchar: letters, digits and !#$%&'*+-.^_`|~).
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 9110 §5.5, narrowed to what every HTTP stack sends as it is: visible ASCII, with spaces
# and tabs only between visible characters (no leading or trailing whitespace, no obs-text).
_FIELD_VALUE = re.compile(r"([\x21-\x7e]+([ \t]+[\x21-\x7e]+)*)?")
RETRIABLE_STATUS = frozenset({408, 425, 429})
# Secret rotation: the secret a PATCH replaced keeps signing until this time (epoch seconds).
PREVIOUS_SECRET = "previous_secret"
PREVIOUS_SECRET_EXPIRES_AT = "previous_secret_expires_at"
ROTATION_FIELDS = (PREVIOUS_SECRET, PREVIOUS_SECRET_EXPIRES_AT)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# host, port -> the addresses it resolves to (strings as getaddrinfo gives them)
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


class WebhookConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: str
    secret: str | None = None
    headers: dict[str, str] = {}


# -- custom headers -----------------------------------------------------------------------------


def header_field(name: str) -> str:
    """``config.headers.<name>``, the name shown as a Python literal when it is not a token (so
    a control character in it is visible and cannot break a log line)."""
    shown = name if _FIELD_NAME.fullmatch(name) else ascii(name)
    return f"config.headers.{shown}"


def header_problem(name: str, value: object) -> str | None:
    """Why a channel may not send the header ``name: value``, or None when it may. The one rule
    for custom headers: checked at create and PATCH, and again before each delivery (a channel
    stored before the rule existed). The text never quotes the value, which may be a secret."""
    lowered = name.lower()
    if lowered in RESERVED_HEADERS or lowered.startswith("webhook-"):
        return "may not be set by a channel"
    if not _FIELD_NAME.fullmatch(name):
        return "is not a valid header name (a token: ASCII letters, digits and !#$%&'*+-.^_`|~)"
    if not isinstance(value, str):
        return "the value must be a string"
    if not _FIELD_VALUE.fullmatch(value):
        return (
            "the value must be visible ASCII, with spaces or tabs only between visible "
            "characters (no control characters, no non-ASCII, no leading or trailing whitespace)"
        )
    return None


def headers_problem(headers: object) -> tuple[str, str] | None:
    """The first header of a channel's ``headers`` that may not be sent, as ``(field,
    problem)``, or None when every one may."""
    if not isinstance(headers, dict):
        return "config.headers", "must be an object of header names to values"
    for name, value in headers.items():
        problem = header_problem(str(name), value)
        if problem is not None:
            return header_field(str(name)), problem
    return None


# -- signing ------------------------------------------------------------------------------------


def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` as Standard Webhooks defines it."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signing_secrets(config: dict[str, Any], now: float) -> list[str]:
    """The secrets a delivery is signed with: the channel's secret, then the one it replaced
    while that is still inside its grace period."""
    out: list[str] = []
    current = config.get("secret")
    if isinstance(current, str) and current:
        out.append(current)
    previous = config.get(PREVIOUS_SECRET)
    expires_at = config.get(PREVIOUS_SECRET_EXPIRES_AT)
    if (
        isinstance(previous, str)
        and previous
        and previous != current
        and isinstance(expires_at, int | float)
        and now < expires_at
    ):
        out.append(previous)
    return out


def rotate_secret(
    stored: dict[str, Any], new_secret: str, *, now: float, grace_seconds: float
) -> dict[str, Any]:
    """The rotation fields of a channel whose stored config is ``stored`` and whose secret is
    now ``new_secret``: a replaced secret keeps signing for ``grace_seconds``; an unchanged
    secret keeps a previous one that has not expired. Only the latest replaced secret is kept."""
    old = stored.get("secret")
    if isinstance(old, str) and old and old != new_secret:
        if grace_seconds <= 0:
            return {}
        return {PREVIOUS_SECRET: old, PREVIOUS_SECRET_EXPIRES_AT: now + grace_seconds}
    previous = stored.get(PREVIOUS_SECRET)
    expires_at = stored.get(PREVIOUS_SECRET_EXPIRES_AT)
    if (
        isinstance(previous, str)
        and previous != new_secret
        and isinstance(expires_at, int | float)
        and now < expires_at
    ):
        return {PREVIOUS_SECRET: previous, PREVIOUS_SECRET_EXPIRES_AT: expires_at}
    return {}


# -- the SSRF guard -----------------------------------------------------------------------------


def _nets(*pairs: tuple[str, str]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), reason) for net, reason in pairs)


# First match wins, so the narrower entries come first.
_BLOCKED_V4 = _nets(
    ("0.0.0.0/8", "unspecified ('this network')"),
    ("10.0.0.0/8", "private"),
    ("100.100.100.200/32", "cloud metadata"),
    ("100.64.0.0/10", "carrier-grade NAT"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.169.254/32", "cloud metadata"),
    ("169.254.170.2/32", "container metadata"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignment"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved"),
)
_BLOCKED_V6 = _nets(
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/32", "Teredo"),
    ("2001:2::/48", "benchmarking"),
    ("2001:db8::/32", "documentation"),
    ("2001::/23", "IETF protocol assignment"),
    ("3fff::/20", "documentation"),
    ("fd00:ec2::254/128", "cloud metadata"),
    ("fc00::/7", "unique local (private)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)
# Cloud metadata endpoints hand out credentials: refused even with allow_private_networks (only
# an allowed_cidrs entry that contains one opens it). The same addresses head the tables above.
_METADATA = _nets(
    ("169.254.169.254/32", "cloud metadata"),
    ("169.254.170.2/32", "container metadata"),
    ("100.100.100.200/32", "cloud metadata"),
    ("fd00:ec2::254/128", "cloud metadata"),
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")


def _first_match(addr: IPAddress, table: tuple[tuple[IPNetwork, str], ...]) -> str | None:
    for net, reason in table:
        if addr.version == net.version and addr in net:
            return reason
    return None


def _blocked_v4(addr: ipaddress.IPv4Address) -> str | None:
    reason = _first_match(addr, _BLOCKED_V4)
    if reason is None and not addr.is_global:
        reason = "not globally routable"
    return reason


def _embedded_v4(addr: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address a NAT64 or 6to4 address leads to, with the form's name."""
    if addr in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr in _SIX_TO_FOUR and addr.sixtofour is not None:
        return "6to4", addr.sixtofour
    return None


def _metadata(addr: IPAddress) -> str | None:
    """Why ``addr`` is a cloud metadata endpoint (also inside a NAT64 or 6to4 address)."""
    if isinstance(addr, ipaddress.IPv6Address) and (embedded := _embedded_v4(addr)):
        form, v4 = embedded
        inner = _first_match(v4, _METADATA)
        return f"{form} of {v4}, {inner}" if inner else None
    return _first_match(addr, _METADATA)


def check_address(
    ip: str | IPAddress,
    allow_private: bool = False,
    allowed_cidrs: Iterable[str | IPNetwork] = (),
) -> str | None:
    """Why a webhook may not be sent to ``ip`` (``"loopback"``, ``"private"``, ...), or None
    when it may. An address inside one of ``allowed_cidrs`` is allowed; ``allow_private``
    opens every other address except the cloud metadata endpoints. An IPv4-mapped IPv6
    address is judged as its IPv4 address; NAT64 and 6to4 addresses by the IPv4 address they
    embed as well. Not an address: blocked."""
    try:
        addr = ip if not isinstance(ip, str) else ipaddress.ip_address(ip)
    except ValueError:
        return "not an IP address"
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # the kernel dials the IPv4 address
    for cidr in allowed_cidrs:
        net = ipaddress.ip_network(cidr) if isinstance(cidr, str) else cidr
        if addr.version == net.version and addr in net:
            return None
    if allow_private:
        return _metadata(addr)
    if isinstance(addr, ipaddress.IPv4Address):
        return _blocked_v4(addr)
    if embedded := _embedded_v4(addr):
        form, v4 = embedded
        if inner := _blocked_v4(v4):
            return f"{form} of {v4}, {inner}"
        if form == "NAT64":
            return None  # a public IPv4 address behind a NAT64 gateway
    reason = _first_match(addr, _BLOCKED_V6)
    if reason is None and addr not in _GLOBAL_UNICAST_V6:
        reason = "reserved"
    if reason is None and not addr.is_global:
        reason = "not globally routable"
    return reason


def blocked_message(host: str, ip: str, reason: str, *, resolved: bool = True) -> str:
    if host.strip("[]") == ip:
        subject = f"{ip} is"
    else:
        subject = f"{host} {'resolves to' if resolved else 'is'} {ip},"
    return (
        f"destination blocked: {subject} a {reason} address (set allow_private_networks = "
        "true or list it in allowed_cidrs under [workers.webhook] to allow it)"
    )


_NUMBER = re.compile(r"0x[0-9a-f]*|[0-9]+", flags=re.IGNORECASE)
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
_HOSTNAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")  # after IDNA encoding


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells, in any notation a resolver accepts (``2130706433``,
    ``0x7f.1``, ``127.1``, ``[::1]``), or None for a name. A host whose last label is a number
    is an IPv4 address (as WHATWG URL parsing says); one that is not valid raises
    ``ValueError``."""
    bare = host.strip("[]")
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    labels = bare.removesuffix(".").split(".")
    if not _NUMBER.fullmatch(labels[-1]):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(bare.removesuffix(".")))
    except OSError as exc:
        raise ValueError(f"{host!r} is not a valid IPv4 address") from exc


def dial_host(url: httpx.URL) -> str:
    """The host a request to ``url`` connects to, as httpx normalises it (IDNA-mapped and
    lowercased; an IPv6 address without brackets): what the SSRF guard checks, at create and
    at delivery alike."""
    return url.raw_host.decode("ascii")


def validate_url(
    url: str, *, allow_private_networks: bool, allowed_cidrs: Iterable[str | IPNetwork] = ()
) -> None:
    """The checks of a webhook URL that need no network: http(s), a host, no user info, at most
    2,048 characters, and not a literal blocked address (or a loopback name).

    The host checked is the one ``deliver`` dials: httpx's, after IDNA mapping, which turns
    ``127。0。0。1`` (ideographic full stops; fullwidth ones too) into ``127.0.0.1``. What
    ``urlsplit`` reads is only a second opinion on whether the URL parses at all."""
    if len(url) > MAX_URL_LENGTH:
        raise InvalidChannelConfig("config.url", f"longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        _ = parts.port
        host = dial_host(httpx.URL(url))
    except (ValueError, httpx.InvalidURL) as exc:
        raise InvalidChannelConfig("config.url", f"not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidChannelConfig("config.url", "scheme must be http or https")
    if not host or not parts.hostname:
        raise InvalidChannelConfig("config.url", "has no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidChannelConfig("config.url", "must not contain user info")
    try:
        literal = literal_address(host)
    except ValueError as exc:
        raise InvalidChannelConfig("config.url", f"not a valid URL: {exc}") from exc
    name = host.lower().removesuffix(".")
    if literal is not None:
        ip = str(literal)
    elif not _HOSTNAME.fullmatch(host):
        raise InvalidChannelConfig("config.url", f"{host!r} is not a valid host name")
    elif name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        ip = "127.0.0.1"  # RFC 6761: always loopback
    else:
        return
    reason = check_address(ip, allow_private_networks, allowed_cidrs)
    if reason is not None:
        raise InvalidChannelConfig("config.url", blocked_message(host, ip, reason, resolved=False))


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses of ``host`` from the system resolver (trio runs it on a thread)."""
    infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# -- the request --------------------------------------------------------------------------------


def build_request(
    message: WorkerMessage,
    secret: str | Sequence[str] | None,
    headers: dict[str, str],
    now: int,
) -> tuple[dict[str, str], bytes]:
    """The headers and body of one attempt. ``webhook-id`` is stable across retries; with
    several secrets (a rotation) ``webhook-signature`` has one space-separated entry each."""
    body = msgspec.json.encode(
        {"type": message.event_type, "timestamp": message.created_at, "data": message.payload}
    )
    msg_id = str(message.delivery_id)
    ours = {
        "content-type": "application/json",
        "user-agent": "notifier",
        "accept-encoding": "identity",  # the answer is only excerpted: no decompression
        "webhook-id": msg_id,
        "webhook-timestamp": str(now),
    }
    out = {k: v for k, v in headers.items() if k.lower() not in ours}
    out.update(ours)
    keys = [secret] if isinstance(secret, str) else list(secret or ())
    signatures = [sign(key, msg_id, now, body) for key in keys if key]
    if signatures:
        out["webhook-signature"] = " ".join(signatures)
    return out, body


def parse_retry_after(value: str | None, now: float) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def classify(
    status_code: int,
    retry_after: str | None,
    excerpt: str,
    now: float,
    location: str | None = None,
) -> Receipt:
    """2xx → receipt; 408/425/429/5xx → ``RetriableError`` (with ``Retry-After``); 410 →
    ``PermanentError`` that disables the channel; 3xx (never followed) and anything else →
    ``PermanentError``."""
    if 200 <= status_code < 300:
        return Receipt(status_code=status_code, response_excerpt=excerpt or None)
    detail = f"HTTP {status_code}" + (f": {excerpt[:200]}" if excerpt else "")
    if status_code in RETRIABLE_STATUS or 500 <= status_code < 600:
        raise RetriableError(
            detail, retry_after=parse_retry_after(retry_after, now), status_code=status_code
        )
    if 300 <= status_code < 400:
        target = f" to {location[:200]}" if location else ""
        raise PermanentError(
            f"HTTP {status_code}: redirect{target} not followed (redirects are never "
            "followed; point the channel at the final URL)",
            status_code=status_code,
        )
    if status_code == 410:
        raise PermanentError(
            detail + " (the receiver is gone; channel disabled)",
            status_code=status_code,
            disable_channel=True,
        )
    raise PermanentError(detail, status_code=status_code)


# -- the pinned transport -----------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    """The checked addresses a request to ``host`` may be dialed at."""

    host: str
    addresses: tuple[str, ...]


PIN_EXTENSION = "notifier.pin"
_current_pin: ContextVar[Pin | None] = ContextVar("notifier_webhook_pin", default=None)


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """A network backend that dials only the addresses pinned for the request being sent, in
    order, and refuses to connect anywhere else (fail closed). It never resolves names."""

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
        pin = _current_pin.get()
        if pin is None or pin.host != host or not pin.addresses:
            raise httpcore.ConnectError(f"refusing to connect to {host}: no checked address")
        error: Exception | None = None
        for address in pin.addresses:
            try:
                stream = await self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address,
                    socket_options=socket_options,
                )  # fmt: skip
                return CuttableStream(stream)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not used for webhooks")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


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
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for theirs, ours in _ERRORS:
            if isinstance(exc, theirs):
                raise ours(str(exc)) from exc
        raise


class _ResponseStream(httpx.AsyncByteStream):
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
                with _as_httpx_errors():
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


class PinnedTransport(httpx.AsyncBaseTransport):
    """httpx over an httpcore pool whose backend is ``PinnedBackend``. A request carries its
    ``Pin`` in the ``notifier.pin`` extension; new connections for it go to those addresses
    only. The URL is untouched: ``Host``, SNI and certificate checks are for the hostname."""

    def __init__(
        self,
        *,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 4,
        max_body_bytes: int | None = None,
    ) -> None:
        """``max_body_bytes``: response bodies end there; the rest is never read."""
        self._max_body_bytes = max_body_bytes
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context or httpx.create_ssl_context(trust_env=False),
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=5.0,
            network_backend=PinnedBackend(network_backend),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        extensions = dict(request.extensions)
        pin = extensions.pop(PIN_EXTENSION, None)
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
            extensions=extensions,
        )
        token = _current_pin.set(pin if isinstance(pin, Pin) else None)
        try:
            with _as_httpx_errors():
                resp = await self._pool.handle_async_request(core)
        finally:
            _current_pin.reset(token)
        assert isinstance(resp.stream, AsyncIterable)
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=_ResponseStream(
                resp.stream, resp.extensions.get("network_stream"), self._max_body_bytes
            ),
            extensions=resp.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


# Shorter quoted forms are left alone: they would match all over an error's text.
MIN_SCRUBBED_CHARS = 4


def request_secrets(headers: Mapping[str, object], secrets: Sequence[str]) -> tuple[str, ...]:
    """What an error that quotes a request could reveal, in the forms it could be quoted in:
    each custom header value (as it is, stripped, as a ``str`` or ``bytes`` repr shows it, and
    each long word of it, such as the token after ``Bearer``) and each signing secret (with
    its key material alone). Longest first, so a value containing another goes whole."""
    forms: set[str] = set()
    for value in [*headers.values(), *secrets]:
        if isinstance(value, str):
            as_bytes = repr(value.encode("utf-8", "backslashreplace"))[2:-1]
            forms |= {value, value.strip(), value.removeprefix(SECRET_PREFIX), repr(value)[1:-1]}
            forms |= {as_bytes, *value.split()}
    long_enough = (form for form in forms if len(form) >= MIN_SCRUBBED_CHARS)
    return tuple(sorted(long_enough, key=len, reverse=True))


def scrub_request(text: str, quoted: Iterable[str]) -> str:
    """``text`` with every form in ``quoted`` (``request_secrets``) replaced."""
    for form in quoted:
        text = text.replace(form, REDACTED)
    return text


class WebhookAdapterCrash(RuntimeError):
    """An unexpected exception from the I/O layer, its text scrubbed of the request's header
    values and secrets (the worker's panic path logs and stores it)."""


def transport_error(exc: Exception, quoted: Iterable[str]) -> Exception:
    """What to raise in place of an exception from sending a request, its text scrubbed of
    ``quoted`` (an HTTP library's error may quote the request: h11 names an illegal header
    value). Timeouts and connection or protocol errors are retriable; anything else is an
    adapter crash (a bug). The caller raises it outside its ``except`` block, so it does not
    chain back to ``exc``."""
    if isinstance(exc, httpx.TimeoutException):
        return RetriableError(f"timed out: {type(exc).__name__}")
    if isinstance(exc, httpx.TransportError | OSError):
        return RetriableError(f"connection failed: {scrub_request(_describe(exc), quoted)}")
    return WebhookAdapterCrash(scrub_request(_describe(exc), quoted))


def _describe(exc: BaseException) -> str:
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


# -- the adapter --------------------------------------------------------------------------------


class WebhookAdapter:
    channel_type = "webhook"
    secret_fields = frozenset({"secret", *ROTATION_FIELDS})

    def __init__(
        self,
        *,
        timeout_seconds: float,
        allow_private_networks: bool,
        allowed_cidrs: Iterable[str] = (),
        secret_rotation_grace_seconds: float = 86_400.0,
        resolver: Resolver = system_resolver,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``resolver``, ``network_backend`` (what ``PinnedBackend`` dials through) and
        ``ssl_context`` are for tests and embedding; ``clock`` gives epoch seconds."""
        self._timeout = timeout_seconds
        self._allow_private = allow_private_networks
        self._allowed = tuple(ipaddress.ip_network(c) for c in allowed_cidrs)
        self._grace = secret_rotation_grace_seconds
        self._resolver = resolver
        self._backend = network_backend
        self._ssl_context = ssl_context
        self._clock = clock
        self._clients = ClientPool(self._new_client)

    # -- channel config (ingest) --

    def prepare_config(self, config: dict[str, Any]) -> dict[str, Any]:
        try:
            cfg = msgspec.convert(config, WebhookConfig)
        except msgspec.ValidationError as exc:
            raise InvalidChannelConfig(*describe(exc, "config")) from exc
        validate_url(cfg.url, allow_private_networks=self._allow_private,
                     allowed_cidrs=self._allowed)  # fmt: skip
        if (problem := headers_problem(cfg.headers)) is not None:
            raise InvalidChannelConfig(*problem)
        secret = cfg.secret
        if secret is None:
            secret = generate_secret()
        else:
            try:
                raw = _secret_bytes(secret)
            except ValueError as exc:
                raise InvalidChannelConfig(
                    "config.secret", "must be whsec_ followed by base64"
                ) from exc
            if not secret.startswith(SECRET_PREFIX) or not 24 <= len(raw) <= 64:
                raise InvalidChannelConfig(
                    "config.secret", "must be whsec_ followed by base64 of 24 to 64 bytes"
                )
        return {"url": cfg.url, "secret": secret, "headers": dict(cfg.headers)}

    def prepare_config_update(
        self, config: dict[str, Any], previous: dict[str, Any]
    ) -> dict[str, Any]:
        """``prepare_config`` for a PATCH of a channel whose stored config is ``previous``: a
        new secret starts a rotation (the replaced one keeps signing for the grace period)."""
        config = dict(config)
        if "secret" in config and config["secret"] is None:
            # A generated secret is shown only in the 201 of a create: after a PATCH nobody
            # would ever learn it.
            raise InvalidChannelConfig("config.secret", "a PATCH must give the new secret")
        for key in ROTATION_FIELDS:
            # The API carries secret fields over from the stored config; anything else is a
            # client trying to set them.
            if key in config and config.pop(key) != previous.get(key):
                raise InvalidChannelConfig(f"config.{key}", "is managed by notifier")
        prepared = self.prepare_config(config)
        prepared.update(
            rotate_secret(previous, prepared["secret"], now=self._clock(),
                          grace_seconds=self._grace)
        )  # fmt: skip
        return prepared

    async def check_destination(self, config: dict[str, Any]) -> None:
        """At channel create/patch: refuse a host that resolves to a blocked address now. A
        host that does not resolve is accepted (its DNS may not be set up yet); every delivery
        resolves again and fails closed."""
        if self._allow_private:
            return
        url = httpx.URL(config["url"])
        host = dial_host(url)
        if literal_address(host) is not None:
            return  # checked by validate_url already
        try:
            with trio.fail_after(self._timeout):
                addresses = await self._resolver(host, url.port or _default_port(url))
        except (OSError, trio.TooSlowError):
            return
        for ip in addresses:
            reason = check_address(ip, False, self._allowed)
            if reason is not None:
                raise InvalidChannelConfig("config.url", blocked_message(host, ip, reason))

    # -- delivery (workers) --

    async def checked_addresses(self, host: str, port: int) -> tuple[str, ...]:
        """Resolve ``host`` and check every address; ``RetriableError`` if it does not resolve,
        ``PermanentError`` if any address is blocked. A literal address (in any notation) is
        used as it is."""
        try:
            literal = literal_address(host)
        except ValueError as exc:
            raise PermanentError(f"config.url is not a valid URL: {exc}") from exc
        if literal is not None:
            addresses: tuple[str, ...] = (str(literal),)
        else:
            addresses = await self._resolve(host, port)
        for ip in addresses:
            reason = check_address(ip, self._allow_private, self._allowed)
            if reason is not None:
                raise PermanentError(blocked_message(host, ip, reason, resolved=literal is None))
        return addresses

    async def _resolve(self, host: str, port: int) -> tuple[str, ...]:
        try:
            with trio.fail_after(self._timeout):
                addresses = tuple(await self._resolver(host, port))
        except trio.TooSlowError as exc:
            raise RetriableError(f"could not resolve {host}: timed out") from exc
        except OSError as exc:
            raise RetriableError(f"could not resolve {host}: {exc}") from exc
        if not addresses:
            raise RetriableError(f"could not resolve {host}: no addresses")
        return addresses

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        cfg = message.channel_config
        try:
            url = httpx.URL(cfg["url"])
        except (KeyError, TypeError, httpx.InvalidURL) as exc:
            raise PermanentError(f"config.url is not a valid URL: {exc}") from exc
        if url.scheme not in ("http", "https") or not url.raw_host:
            raise PermanentError("config.url must be an http(s) URL with a host")
        custom = cfg.get("headers") or {}
        if (problem := headers_problem(custom)) is not None:
            # Stored before the header rules (or written around the API): no attempt could
            # ever send it, so the delivery is dead at once, the header named, its value not.
            field, text = problem
            raise PermanentError(f"{field}: {text}")
        host = dial_host(url)
        pin = Pin(host, await self.checked_addresses(host, url.port or _default_port(url)))
        now = self._clock()
        secrets = signing_secrets(cfg, now)
        headers, body = build_request(message, secrets, custom, int(now))
        quoted = request_secrets(
            {**custom, "webhook-signature": headers.get("webhook-signature", "")}, secrets
        )
        failure: Exception | None = None
        try:
            with self._clients.borrow() as client:
                async with client.stream(
                    "POST", url, content=body, headers=headers, extensions={PIN_EXTENSION: pin}
                ) as resp:
                    data = b""
                    async for chunk in resp.aiter_raw():  # the transport stops at the limit
                        data += chunk
        except Exception as exc:
            failure = transport_error(exc, quoted)
        if failure is not None:
            raise failure
        excerpt = data[:EXCERPT_BYTES].decode("utf-8", "ignore")  # never over EXCERPT_BYTES
        return classify(
            resp.status_code, resp.headers.get("retry-after"), excerpt, self._clock(),
            location=resp.headers.get("location"),
        )  # fmt: skip

    def _new_client(self) -> httpx.AsyncClient:
        transport = PinnedTransport(
            network_backend=self._backend, ssl_context=self._ssl_context,
            max_body_bytes=READ_LIMIT_BYTES,
        )  # fmt: skip
        return new_client(self._timeout, transport)

    async def aclose(self) -> None:
        await self._clients.aclose()


def _default_port(url: httpx.URL) -> int:
    return 443 if url.scheme == "https" else 80
