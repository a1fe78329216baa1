"""The explicit registry: channel type → adapter, built from the enabled worker tables."""

from __future__ import annotations

import os
from collections.abc import Mapping

from notifier.adapters.base import Adapter
from notifier.adapters.email import EmailAdapter
from notifier.adapters.telegram import TelegramAdapter
from notifier.adapters.webhook import WebhookAdapter
from notifier.config import Config


def build_adapters(config: Config, environ: Mapping[str, str] | None = None) -> dict[str, Adapter]:
    """One adapter per channel type enabled in ``[workers.<type>]``. Secrets named in the config
    (the bot token, the SMTP password) are read from ``environ`` (default: the process
    environment)."""
    adapters: dict[str, Adapter] = {}
    if (webhook := config.workers.webhook) is not None:
        adapters["webhook"] = WebhookAdapter(
            timeout_seconds=webhook.timeout_seconds,
            allow_private_networks=webhook.allow_private_networks,
            allowed_cidrs=webhook.allowed_cidrs,
            secret_rotation_grace_seconds=webhook.secret_rotation_grace_seconds,
        )
    if (email := config.workers.email) is not None:
        adapters["email"] = EmailAdapter.from_config(
            email, os.environ if environ is None else environ
        )
    if (telegram := config.workers.telegram) is not None:
        adapters["telegram"] = TelegramAdapter.from_config(
            telegram, os.environ if environ is None else environ
        )
    return adapters


def default_max_attempts(config: Config) -> dict[str, int]:
    return {name: cfg.max_attempts for name, cfg in config.workers.enabled().items()}
