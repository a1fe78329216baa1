"""``[alerts]``: the failure alerts of dead deliveries (``notifier.alerts``): what their context
holds, and the optional operator webhook they are also sent to."""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from collections.abc import Mapping
from typing import Annotated

import msgspec

from notifier.config.base import PositiveFloat, Section
from notifier.errors import ConfigError
from notifier.validation import key_error

# The prefix of a Standard Webhooks secret (notifier.adapters.webhook.signing signs with it).
SECRET_PREFIX = "whsec_"


class AlertsConfig(Section, frozen=True):
    # Where each dead delivery's alert is POSTed (http or https); empty: no operator webhook
    # (Sentry, when configured, still gets the context). Env: NOTIFIER_ALERTS_DEAD_WEBHOOK_URL.
    dead_webhook_url: str = ""
    # The environment variable holding the whsec_<base64> secret the alerts are signed with
    # (Standard Webhooks headers); empty: alerts go unsigned.
    dead_webhook_secret_env: str = ""
    # One POST of an alert, and how many POSTs it gets before it is dropped (counted).
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 5.0
    max_tries: Annotated[int, msgspec.Meta(ge=1, le=10)] = 3
    # Alerts waiting to be sent; past this the oldest is dropped (counted).
    buffer_size: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1000
    # The latest attempts an alert lists, and the bytes of the payload (compact JSON) it quotes.
    history_attempts: Annotated[int, msgspec.Meta(ge=1, le=100)] = 5
    payload_excerpt_bytes: Annotated[int, msgspec.Meta(ge=0, le=65_536)] = 1024
    # The first wait between two tries of a POST (doubled after each failed try).
    retry_backoff_seconds: PositiveFloat = 1.0

    def __post_init__(self) -> None:
        if self.dead_webhook_url and (problem := alert_url_problem(self.dead_webhook_url)):
            raise key_error("dead_webhook_url", problem)
        if self.dead_webhook_secret_env and not self.dead_webhook_url:
            raise key_error("dead_webhook_secret_env", "set without alerts.dead_webhook_url")


def alert_url_problem(url: str) -> str | None:
    """Why ``url`` cannot receive alerts, or None. Never quotes the URL (it may hold a token)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError:
        return "not a URL that can be read (a port from 1 to 65535)"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "no host name"
    if parts.username is not None or parts.password is not None:
        return "must not hold a user name or password (alerts are signed: dead_webhook_secret_env)"
    return None


def alert_secret(alerts: AlertsConfig, environ: Mapping[str, str]) -> str | None:
    """The secret alerts are signed with, read from the variable ``dead_webhook_secret_env``
    names; None when that key is unset. A missing or malformed secret is a ``ConfigError``
    naming the key and the variable, never the value."""
    if not (var := alerts.dead_webhook_secret_env):
        return None
    secret = environ.get(var, "")
    where = f"alerts.dead_webhook_secret_env: the environment variable {var}"
    if not secret:
        raise ConfigError(f"{where} is not set or empty")
    try:
        raw = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
        ok = secret.startswith(SECRET_PREFIX) and len(raw) >= 24
    except (binascii.Error, ValueError):
        ok = False
    if not ok:
        raise ConfigError(
            f"{where} must hold a Standard Webhooks secret, whsec_ and at least 24 bytes in "
            "base64 (as a webhook channel's)"
        )
    return secret
