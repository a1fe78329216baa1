"""Webhook adapter: POST a Standard Webhooks envelope to the channel's URL.

Pure parts (``build_request``, ``sign``, ``classify``) are separate from the thin I/O in
``deliver`` so they are tested as tables without sockets.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec

from notifier.adapters.base import InvalidChannelConfig, Receipt
from notifier.errors import PermanentError, RetriableError
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
        "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "upgrade",
    }
)  # fmt: skip
RETRIABLE_STATUS = frozenset({408, 425, 429})


class WebhookConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: str
    secret: str | None = None
    headers: dict[str, str] = {}


def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` as Standard Webhooks defines it."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def _is_private_literal(host: str) -> bool:
    if host.lower() in {"localhost", "localhost.localdomain"} or host.lower().endswith(
        ".localhost"
    ):
        return True
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return not addr.is_global or addr.is_multicast


def validate_url(url: str, *, allow_private_networks: bool) -> None:
    if len(url) > MAX_URL_LENGTH:
        raise InvalidChannelConfig("config.url", f"longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port
    except ValueError as exc:
        raise InvalidChannelConfig("config.url", f"not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidChannelConfig("config.url", "scheme must be http or https")
    if not host:
        raise InvalidChannelConfig("config.url", "has no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidChannelConfig("config.url", "must not contain user info")
    if not allow_private_networks and _is_private_literal(host):
        raise InvalidChannelConfig(
            "config.url",
            "points at a private, loopback or link-local address "
            "(set allow_private_networks = true under [workers.webhook] to allow it)",
        )


def build_request(
    message: WorkerMessage, secret: str | None, headers: dict[str, str], now: int
) -> tuple[dict[str, str], bytes]:
    """The headers and body of one attempt. ``webhook-id`` is stable across retries."""
    body = msgspec.json.encode(
        {"type": message.event_type, "timestamp": message.created_at, "data": message.payload}
    )
    msg_id = str(message.delivery_id)
    out = dict(headers)
    out.update(
        {
            "content-type": "application/json",
            "user-agent": "notifier",
            "webhook-id": msg_id,
            "webhook-timestamp": str(now),
        }
    )
    if secret:
        out["webhook-signature"] = sign(secret, msg_id, now, body)
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


def classify(status_code: int, retry_after: str | None, excerpt: str, now: float) -> Receipt:
    """2xx → receipt; 408/425/429/5xx → ``RetriableError``; anything else → ``PermanentError``."""
    if 200 <= status_code < 300:
        return Receipt(status_code=status_code, response_excerpt=excerpt or None)
    detail = f"HTTP {status_code}" + (f": {excerpt[:200]}" if excerpt else "")
    if status_code in RETRIABLE_STATUS or status_code >= 500:
        raise RetriableError(
            detail, retry_after=parse_retry_after(retry_after, now), status_code=status_code
        )
    raise PermanentError(detail, status_code=status_code)


class WebhookAdapter:
    channel_type = "webhook"
    secret_fields = frozenset({"secret"})

    def __init__(self, *, timeout_seconds: float, allow_private_networks: bool) -> None:
        self._timeout = timeout_seconds
        self._allow_private = allow_private_networks
        # One client per concurrent delivery: a single shared httpx client degrades sharply
        # with concurrency under trio (DESIGN §11).
        self._idle: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []

    def prepare_config(self, config: dict[str, Any]) -> dict[str, Any]:
        try:
            cfg = msgspec.convert(config, WebhookConfig)
        except msgspec.ValidationError as exc:
            raise InvalidChannelConfig(*describe(exc, "config")) from exc
        validate_url(cfg.url, allow_private_networks=self._allow_private)
        for name in cfg.headers:
            lowered = name.lower()
            if lowered in RESERVED_HEADERS or lowered.startswith("webhook-"):
                raise InvalidChannelConfig(f"config.headers.{name}", "may not be set by a channel")
            if not name or any(c in name for c in " :\r\n\0"):
                raise InvalidChannelConfig(f"config.headers.{name}", "is not a valid header name")
        for name, value in cfg.headers.items():
            if any(c in value for c in "\r\n\0"):
                raise InvalidChannelConfig(f"config.headers.{name}", "contains CR, LF or NUL")
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

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        cfg = message.channel_config
        now = time.time()
        headers, body = build_request(
            message, cfg.get("secret"), cfg.get("headers") or {}, int(now)
        )
        client = self._idle.pop() if self._idle else self._new_client()
        try:
            async with client.stream("POST", cfg["url"], content=body, headers=headers) as resp:
                data = b""
                async for chunk in resp.aiter_bytes():
                    data += chunk
                    if len(data) >= READ_LIMIT_BYTES:
                        break
        except httpx.TimeoutException as exc:
            raise RetriableError(f"timed out: {type(exc).__name__}") from exc
        except (httpx.TransportError, OSError) as exc:
            raise RetriableError(f"connection failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._idle.append(client)
        excerpt = data[:EXCERPT_BYTES].decode("utf-8", "ignore")  # never over EXCERPT_BYTES
        return classify(resp.status_code, resp.headers.get("retry-after"), excerpt, time.time())

    def _new_client(self) -> httpx.AsyncClient:
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(self._timeout),
            follow_redirects=False,
            trust_env=False,  # environment proxies are never used
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
        )
        self._all.append(client)
        return client

    async def aclose(self) -> None:
        for client in self._all:
            await client.aclose()
        self._all.clear()
        self._idle.clear()
