"""``[ingest]``, ``[amqp_ingest]`` and ``[console]``: what the ingest role serves and how it
bounds its clients."""

from __future__ import annotations

import ipaddress
import math
import re
import urllib.parse
from collections.abc import Mapping
from typing import Annotated, Literal

import msgspec

from notifier.config.base import (
    MIN_RATE_PER_SECOND,
    NonNegativeFloat,
    Positive,
    PositiveFloat,
    Section,
)
from notifier.errors import ConfigError
from notifier.validation import key_error

# An address to listen on: a host name or address ([IPv6] bracketed) and a port.
HOST_PORT = re.compile(r"(\[[0-9a-fA-F:]+\]|[^\s:\[\]]+):\d{1,5}")


class IngestConfig(Section, frozen=True):
    bind: str = "127.0.0.1:8080"
    max_body_bytes: Positive = 1_048_576
    max_batch_events: Positive = 100
    # Per API key, events per second over a token bucket of `rate_limit_burst`; 0 = no limit.
    rate_limit_per_second: NonNegativeFloat = 0.0
    rate_limit_burst: Positive = 200
    # HTTP/2 cleartext (prior knowledge or `Upgrade: h2c`); off, every connection is HTTP/1.1.
    http2: bool = False
    # The connections: a write that misses `write_timeout_seconds` closes its connection; over
    # `max_connections` in all ("auto": ¾ of the open-file limit, raised to the hard limit at
    # start) or `max_connections_per_address` from one address (0 = no limit), a new connection
    # is closed at once.
    write_timeout_seconds: PositiveFloat = 30.0
    max_connections: Positive | Literal["auto"] = "auto"
    max_connections_per_address: Annotated[int, msgspec.Meta(ge=0)] = 256
    # /metrics protection: the environment variable holding a bearer token /metrics then asks
    # for (at least 16 characters), and a HOST:PORT of its own to serve /metrics on instead of
    # the ingest port. Unset: no token, /metrics on the ingest port.
    metrics_token_env: str = ""
    metrics_bind: str = ""
    # Requests refused for their API key (401) per client address (an IPv6 client by its /64),
    # per second over a token bucket of `unauthorized_burst`; over it, 429. 0 = no limit.
    unauthorized_per_address_per_second: NonNegativeFloat = 10.0
    unauthorized_burst: Positive = 100

    def __post_init__(self) -> None:
        if not math.isfinite(self.write_timeout_seconds):
            raise key_error("write_timeout_seconds", "must be a finite number of seconds")
        for key, address in (("bind", self.bind), ("metrics_bind", self.metrics_bind)):
            if (address or key == "bind") and not HOST_PORT.fullmatch(address):
                raise key_error(key, f"must be HOST:PORT, got {address!r}")
        if self.metrics_bind and self.metrics_bind == self.bind:
            raise key_error("metrics_bind", "must differ from ingest.bind")
        if not math.isfinite(self.unauthorized_per_address_per_second):
            raise key_error("unauthorized_per_address_per_second", "must be a finite number")
        if self.rate_limit_per_second == 0:
            return
        if self.rate_limit_per_second < MIN_RATE_PER_SECOND:
            raise key_error(
                "rate_limit_per_second",
                f"0 (no limit) or at least 1/3600 (one event an hour), got "
                f"{self.rate_limit_per_second:g}",
            )
        if self.rate_limit_burst < self.max_batch_events:
            # A batch is admitted whole or not at all: one bigger than the bucket could never be.
            raise key_error(
                "rate_limit_burst",
                f"{self.rate_limit_burst} is below ingest.max_batch_events "
                f"({self.max_batch_events}); it must be at least that, or a full batch could "
                "never be admitted",
            )


class AmqpIngestConfig(Section, frozen=True):
    enabled: bool = False
    queue: str = "events.ingest"
    prefetch: Positive = 200
    # Who sent a message (its AMQP app_id) → the name of the tenant its events belong to.
    tenants: dict[str, str] = msgspec.field(default_factory=dict)
    # Where undecodable or invalid messages go (queue and exchange); "" means "<queue>.dead".
    dead_letter_queue: str = ""
    # A batch is what has arrived within this long of its first message (or `prefetch`).
    batch_linger_seconds: NonNegativeFloat = 0.05
    # Postgres unreachable: a batch is held this long, then handed back to the queue.
    store_retry_seconds: PositiveFloat = 5.0

    @property
    def dead_letter_queue_name(self) -> str:
        return self.dead_letter_queue or f"{self.queue}.dead"

    def __post_init__(self) -> None:
        for key, name in (("queue", self.queue), ("dead_letter_queue", self.dead_letter_queue)):
            if key == "queue" or name:
                _check_queue_name(key, name)
        if self.dead_letter_queue_name == self.queue:
            raise key_error("dead_letter_queue", "must differ from queue")
        if self.prefetch > 65_535:
            raise key_error("prefetch", "must be at most 65535")
        for app_id, tenant in self.tenants.items():
            if not 1 <= len(app_id.encode()) <= 255:
                raise key_error("tenants", f"app_id {app_id!r} must be 1 to 255 bytes")
            if not tenant:
                raise key_error(f"tenants.{app_id}", "tenant name must not be empty")
        if self.enabled and not self.tenants:
            raise key_error("tenants", "must map at least one app_id when enabled")


def _check_queue_name(key: str, name: str) -> None:
    if not 1 <= len(name.encode()) <= 255:
        raise key_error(key, "must be 1 to 255 bytes")
    if name.startswith("amq."):
        raise key_error(key, "names starting with 'amq.' are reserved by RabbitMQ")


def check_public_url(url: str) -> None:
    """``console.public_url``: an http(s) address with a host, nothing after it but an
    optional path prefix."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise key_error("public_url", "must be an http:// or https:// URL with a host")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise key_error("public_url", "must have no query, fragment or credentials")


class ConsoleConfig(Section, frozen=True):
    """The operator console (``/console``, served by the ``ingest`` role)."""

    # The variable holding the secret that signs session cookies; unset or empty: a random
    # secret per process (sessions end on restart and hold on one process only).
    session_secret_env: str = "NOTIFIER_CONSOLE_SESSION_SECRET"
    session_max_age_seconds: Annotated[int, msgspec.Meta(ge=60, le=30 * 86_400)] = 8 * 3600
    # The reverse proxies (CIDRs) whose X-Forwarded-For is believed: the sign-in slow-down then
    # counts the right-most forwarded address that is not one of them. Empty: the connection's.
    trusted_proxies: tuple[str, ...] = ()
    # The address browsers reach the console at (``https://notify.example.com``, no path
    # query or fragment): portal links (``POST /v1/portal-links``) are made under it. Empty: no
    # portal link can be made (never taken from a request's Host header, which a client writes).
    public_url: str = ""

    def __post_init__(self) -> None:
        if self.public_url:
            check_public_url(self.public_url)
        for i, cidr in enumerate(self.trusted_proxies):
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise key_error(f"trusted_proxies[{i}]", str(exc)) from exc


MIN_METRICS_TOKEN_CHARS = 16


def metrics_token(ingest: IngestConfig, environ: Mapping[str, str]) -> str | None:
    """The bearer token ``/metrics`` asks for, read from the variable ``metrics_token_env``
    names; ``None`` when that key is unset. Never in an error: only its length."""
    if not (var := ingest.metrics_token_env):
        return None
    token = environ.get(var, "")
    if len(token) < MIN_METRICS_TOKEN_CHARS:
        found = f"has {len(token)} characters" if token else "is not set or empty"
        raise ConfigError(
            f"ingest.metrics_token_env: the environment variable {var} (the bearer token of "
            f"/metrics) {found}; it needs at least {MIN_METRICS_TOKEN_CHARS}"
        )
    return token
