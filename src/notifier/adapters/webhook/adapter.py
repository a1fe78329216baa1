"""The webhook deliverer: one attempt as a signed POST to the channel's URL (a channel's config
is validated by ``channels.WebhookChannels``).

The pure parts it puts together (``signing``, ``headers``, ``ssrf``, ``answers``) are tested as
tables without sockets; ``deliver`` is the thin I/O between them.

SSRF guard (docs/architecture.md §9): every delivery resolves the host itself, checks every address
with ``check_address`` and hands the checked addresses to the HTTP client with the request; it
dials only those (``client.WebhookClient``), so there is no second resolution that could answer
differently. The URL is left as it is, so the ``Host`` header, TLS SNI and certificate
verification are all for the hostname. Names are resolved by ``resolver.CachingResolver``
(``/etc/hosts``, then DNS asked directly: no thread), unless a resolver is given.

One deadline per attempt: ``timeout_seconds`` from the start of ``deliver`` covers resolution,
the connect, TLS, the request, every informational answer and the body; its error names the
phase it cut (``timed out after 10 s waiting for the answer``). The worker's own limit on the
call is only a backstop (``KeepsDeadline``). What a tenant reads never names an address a host
name resolved to (the operator's log does).

What does not change between attempts of a channel (its URL parsed, its custom headers checked,
a literal address's verdict) is worked out once per distinct URL and headers (``Endpoint``).

Trust and identity (``tls``, ``oauth``): a channel may present one of the operator's client
certificates (its name in ``tls_client_certificate``, if the tenant may use it) and may fetch an
OAuth2 bearer token, whose endpoint is resolved, checked and dialed like a receiver.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from notifier.adapters.base import Receipt
from notifier.adapters.webhook.answers import classify, transport_error
from notifier.adapters.webhook.client import Dialer, WebhookClient
from notifier.adapters.webhook.headers import headers_problem, request_secrets
from notifier.adapters.webhook.oauth import Credentials, Token, Tokens, read_token, token_request
from notifier.adapters.webhook.pool import Origin
from notifier.adapters.webhook.resolver import dns_resolver
from notifier.adapters.webhook.signing import build_request, signing_secrets
from notifier.adapters.webhook.ssrf import (
    NetworkRules,
    Resolver,
    blocked_message,
    default_port,
    dial_host,
    literal_address,
    log_blocked,
)
from notifier.adapters.webhook.tls import ClientIdentity, unavailable
from notifier.errors import PermanentError, RetriableError
from notifier.messages import WorkerMessage
from notifier.tracing import HEADER as TRACE_HEADER
from notifier.tracing import current_traceparent

EXCERPT_BYTES = 2048
READ_LIMIT_BYTES = 64 * 1024
# Channels whose URL and headers are kept parsed and checked (the most recently used).
ENDPOINTS_KEPT = 1024


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What a channel's URL and custom headers mean for every attempt, worked out once per
    distinct ``(url, headers)``: where to connect, the request target, the ``Host`` header, the
    checked custom headers, and for a literal address the address itself, already checked."""

    origin: Origin
    target: bytes
    host_header: str
    custom: dict[str, str]
    literal: tuple[str, ...] | None


class WebhookAdapter:
    channel_type = "webhook"
    keeps_deadline = True  # KeepsDeadline: each attempt ends at timeout_seconds by itself

    def __init__(
        self,
        *,
        timeout_seconds: float,
        allow_private_networks: bool,
        allowed_cidrs: Iterable[str] = (),
        dns_servers: Iterable[str] = (),
        resolver: Resolver | None = None,
        dialer: Dialer | None = None,
        ssl_context: ssl.SSLContext | None = None,
        identities: Mapping[str, ClientIdentity] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``dns_servers``: the nameservers (``ip`` or ``ip:port``; those of /etc/resolv.conf
        when empty). ``resolver`` (replaces them), ``dialer`` (what a connection to a checked
        address is opened with: TCP, or ``proxy.ProxyDialer``) and ``ssl_context``
        (``tls.Tls.context``) are for tests and embedding; ``identities`` are the client
        certificates channels may name (``tls``); ``clock`` gives epoch seconds (signatures,
        token expiry)."""
        if resolver is None:
            resolver = dns_resolver(dns_servers, timeout_seconds=timeout_seconds)
        self._rules = NetworkRules.of(
            timeout_seconds, allow_private_networks, allowed_cidrs, resolver
        )
        self._timeout = timeout_seconds
        self._clock = clock
        self._identities = dict(identities or {})
        contexts = {name: identity.context for name, identity in self._identities.items()}
        self._client = WebhookClient(
            timeout_seconds=timeout_seconds, dialer=dialer, ssl_context=ssl_context,
            identities=contexts, max_body_bytes=READ_LIMIT_BYTES, excerpt_bytes=EXCERPT_BYTES,
        )  # fmt: skip
        # Token endpoints' answers are read whole (up to the bound), through their own pool.
        self._token_client = WebhookClient(
            timeout_seconds=timeout_seconds, dialer=dialer, ssl_context=ssl_context,
            max_body_bytes=READ_LIMIT_BYTES, excerpt_bytes=READ_LIMIT_BYTES,
        )  # fmt: skip
        self._tokens = Tokens(clock)
        # The network rules are fixed for the adapter's life, so a literal address's verdict
        # is too; a name is resolved and checked again at every delivery (never cached).
        self._endpoints: dict[tuple[Any, ...], Endpoint] = {}

    # -- delivery (workers) --

    async def _resolved_and_checked(self, origin: Origin, deadline: float) -> tuple[str, ...]:
        """Resolve the origin's host name by ``deadline`` and check every address;
        ``RetriableError`` if it does not resolve, ``PermanentError`` if any address is
        blocked. (A literal address is checked once per channel config, in ``endpoint``.)"""
        addresses = await self._resolve(origin.host, origin.port, deadline)
        self._check(origin.host, addresses, resolved=True)
        return addresses

    def _literal(self, host: str) -> tuple[str, ...] | None:
        """``host``'s address when it spells one (checked), None for a name."""
        try:
            literal = literal_address(host)
        except ValueError as exc:
            raise PermanentError(f"config.url is not a valid URL: {exc}") from exc
        if literal is None:
            return None
        addresses = (str(literal),)
        self._check(host, addresses, resolved=False)
        return addresses

    def _check(self, host: str, addresses: tuple[str, ...], *, resolved: bool) -> None:
        if (blocked := self._rules.first_blocked(addresses)) is not None:
            if resolved:
                log_blocked(host, *blocked, at="delivery")
            raise PermanentError(blocked_message(host, *blocked, resolved=resolved))

    async def _resolve(self, host: str, port: int, deadline: float) -> tuple[str, ...]:
        try:
            addresses = await self._rules.resolve(host, port, deadline=deadline)
        except trio.TooSlowError as exc:
            raise RetriableError(  # the receiver cannot be reached: counts for its circuit
                f"could not resolve {host}: timed out after {self._timeout:g} s",
                unreachable=True,
            ) from exc
        except OSError as exc:
            raise RetriableError(f"could not resolve {host}: {exc}") from exc
        if not addresses:
            raise RetriableError(f"could not resolve {host}: no addresses")
        return addresses

    def endpoint(self, cfg: dict[str, Any]) -> Endpoint:
        """The channel config's ``Endpoint``, from the cache when its URL and headers were seen
        before (keyed by their values, so a PATCH that changes either is a new entry).
        ``PermanentError`` when no attempt could ever be sent."""
        custom = cfg.get("headers") or {}
        try:
            identity = cfg.get("tls_client_certificate")
            key: tuple[Any, ...] | None = (cfg.get("url"), identity, *custom.items())
            found = self._endpoints.pop(key)  # type: ignore[arg-type]
        except (AttributeError, TypeError):  # not a dict, or unhashable: refused below
            key, found = None, None
        except KeyError:
            found = None
        if found is None:
            found = self._prepare(cfg, custom)
        if key is not None:
            self._endpoints[key] = found  # the most recently used last
            if len(self._endpoints) > ENDPOINTS_KEPT:
                del self._endpoints[next(iter(self._endpoints))]
        return found

    def _prepare(self, cfg: dict[str, Any], custom: object) -> Endpoint:
        try:
            url = httpx.URL(cfg["url"])
        except (KeyError, TypeError, httpx.InvalidURL) as exc:
            raise PermanentError(f"config.url is not a valid URL: {exc}") from exc
        if url.scheme not in ("http", "https") or not url.raw_host:
            raise PermanentError("config.url must be an http(s) URL with a host")
        if (problem := headers_problem(custom)) is not None:
            # Stored before the header rules (or written around the API): no attempt could
            # ever send it, so the delivery is dead at once, the header named, its value not.
            field, text = problem
            raise PermanentError(f"{field}: {text}")
        assert isinstance(custom, dict)
        identity = cfg.get("tls_client_certificate")
        if identity is not None and (not isinstance(identity, str) or url.scheme != "https"):
            raise PermanentError("config.tls_client_certificate: a name, with an https URL")
        if "oauth2" in cfg and any(name.lower() == "authorization" for name in custom):
            raise PermanentError("config.headers.Authorization: not with config.oauth2")
        host = dial_host(url)
        return Endpoint(
            origin=Origin(url.scheme, host, default_port(url), identity),
            target=url.raw_path,
            host_header=url.netloc.decode("ascii"),
            custom=dict(custom),
            literal=self._literal(host),
        )

    def destination(self, message: WorkerMessage) -> str:
        """``HasDestinations``: the origin the channel's URL points at, ``scheme://host:port``
        (the host as dialed); a URL that cannot be sent to is a destination of its own."""
        try:
            origin = self.endpoint(message.channel_config).origin
        except PermanentError:
            return f"channel:{message.channel_id}"
        host = f"[{origin.host}]" if ":" in origin.host else origin.host
        return f"{origin.scheme}://{host}:{origin.port}"

    def _check_identity(self, name: str | None, message: WorkerMessage) -> None:
        """The channel's client certificate is one the operator declares for its tenant (the
        API checked at create; the operator's config may have changed since)."""
        if name is None:
            return
        identity = self._identities.get(name)
        if identity is None or not identity.allows(message.tenant_id):
            raise PermanentError(f"config.tls_client_certificate: {unavailable(name)}")

    async def _fetch_token(self, creds: Credentials) -> Token:
        """Trio-flavoured. A token from ``creds``' endpoint, which is resolved, checked and
        dialed as a receiver is. A failure is retriable (a blocked endpoint: permanent)."""
        deadline = trio.current_time() + self._timeout  # shared by attempts: one of its own
        try:
            end = self.endpoint({"url": creds.token_url})
            if end.origin.scheme != "https":
                raise PermanentError("must be an https URL")
            addresses = end.literal or await self._resolved_and_checked(end.origin, deadline)
        except PermanentError as exc:
            raise PermanentError(f"config.oauth2.token_url: {exc}") from None
        except RetriableError as exc:
            raise RetriableError(f"OAuth2 token endpoint: {exc}") from None
        headers, body = token_request(creds)
        fields = [("host", end.host_header), ("content-length", str(len(body))), *headers]
        failure: Exception | None = None
        try:
            answer = await self._token_client.post(
                end.origin, addresses, end.target, fields, body, deadline=deadline
            )
        except Exception as exc:
            failure = transport_error(exc, request_secrets({}, creds.secrets()))
        where = f"{end.origin.host}:{end.origin.port}"
        if isinstance(failure, RetriableError):
            raise RetriableError(f"OAuth2 token endpoint {where}: {failure}")
        if failure is not None:
            raise failure
        return read_token(
            answer.status, answer.excerpt, self._clock(), endpoint=where, secrets=creds.secrets()
        )

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        """One attempt, all of it within ``timeout_seconds`` (the module docstring).
        Trio-flavoured."""
        deadline = trio.current_time() + self._timeout
        cfg = message.channel_config
        end = self.endpoint(cfg)
        origin = end.origin
        self._check_identity(origin.identity, message)
        creds = Credentials.of(cfg)
        addresses = end.literal or await self._resolved_and_checked(origin, deadline)
        token = await self._tokens.get(creds, self._fetch_token) if creds else None
        now = self._clock()
        secrets = signing_secrets(cfg, now)
        headers, body = build_request(message, secrets, end.custom, int(now))
        if (traceparent := current_traceparent()) is not None:
            # the attempt's span (README, Tracing), in place of a channel's own header
            headers = {k: v for k, v in headers.items() if k.lower() != TRACE_HEADER}
            headers[TRACE_HEADER] = traceparent
        fields = [("host", end.host_header), ("content-length", str(len(body))), *headers.items()]
        if token is not None:
            fields.append(("authorization", f"Bearer {token}"))
        failure: Exception | None = None
        try:
            answer = await self._client.post(
                origin, addresses, end.target, fields, body, deadline=deadline
            )
        except httpx.TimeoutException as exc:  # the deadline: the client names the phase
            # a receiver that did not answer in time: counts for its circuit
            failure = RetriableError(f"timed out after {self._timeout:g} s {exc}", unreachable=True)
        except Exception as exc:
            # Scrubbed of what the error could quote: the custom header values, the signature,
            # the bearer token; and of the addresses a name resolved to (the client's texts
            # name none: a net).
            signature = headers.get("webhook-signature", "")
            quoted = request_secrets(
                {**end.custom, "webhook-signature": signature, "-token": token or ""}, secrets
            )
            resolved = addresses if end.literal is None else ()
            failure = transport_error(exc, [*quoted, *resolved])
        if failure is not None:
            raise failure
        if creds is not None and token is not None and answer.status == 401:
            self._tokens.drop(creds, token)
            raise RetriableError(
                "HTTP 401: the receiver refused the OAuth2 access token; the next attempt "
                "fetches a new one", status_code=401,
            )  # fmt: skip
        excerpt = answer.excerpt.decode("utf-8", "ignore")  # never over EXCERPT_BYTES
        return classify(
            answer.status, answer.header(b"retry-after"), excerpt, self._clock(),
            location=answer.header(b"location"),
        )  # fmt: skip

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._token_client.aclose()
