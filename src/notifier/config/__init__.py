"""Configuration: TOML → frozen, validated structures.

Unknown keys and wrong types are refused with the key's dotted path in the message. Database and
broker URLs and the Sentry DSN can be overridden from the environment, so secrets need not live in
the file: ``NOTIFIER_DATABASE_URL``, ``NOTIFIER_DATABASE_LISTEN_URL``, ``NOTIFIER_BROKER_URL``
(the nodes of a cluster separated by commas), ``NOTIFIER_SENTRY_DSN``,
``NOTIFIER_ALERTS_DEAD_WEBHOOK_URL``, ``NOTIFIER_OTLP_ENDPOINT``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from notifier.config.alerts import AlertsConfig, alert_secret
from notifier.config.base import (
    CONSUMER_TIMEOUT_BUDGET_SECONDS,
    MIN_RATE_PER_SECOND,
    NonNegativeFloat,
    Positive,
    PositiveFloat,
    Section,
)
from notifier.config.connections import (
    BrokerConfig,
    DatabaseConfig,
    amqp_url_problem,
    postgres_url_problem,
)
from notifier.config.ingest import (
    MIN_METRICS_TOKEN_CHARS,
    AmqpIngestConfig,
    ConsoleConfig,
    IngestConfig,
    metrics_token,
)
from notifier.config.operations import (
    ChannelHealthConfig,
    LoggingConfig,
    MaintenanceConfig,
    SentryConfig,
)
from notifier.config.service import (
    CGROUP_ROOT,
    ServiceConfig,
    available_cores,
    cpu_quota_cores,
    process_count,
)
from notifier.config.tracing import TracingConfig, otlp_endpoint_problem
from notifier.config.webhook import (
    CLIENT_CERTIFICATE_NAME,
    ClientCertificateConfig,
    WebhookWorkersConfig,
    file_problem,
    nameserver_address,
    proxy_url_problem,
)
from notifier.config.workers import (
    EmailWorkersConfig,
    RelayConfig,
    RetryConfig,
    TelegramWorkersConfig,
    WorkerGroupConfig,
)
from notifier.errors import ConfigError
from notifier.validation import locate

__all__ = [
    "CGROUP_ROOT",
    "CLIENT_CERTIFICATE_NAME",
    "CONFIG_ENV",
    "CONSUMER_TIMEOUT_BUDGET_SECONDS",
    "ENV_OVERRIDES",
    "MIN_METRICS_TOKEN_CHARS",
    "MIN_RATE_PER_SECOND",
    "AlertsConfig",
    "AmqpIngestConfig",
    "BrokerConfig",
    "ChannelHealthConfig",
    "ClientCertificateConfig",
    "Config",
    "ConfigError",
    "ConsoleConfig",
    "DatabaseConfig",
    "EmailWorkersConfig",
    "IngestConfig",
    "LoggingConfig",
    "MaintenanceConfig",
    "NonNegativeFloat",
    "Positive",
    "PositiveFloat",
    "RelayConfig",
    "RetryConfig",
    "Section",
    "SentryConfig",
    "ServiceConfig",
    "TelegramWorkersConfig",
    "TracingConfig",
    "WebhookWorkersConfig",
    "WorkerGroupConfig",
    "WorkersConfig",
    "alert_secret",
    "amqp_url_problem",
    "available_cores",
    "cpu_quota_cores",
    "file_problem",
    "load_config",
    "metrics_token",
    "nameserver_address",
    "otlp_endpoint_problem",
    "parse_config",
    "postgres_url_problem",
    "process_count",
    "proxy_url_problem",
]

CONFIG_ENV = "NOTIFIER_CONFIG"
ENV_OVERRIDES = {
    "NOTIFIER_DATABASE_URL": ("database", "url"),
    "NOTIFIER_DATABASE_LISTEN_URL": ("database", "listen_url"),
    "NOTIFIER_BROKER_URL": ("broker", "url"),
    "NOTIFIER_SENTRY_DSN": ("sentry", "dsn"),
    "NOTIFIER_ALERTS_DEAD_WEBHOOK_URL": ("alerts", "dead_webhook_url"),
    "NOTIFIER_OTLP_ENDPOINT": ("tracing", "otlp_endpoint"),
}


class WorkersConfig(Section, frozen=True):
    webhook: WebhookWorkersConfig | None = None
    email: EmailWorkersConfig | None = None
    telegram: TelegramWorkersConfig | None = None

    def enabled(self) -> dict[str, WorkerGroupConfig]:
        """The configured worker groups by channel type; a type is enabled by its table."""
        return {name: cfg for name in self.__struct_fields__ if (cfg := getattr(self, name))}


class Config(Section, frozen=True):
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
    alerts: AlertsConfig = msgspec.field(default_factory=AlertsConfig)
    console: ConsoleConfig = msgspec.field(default_factory=ConsoleConfig)
    tracing: TracingConfig = msgspec.field(default_factory=TracingConfig)


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
    alert_secret(config.alerts, env if env is not None else os.environ)  # likewise
    nodes = config.broker.url
    for i, url in enumerate((nodes,) if isinstance(nodes, str) else nodes):
        if problem := amqp_url_problem(url):
            where = "broker.url" if isinstance(nodes, str) else f"broker.url[{i}]"
            raise ConfigError(f"{where}: {problem}")
    return config


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
