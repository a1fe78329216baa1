"""The egress proxy (docs/architecture.md §9): every webhook connection through one HTTP CONNECT
proxy, so receivers can allow-list the proxy's address.

A ``ProxyDialer`` is a ``client.Dialer``: the client hands it an address the SSRF guard already
checked, and it asks the proxy for a tunnel to that address (``CONNECT 203.0.113.7:443``), so
the proxy never resolves the receiver's name and cannot be steered elsewhere by its DNS. TLS
then runs inside the tunnel for the hostname (SNI, certificate check), and ``Host`` stays the
channel's. The proxy itself is the operator's: dialed as configured, outside the SSRF table.

A refusal (an answer other than 2xx) is a ``ProxyRefused``, an ``OSError``, so the client
reports it as a connect error, which the worker retries. The proxy's password is sent as Basic
credentials and never appears in an error (errors name the proxy as ``host:port``).
"""

from __future__ import annotations

import base64
import contextlib
import urllib.parse

import h11
import trio

from notifier.adapters.webhook.client import READ_BYTES
from notifier.errors import NotifierError
from notifier.secrets import register_secret

# A proxy's answer to CONNECT is a status line and a few headers: more is not a proxy.
MAX_ANSWER_BYTES = 16 * 1024


class ProxyRefused(NotifierError, ConnectionError):
    """The proxy did not open the tunnel (its answer says why), or did not answer as one. A
    ``ConnectionError``, so the client takes it as it takes a refused connection."""


def connect_target(address: str, port: int) -> bytes:
    """``CONNECT``'s target for an address: ``203.0.113.7:443``, ``[2001:db8::1]:443``."""
    host = f"[{address}]" if ":" in address else address
    return f"{host}:{port}".encode("ascii")


class ProxyDialer:
    """Opens connections through the HTTP CONNECT proxy ``proxy_url``
    (``http://[user:pass@]host:port``, checked by the config)."""

    def __init__(self, proxy_url: str) -> None:
        parts = urllib.parse.urlsplit(proxy_url)
        assert parts.hostname is not None
        assert parts.port is not None
        self.host = parts.hostname
        self.port = parts.port
        self.name = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        self._authorization: str | None = None
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            if password:  # scrubbed from every log line and error of this process
                register_secret(password)
                register_secret(token)
            self._authorization = f"Basic {token}"

    async def __call__(self, address: str, port: int) -> trio.abc.Stream:
        """Trio-flavoured. A stream tunnelled to ``address``:``port`` (an IP address, already
        checked). The caller bounds the time it takes."""
        try:
            stream: trio.abc.Stream = await trio.open_tcp_stream(self.host, self.port)
        except OSError as exc:
            raise ProxyRefused(f"cannot connect to the proxy {self.name}: {exc}") from None
        try:
            await self._tunnel(stream, connect_target(address, port))
        except BaseException:
            with trio.CancelScope(shield=True), contextlib.suppress(OSError):
                await trio.aclose_forcefully(stream)
            raise
        return stream

    async def _tunnel(self, stream: trio.abc.Stream, target: bytes) -> None:
        conn = h11.Connection(h11.CLIENT)
        headers = [("host", target.decode("ascii"))]
        if self._authorization is not None:
            headers.append(("proxy-authorization", self._authorization))
        request = h11.Request(method=b"CONNECT", target=target, headers=headers)
        try:
            await stream.send_all(
                (conn.send(request) or b"") + (conn.send(h11.EndOfMessage()) or b"")
            )
            seen = 0
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = bytes(await stream.receive_some(READ_BYTES))
                    seen += len(data)
                    if not data or seen > MAX_ANSWER_BYTES:
                        raise ProxyRefused(f"the proxy {self.name} closed the connection")
                    conn.receive_data(data)
                elif isinstance(event, h11.InformationalResponse):
                    continue
                elif isinstance(event, h11.Response):
                    break
                else:
                    raise ProxyRefused(f"the proxy {self.name} did not answer CONNECT")
        except h11.RemoteProtocolError as exc:
            raise ProxyRefused(f"the proxy {self.name} did not answer in HTTP: {exc}") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ProxyRefused(f"the proxy {self.name} closed the connection: {exc}") from None
        if not 200 <= event.status_code < 300:
            reason = event.reason.decode("latin-1")[:100]
            raise ProxyRefused(
                f"the proxy {self.name} refused CONNECT {target.decode('ascii')}: HTTP "
                f"{event.status_code} {reason}".rstrip()
            )
        if conn.trailing_data[0]:  # a tunnel carries the client's bytes first, never the proxy's
            raise ProxyRefused(f"the proxy {self.name} sent data before the tunnel was used")
