"""The webhook deliverer: one attempt as a signed POST to the channel's URL (a channel's config
is validated by ``channels.WebhookChannels``).

The pure parts it puts together (``signing``, ``headers``, ``ssrf``, ``answers``) are tested as
tables without sockets; ``deliver`` is the thin I/O between them.

SSRF guard (docs/architecture.md §9): every delivery resolves the host itself, checks every address
with ``check_address`` and hands the checked addresses to the HTTP layer with the request; the
network backend dials only those (``PinnedBackend``), so there is no second resolution that
could answer differently. The URL is left as it is, so the ``Host`` header, TLS SNI and
certificate verification are all for the hostname.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterable

import httpcore
import httpx
import trio

from notifier.adapters.base import Receipt
from notifier.adapters.http import ClientPool, new_client
from notifier.adapters.webhook.answers import classify, transport_error
from notifier.adapters.webhook.headers import headers_problem, request_secrets
from notifier.adapters.webhook.signing import build_request, signing_secrets
from notifier.adapters.webhook.ssrf import (
    NetworkRules,
    Resolver,
    blocked_message,
    default_port,
    dial_host,
    literal_address,
    system_resolver,
)
from notifier.adapters.webhook.transport import PIN_EXTENSION, Pin, PinnedTransport
from notifier.errors import PermanentError, RetriableError
from notifier.messages import WorkerMessage

EXCERPT_BYTES = 2048
READ_LIMIT_BYTES = 64 * 1024


class WebhookAdapter:
    channel_type = "webhook"

    def __init__(
        self,
        *,
        timeout_seconds: float,
        allow_private_networks: bool,
        allowed_cidrs: Iterable[str] = (),
        resolver: Resolver = system_resolver,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``resolver``, ``network_backend`` (what ``PinnedBackend`` dials through) and
        ``ssl_context`` are for tests and embedding; ``clock`` gives epoch seconds."""
        self._rules = NetworkRules.of(
            timeout_seconds, allow_private_networks, allowed_cidrs, resolver
        )
        self._backend = network_backend
        self._ssl_context = ssl_context
        self._clock = clock
        self._clients = ClientPool(self._new_client)

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
            reason = self._rules.check(ip)
            if reason is not None:
                raise PermanentError(blocked_message(host, ip, reason, resolved=literal is None))
        return addresses

    async def _resolve(self, host: str, port: int) -> tuple[str, ...]:
        try:
            addresses = await self._rules.resolve(host, port)
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
        pin = Pin(host, await self.checked_addresses(host, default_port(url)))
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
        return new_client(self._rules.timeout_seconds, transport)

    async def aclose(self) -> None:
        await self._clients.aclose()
