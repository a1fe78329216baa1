"""Configuration: TOML → frozen, validated structures.

Unknown keys and wrong types are refused with the key's dotted path in the message. Database and
broker URLs and the Sentry DSN can be overridden from the environment, so secrets need not live in
the file: ``NOTIFIER_DATABASE_URL``, ``NOTIFIER_DATABASE_LISTEN_URL``, ``NOTIFIER_BROKER_URL``
(the nodes of a cluster separated by commas), ``NOTIFIER_SENTRY_DSN``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import re
import tomllib
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yarl

from notifier.errors import ConfigError
from notifier.validation import key_error, locate

CONFIG_ENV = "NOTIFIER_CONFIG"
ENV_OVERRIDES = {
    "NOTIFIER_DATABASE_URL": ("database", "url"),
    "NOTIFIER_DATABASE_LISTEN_URL": ("database", "listen_url"),
    "NOTIFIER_BROKER_URL": ("broker", "url"),
    "NOTIFIER_SENTRY_DSN": ("sentry", "dsn"),
}

# Half of RabbitMQ's default consumer_timeout (30 min): the longest a message may be held.
CONSUMER_TIMEOUT_BUDGET_SECONDS = 900

Positive = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
# The lowest rate a limit may have: one an hour. A bucket's period is 1/rate, and Postgres keeps
# times only so far (a rate of 1e-20 put its next token past any timestamp).
MIN_RATE_PER_SECOND = 1 / 3600


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class ServiceConfig(_Section, frozen=True):
    shutdown_grace_seconds: NonNegativeFloat = 10.0
    # In a launch (`--processes N`), a process not ready this long after its start is killed
    # and counted as a failed start.
    start_timeout_seconds: PositiveFloat = 60.0
    # Processes of one launch (`notifier run --processes`): a number, or "auto" for one per
    # core; 1 runs the roles in this process, with no supervising parent.
    processes: Positive | Literal["auto"] = 1

    def process_count(self) -> int:
        """``processes`` as a number: ``auto`` is the number of cores this process may use."""
        return process_count(self.processes)


def process_count(processes: int | Literal["auto"]) -> int:
    """A number of processes as ``service.processes`` or ``--processes`` gives it, as a number:
    ``auto`` is the number of cores this process may use."""
    return available_cores() if processes == "auto" else processes


CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_cores(cpu_limits: Iterable[str] | None = None) -> int:
    """The cores this process may use, at least 1: its CPU affinity, lowered to the CPU quota
    of its cgroup (``docker --cpus``, systemd's ``CPUQuota=``), rounded up. ``cpu_limits``:
    the ``cpu.max`` of its cgroup and of each one above it (cgroup v2); by default read from
    ``/sys/fs/cgroup``."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        cores = max(1, os.cpu_count() or 1)
    for cpu_max in _cgroup_cpu_limits() if cpu_limits is None else cpu_limits:
        if (quota := cpu_quota_cores(cpu_max)) is not None:
            cores = min(cores, quota)
    return cores


def cpu_quota_cores(cpu_max: str) -> int | None:
    """The cores a cgroup v2 ``cpu.max`` (``"max 100000"``, ``"200000 100000"``: quota and
    period in µs) allows, rounded up, at least 1; ``None`` without a quota (or unreadable)."""
    fields = cpu_max.split()
    if len(fields) != 2 or not all(f.isascii() and f.isdigit() for f in fields):
        return None
    quota, period = int(fields[0]), int(fields[1])
    if quota == 0 or period == 0:
        return None
    return max(1, math.ceil(quota / period))


def _cgroup_cpu_limits() -> Iterator[str]:
    """The ``cpu.max`` of this process's cgroup v2 and of each cgroup above it, as found."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:  # no cgroup v2 (v1 quotas are not read)
        return
    group = CGROUP_ROOT / path.strip().lstrip("/")
    for directory in (group, *group.parents):
        with contextlib.suppress(OSError):
            yield (directory / "cpu.max").read_text()
        if directory == CGROUP_ROOT:
            return


# Postgres takes statement_timeout in whole milliseconds, and 0 would turn it off.
DatabaseTimeout = Annotated[float, msgspec.Meta(ge=0.001, le=3600)]


class DatabaseConfig(_Section, frozen=True):
    url: str = "postgresql://postgres@127.0.0.1:5432/notifier"
    # What sits between notifier and Postgres at `url`: "none" (Postgres itself, or PgBouncer
    # in session pooling mode) or "pgbouncer" (PgBouncer in transaction pooling mode: no
    # prepared statement cache, the statement timeout set per transaction, no LISTEN on `url`).
    pooler: Literal["none", "pgbouncer"] = "none"
    # A direct connection to Postgres (not through a transaction pooler) for the outbox
    # doorbell's LISTEN; "" = LISTEN on `url` when pooler is "none", and no LISTEN at all (the
    # relay polls every relay.poll_interval_seconds) when it is "pgbouncer".
    listen_url: str = ""
    pool_max_size: Positive = 20
    connect_timeout_seconds: PositiveFloat = 5.0
    # Every store call waits at most this long for a pooled connection, then each of its
    # statements at most `statement_timeout_seconds` (plus a moment for the cancel to come
    # back): together below the 5-10 s HTTP clients usually wait, so a stalled Postgres answers
    # 503 instead of a client's timeout.
    acquire_timeout_seconds: DatabaseTimeout = 1.0
    statement_timeout_seconds: DatabaseTimeout = 3.0


AmqpUrl = Annotated[str, msgspec.Meta(pattern=r"^amqps?://")]


class BrokerConfig(_Section, frozen=True):
    # One node, or the nodes of one cluster: each connection picks a node and moves to the next
    # one that answers when its node is lost (docs/architecture.md §4).
    url: AmqpUrl | Annotated[tuple[AmqpUrl, ...], msgspec.Meta(min_length=1)] = (
        "amqp://guest:guest@127.0.0.1:5672/"
    )
    queue_type: Literal["quorum", "classic"] = "quorum"
    publish_timeout_seconds: PositiveFloat = 10.0
    heartbeat_seconds: Annotated[int, msgspec.Meta(ge=10, le=30)] = 15


class IngestConfig(_Section, frozen=True):
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
        if not re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[^\s:\[\]]+):\d{1,5}", self.bind):
            raise key_error("bind", f"must be HOST:PORT, got {self.bind!r}")
        if self.metrics_bind and not re.fullmatch(
            r"(\[[0-9a-fA-F:]+\]|[^\s:\[\]]+):\d{1,5}", self.metrics_bind
        ):
            raise key_error("metrics_bind", f"must be HOST:PORT, got {self.metrics_bind!r}")
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


class RelayConfig(_Section, frozen=True):
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 500
    poll_interval_seconds: PositiveFloat = 1.0


class RetryConfig(_Section, frozen=True):
    """The retry policy: exponential backoff from ``base_seconds`` capped at ``max_seconds``,
    rounded up to a delay tier. The worker's decisions take this section as it is."""

    base_seconds: PositiveFloat = 30.0
    max_seconds: PositiveFloat = 1800.0
    tiers_seconds: tuple[Positive, ...] = (1, 5, 15, 30, 60, 120, 240, 480, 960, 1800)

    def __post_init__(self) -> None:
        if not self.tiers_seconds:
            raise key_error("tiers_seconds", "must not be empty")
        if list(self.tiers_seconds) != sorted(set(self.tiers_seconds)):
            raise key_error("tiers_seconds", "must be strictly increasing")


class WorkerGroupConfig(_Section, frozen=True):
    """What every ``[workers.<type>]`` table has."""

    concurrency: Positive = 16
    prefetch: Positive = 64
    max_attempts: Positive = 5
    timeout_seconds: PositiveFloat = 10.0
    # The most worker tasks one destination (a webhook's origin; another type's channel) may
    # hold; unset: a quarter of concurrency (at least 1). docs/architecture.md §5.
    max_in_flight_per_destination: Positive | None = None
    # The circuit breaker of each destination (docs/architecture.md §5): this many consecutive
    # unreachable failures open it (0: no breaker); a half-open probe is tried after the base
    # interval, doubling after each failed probe up to the max.
    circuit_failure_threshold: Annotated[int, msgspec.Meta(ge=0)] = 5
    circuit_probe_base_seconds: PositiveFloat = 5.0
    circuit_probe_max_seconds: PositiveFloat = 300.0

    def __post_init__(self) -> None:
        if self.prefetch < self.concurrency:
            raise key_error("prefetch", f"must be at least concurrency ({self.concurrency})")
        cap = self.max_in_flight_per_destination
        if cap is not None and cap > self.concurrency:
            raise key_error(
                "max_in_flight_per_destination",
                f"must be at most concurrency ({self.concurrency})",
            )
        if self.circuit_probe_max_seconds < self.circuit_probe_base_seconds:
            base = self.circuit_probe_base_seconds
            raise key_error(
                "circuit_probe_max_seconds",
                f"must be at least circuit_probe_base_seconds ({base:g})",
            )
        # A prefetched message may wait for ceil(prefetch / concurrency) deliveries before its
        # own, and then, in its destination's waiting list, for one more; all of it must stay
        # far below RabbitMQ's consumer_timeout (30 min by default), or the broker closes the
        # channel and every unacked message is delivered again.
        worst = self.timeout_seconds * (-(-self.prefetch // self.concurrency) + 1)
        if worst > CONSUMER_TIMEOUT_BUDGET_SECONDS:
            raise key_error(
                "timeout_seconds",
                f"timeout_seconds * (ceil(prefetch / concurrency) + 1) = {worst:g} s; it must "
                f"stay under {CONSUMER_TIMEOUT_BUDGET_SECONDS} s (half of RabbitMQ's "
                "consumer_timeout)",
            )

    @property
    def in_flight_per_destination(self) -> int:
        """``max_in_flight_per_destination``, or its default: a quarter of ``concurrency``."""
        if self.max_in_flight_per_destination is not None:
            return self.max_in_flight_per_destination
        return max(1, self.concurrency // 4)


class ClientCertificateConfig(_Section, frozen=True):
    """``[workers.webhook.client_certificates.<name>]``: a client identity for mutual TLS, which a
    webhook channel names in ``tls_client_certificate``. The key never leaves its file."""

    cert_file: str  # PEM: the certificate, then any intermediates
    key_file: str  # PEM, unencrypted: the file's permissions protect it
    # Tenant ids whose channels may name it; empty: every tenant's.
    tenants: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in ("cert_file", "key_file"):
            if problem := file_problem(getattr(self, key)):
                raise key_error(key, problem)
        for i, tenant in enumerate(self.tenants):
            try:
                uuid.UUID(tenant)
            except ValueError:
                raise key_error(f"tenants[{i}]", f"not a tenant id (a UUID): {tenant!r}") from None


CLIENT_CERTIFICATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class WebhookWorkersConfig(WorkerGroupConfig, frozen=True):
    allow_private_networks: bool = False
    # Networks opened for internal receivers even while private networks are refused.
    allowed_cidrs: tuple[str, ...] = ()
    # After a channel's secret changes, the previous one keeps signing alongside it this long.
    secret_rotation_grace_seconds: NonNegativeFloat = 86_400.0
    # The nameservers webhook hosts are resolved with (`ip` or `ip:port`, `[ipv6]:port`);
    # empty: those of /etc/resolv.conf. /etc/hosts is read first either way.
    dns_servers: tuple[str, ...] = ()
    # A PEM bundle of CA certificates trusted besides the public roots (and SSL_CERT_FILE/_DIR).
    ca_file: str = ""
    # An HTTP CONNECT proxy every webhook connection goes through: http://[user:pass@]host:port.
    proxy_url: str = ""
    # Client identities for mutual TLS by name: tables of ClientCertificateConfig (read by
    # client_identities(), so that an error names the identity, which msgspec's path would not).
    client_certificates: dict[str, dict[str, Any]] = {}

    def client_identities(self) -> dict[str, ClientCertificateConfig]:
        """``client_certificates``, each table checked; an error names its whole key."""
        identities = {}
        for name, table in self.client_certificates.items():
            where = (
                f"client_certificates.{name}"
                if CLIENT_CERTIFICATE_NAME.fullmatch(name)
                else f"client_certificates.{name!r}"
            )
            try:
                identities[name] = msgspec.convert(table, ClientCertificateConfig)
            except msgspec.ValidationError as exc:
                path, text = locate(exc)
                raise key_error(f"{where}.{path}" if path else where, text) from None
        return identities

    def __post_init__(self) -> None:
        super().__post_init__()
        for i, cidr in enumerate(self.allowed_cidrs):
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise key_error(f"allowed_cidrs[{i}]", str(exc)) from exc
        for i, server in enumerate(self.dns_servers):
            try:
                nameserver_address(server)
            except ValueError as exc:
                raise key_error(f"dns_servers[{i}]", str(exc)) from exc

        if self.ca_file and (problem := file_problem(self.ca_file)):
            raise key_error("ca_file", problem)
        if self.proxy_url and (problem := proxy_url_problem(self.proxy_url)):
            raise key_error("proxy_url", problem)
        for name in self.client_certificates:
            if not CLIENT_CERTIFICATE_NAME.fullmatch(name):
                raise key_error(
                    f"client_certificates.{name!r}",
                    "a name is 1 to 64 letters, digits, '_', '.' or '-', starting with a letter "
                    "or digit",
                )
        self.client_identities()


def nameserver_address(text: str) -> tuple[str, int]:
    """A ``workers.webhook.dns_servers`` entry as ``(ip, port)``: ``192.0.2.53``,
    ``192.0.2.53:5353``, ``2001:db8::53`` or ``[2001:db8::53]:5353`` (port 53 by default)."""
    host, port = text, "53"
    if m := re.fullmatch(r"\[([^\]]+)\]:(\d{1,5})|([^:\[\]]+):(\d{1,5})", text):
        host, port = m[1] or m[3], m[2] or m[4]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"must be an IP address, optionally with :PORT, got {text!r}") from None
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port must be 1-65535, got {text!r}")
    return str(address), int(port)


def file_problem(path: str) -> str | None:
    """Why ``path`` is not a file this process can read, or None."""
    if not path:
        return "must not be empty"
    if not os.path.isfile(path):
        return f"{path!r} is not a file"
    if not os.access(path, os.R_OK):
        return f"{path!r} cannot be read by this process"
    return None


def proxy_url_problem(url: str) -> str | None:
    """Why ``url`` is not ``http://[user:pass@]host:port``, or None. Never quotes the URL, which
    may hold a password."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return (
            "not a URL that can be read (a port from 1 to 65535; percent-encode : @ / in the "
            "user name and password)"
        )
    if parts.scheme != "http":
        return "must be an http:// URL (an HTTP CONNECT proxy)"
    if not parts.hostname:
        return "no host name"
    if port is None:
        return "must name the port (http://host:port)"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must be http://[user:pass@]host:port, without a path, query or fragment"
    return None


class EmailWorkersConfig(WorkerGroupConfig, frozen=True):
    concurrency: Positive = 4
    prefetch: Positive = 16
    smtp_host: str = "127.0.0.1"
    smtp_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 25
    smtp_security: Literal["none", "starttls", "tls"] = "none"
    smtp_username: str = ""
    # The password is read from this environment variable, never from the file.
    smtp_password_env: str = "NOTIFIER_SMTP_PASSWORD"
    from_address: str = msgspec.field(name="from", default="notifier@localhost")


class TelegramWorkersConfig(WorkerGroupConfig, frozen=True):
    concurrency: Positive = 8
    prefetch: Positive = 32
    # The bot token is read from this environment variable, never from the file.
    bot_token_env: str = "NOTIFIER_TELEGRAM_TOKEN"
    api_base_url: str = "https://api.telegram.org"
    per_chat_per_second: PositiveFloat = 1.0
    per_bot_per_second: PositiveFloat = 30.0
    # One tenant's share of the bot: unset, a quarter of per_bot_per_second.
    per_tenant_per_second: PositiveFloat | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        tenant = self.per_tenant_per_second
        if tenant is not None and tenant > self.per_bot_per_second:
            raise key_error(
                "per_tenant_per_second",
                f"must be at most per_bot_per_second ({self.per_bot_per_second:g}), got {tenant:g}",
            )

    @property
    def tenant_rate_per_second(self) -> float:
        """``per_tenant_per_second``, or a quarter of ``per_bot_per_second`` when unset."""
        tenant = self.per_tenant_per_second
        return self.per_bot_per_second / 4 if tenant is None else tenant


class WorkersConfig(_Section, frozen=True):
    webhook: WebhookWorkersConfig | None = None
    email: EmailWorkersConfig | None = None
    telegram: TelegramWorkersConfig | None = None

    def enabled(self) -> dict[str, WorkerGroupConfig]:
        """The configured worker groups by channel type; a type is enabled by its table."""
        return {name: cfg for name in self.__struct_fields__ if (cfg := getattr(self, name))}


# -- operations (each section is filled in by the feature that uses it) ---------------------------


class LoggingConfig(_Section, frozen=True):
    format: Literal["json", "console"] = "json"
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class ChannelHealthConfig(_Section, frozen=True):
    # A channel whose deliveries have failed, without one success, for this long is disabled
    # automatically; 0 turns automatic disabling off (410 and 403 answers still disable).
    disable_after_failing_seconds: NonNegativeFloat = 5 * 86_400.0


class MaintenanceConfig(_Section, frozen=True):
    interval_seconds: PositiveFloat = 30.0
    # A PENDING/RETRYING delivery this long past its due time, with no outbox row, is enqueued
    # again (the broker lost its message).
    stuck_after_seconds: PositiveFloat = 600.0
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 500
    # Events (with their deliveries and attempts) older than this are deleted; 0 keeps them all.
    retention_days: Annotated[int, msgspec.Meta(ge=0)] = 30


class AmqpIngestConfig(_Section, frozen=True):
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


class SentryConfig(_Section, frozen=True):
    dsn: str = ""
    environment: str = ""


class ConsoleConfig(_Section, frozen=True):
    """The operator console (``/console``, served by the ``ingest`` role)."""

    # The variable holding the secret that signs session cookies; unset or empty: a random
    # secret per process (sessions end on restart and hold on one process only).
    session_secret_env: str = "NOTIFIER_CONSOLE_SESSION_SECRET"
    session_max_age_seconds: Annotated[int, msgspec.Meta(ge=60, le=30 * 86_400)] = 8 * 3600
    # The reverse proxies (CIDRs) whose X-Forwarded-For is believed: the sign-in slow-down then
    # counts the right-most forwarded address that is not one of them. Empty: the connection's.
    trusted_proxies: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for i, cidr in enumerate(self.trusted_proxies):
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise key_error(f"trusted_proxies[{i}]", str(exc)) from exc


class Config(_Section, frozen=True):
    service: ServiceConfig = msgspec.field(default_factory=ServiceConfig)
    database: DatabaseConfig = msgspec.field(default_factory=DatabaseConfig)
    broker: BrokerConfig = msgspec.field(default_factory=BrokerConfig)
    ingest: IngestConfig = msgspec.field(default_factory=IngestConfig)
    relay: RelayConfig = msgspec.field(default_factory=RelayConfig)
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    workers: WorkersConfig = msgspec.field(default_factory=WorkersConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    channel_health: ChannelHealthConfig = msgspec.field(default_factory=ChannelHealthConfig)
    maintenance: MaintenanceConfig = msgspec.field(default_factory=MaintenanceConfig)
    amqp_ingest: AmqpIngestConfig = msgspec.field(default_factory=AmqpIngestConfig)
    sentry: SentryConfig = msgspec.field(default_factory=SentryConfig)
    console: ConsoleConfig = msgspec.field(default_factory=ConsoleConfig)


def _friendly(exc: msgspec.ValidationError) -> str:
    """msgspec says ``... - at `$.workers.webhook`[0]``; we say ``workers.webhook[0]: ...``,
    naming the whole key (a section's own check names its key with ``key_error``) and, for a
    key with a set of allowed values, those values."""
    path, text = locate(exc, Config)
    return f"{path or '(top level)'}: {text}"


def _env_value(var: str, value: str) -> str | list[str]:
    """``NOTIFIER_BROKER_URL`` holds one URL or several separated by commas (a comma in a
    password is written ``%2C``); the other variables hold one value."""
    if var == "NOTIFIER_BROKER_URL" and "," in value:
        return [part.strip() for part in value.split(",")]
    return value


def parse_config(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """Validate an already-parsed TOML document, after applying environment overrides."""
    merged: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for var, (section, key) in ENV_OVERRIDES.items():
        value = (env if env is not None else os.environ).get(var)
        if value:
            table = merged.setdefault(section, {})
            if not isinstance(table, dict):
                raise ConfigError(f"{section}: expected a table")
            table[key] = _env_value(var, value)
    try:
        config = msgspec.convert(merged, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(_friendly(exc)) from exc
    for key in ("url", "listen_url"):
        if (dsn := getattr(config.database, key)) and (problem := postgres_url_problem(dsn)):
            raise ConfigError(f"database.{key}: {problem}")
    metrics_token(config.ingest, env if env is not None else os.environ)  # set, it must do
    nodes = config.broker.url
    for i, url in enumerate((nodes,) if isinstance(nodes, str) else nodes):
        if problem := amqp_url_problem(url):
            where = "broker.url" if isinstance(nodes, str) else f"broker.url[{i}]"
            raise ConfigError(f"{where}: {problem}")
    return config


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


_ENCODE_HINT = "percent-encode / # ? : @ in the user name and password (%2F %23 %3F %3A %40)"


def postgres_url_problem(url: str) -> str | None:
    """What keeps asyncpg from reading ``url`` as a Postgres DSN, or ``None``. Never a part of
    the URL: it holds a password. Checked as asyncpg reads it (the user and password before
    the first ``@``; hosts separated by commas, each with an optional numeric port), so a
    password with an unencoded ``/``, ``#``, ``?`` or ``@`` is caught here, at the start,
    not as a baffling error of every connection."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("postgres", "postgresql"):
        return "must be a postgresql:// URL"
    hosts = parts.netloc.partition("@")[2] if "@" in parts.netloc else parts.netloc
    for host in hosts.split(",") if hosts else ():
        if host.startswith("["):
            bracketed = re.fullmatch(r"\[[^\]]+\](?::(.*))?", host)
            port = (bracketed.group(1) or "") if bracketed else "x"
        else:
            name, _, port = host.partition(":")
            if "@" in name:
                return f"a host name with @ in it: {_ENCODE_HINT}"
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            return f"a port that is not a number from 1 to 65535: {_ENCODE_HINT}"
    return None


def amqp_url_problem(url: str) -> str | None:
    """What keeps aiormq from reading ``url`` as a RabbitMQ node's URL, or ``None``. Never a
    part of the URL: it holds a password. Read with yarl, as aiormq reads it, so that a password
    with an unencoded ``/``, ``#``, ``?`` or ``@`` is caught here, at the start, not as an error
    of every connection to the node."""
    try:
        parsed = yarl.URL(url)
        port = parsed.explicit_port
    except ValueError:
        return f"not a URL that can be read: {_ENCODE_HINT}"
    if parsed.scheme not in ("amqp", "amqps"):
        return "must be an amqp:// or amqps:// URL"
    if not parsed.host:
        return "no host name"
    if port is not None and not 0 < port < 65536:
        return f"a port that is not a number from 1 to 65535: {_ENCODE_HINT}"
    return None


def load_config(
    path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None
) -> Config:
    """Load the config from ``path``, or from ``$NOTIFIER_CONFIG``; with neither, the defaults."""
    environ = env if env is not None else os.environ
    chosen = path if path is not None else environ.get(CONFIG_ENV)
    data: dict[str, Any] = {}
    if chosen:
        try:
            text = Path(chosen).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {chosen}: {exc.strerror}") from exc
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{chosen}: invalid TOML: {exc}") from exc
    return parse_config(data, environ)
