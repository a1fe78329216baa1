"""The explicit registry: channel type → adapter, built from the enabled worker tables."""

from __future__ import annotations

from notifier.adapters.base import Adapter
from notifier.adapters.webhook import WebhookAdapter
from notifier.config import Config


def build_adapters(config: Config) -> dict[str, Adapter]:
    """One adapter per channel type enabled in ``[workers.<type>]``."""
    adapters: dict[str, Adapter] = {}
    if (webhook := config.workers.webhook) is not None:
        adapters["webhook"] = WebhookAdapter(
            timeout_seconds=webhook.timeout_seconds,
            allow_private_networks=webhook.allow_private_networks,
        )
    return adapters


def default_max_attempts(config: Config) -> dict[str, int]:
    return {name: cfg.max_attempts for name, cfg in config.workers.enabled().items()}
