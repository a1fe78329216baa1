"""The channel types, each declared once: per type its ``[workers.<type>]`` settings (with its
default worker settings), the struct of a channel's ``config``, the validator the API checks a
config with, the config fields that are secret, an example for the OpenAPI document, and how the
deliverer is built. Config, the OpenAPI document, the channels API and the service read this.

Validators need no secret, so every role that serves the API builds them; deliverers (secrets,
connections) are built by ``registry.build_adapters``, only where workers run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from notifier.adapters import email, telegram, telegram_channels
from notifier.adapters.base import Adapter, ChannelValidator
from notifier.adapters.webhook import WebhookAdapter, channels
from notifier.adapters.webhook.proxy import ProxyDialer
from notifier.adapters.webhook.tls import load_tls
from notifier.config import (
    Config,
    EmailWorkersConfig,
    TelegramWorkersConfig,
    WebhookWorkersConfig,
    WorkerGroupConfig,
    WorkersConfig,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChannelSpec:
    settings: type[WorkerGroupConfig]  # the [workers.<type>] table
    config: type[msgspec.Struct]  # a channel's `config`
    validator: Callable[[Any], ChannelValidator]  # from the settings
    deliverer: Callable[[Any, Mapping[str, str]], Adapter]  # from the settings and environment
    example: dict[str, Any]  # a channel `config`, for the OpenAPI document


def _webhook_validator(settings: WebhookWorkersConfig) -> ChannelValidator:
    return channels.WebhookChannels(
        timeout_seconds=settings.timeout_seconds,
        allow_private_networks=settings.allow_private_networks,
        allowed_cidrs=settings.allowed_cidrs,
        secret_rotation_grace_seconds=settings.secret_rotation_grace_seconds,
        dns_servers=settings.dns_servers,
        client_certificates={
            name: cert.tenants for name, cert in settings.client_identities().items()
        },
    )


def _webhook_deliverer(settings: WebhookWorkersConfig, environ: Mapping[str, str]) -> Adapter:
    tls = load_tls(settings, environ)  # SSL_CERT_FILE / SSL_CERT_DIR as OpenSSL reads them
    return WebhookAdapter(
        timeout_seconds=settings.timeout_seconds,
        allow_private_networks=settings.allow_private_networks,
        allowed_cidrs=settings.allowed_cidrs,
        dns_servers=settings.dns_servers,
        dialer=ProxyDialer(settings.proxy_url) if settings.proxy_url else None,
        ssl_context=tls.context,
        identities=tls.identities,
    )


SPECS: dict[str, ChannelSpec] = {
    "webhook": ChannelSpec(
        settings=WebhookWorkersConfig, config=channels.WebhookConfig,
        validator=_webhook_validator, deliverer=_webhook_deliverer,
        example=channels.EXAMPLE,
    ),
    "email": ChannelSpec(
        settings=EmailWorkersConfig, config=email.EmailConfig, validator=email.EmailChannels,
        deliverer=email.EmailAdapter.from_config,
        example=email.EXAMPLE,
    ),
    "telegram": ChannelSpec(
        settings=TelegramWorkersConfig, config=telegram_channels.TelegramConfig,
        validator=telegram_channels.TelegramChannels,
        deliverer=telegram.TelegramAdapter.from_config,
        example=telegram_channels.EXAMPLE,
    ),
}  # fmt: skip

# `[workers]` has one table per spec, of the spec's settings type (the config module declares
# the tables; it cannot import the adapters, which read their settings from it).
assert set(SPECS) == set(WorkersConfig.__struct_fields__), "a channel type without a spec"


def build_validators(config: Config) -> dict[str, ChannelValidator]:
    """The validator of each channel type enabled in ``[workers.<type>]``. Needs no secret;
    raises ``ConfigError`` for settings no channel could be served under."""
    return {t: SPECS[t].validator(s) for t, s in config.workers.enabled().items()}
