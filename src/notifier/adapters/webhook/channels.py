"""A webhook channel's config: its struct, its validation at create and PATCH (the URL and SSRF
checks that need no network, the header rule, the secret's form, rotation), and the check of the
destination's addresses at create. None of it needs a secret, so every role that serves the API
builds it; the deliverer is ``adapter.WebhookAdapter``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import msgspec
import trio

from notifier.adapters.base import InvalidChannelConfig
from notifier.adapters.webhook.headers import headers_problem
from notifier.adapters.webhook.signing import (
    ROTATION_FIELDS,
    SECRET_PREFIX,
    generate_secret,
    rotate_secret,
    secret_bytes,
)
from notifier.adapters.webhook.ssrf import (
    NetworkRules,
    Resolver,
    blocked_message,
    default_port,
    dial_host,
    literal_address,
    system_resolver,
    validate_url,
)
from notifier.validation import describe

# Config keys never shown after creation and kept across a PATCH that does not name them.
SECRET_FIELDS = frozenset({"secret", *ROTATION_FIELDS})
EXAMPLE = {"url": "https://hooks.example.com/notifier"}


class WebhookConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: str
    secret: str | None = None
    headers: dict[str, str] = {}


class WebhookChannels:
    """The ``ChannelValidator`` of webhook channels, under ``[workers.webhook]``'s network rules."""

    secret_fields = SECRET_FIELDS

    def __init__(
        self,
        *,
        timeout_seconds: float,
        allow_private_networks: bool,
        allowed_cidrs: Iterable[str] = (),
        secret_rotation_grace_seconds: float = 86_400.0,
        resolver: Resolver = system_resolver,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``resolver`` is for tests and embedding; ``clock`` gives epoch seconds."""
        self._rules = NetworkRules.of(
            timeout_seconds, allow_private_networks, allowed_cidrs, resolver
        )
        self._grace = secret_rotation_grace_seconds
        self._clock = clock

    def prepare_config(self, config: dict[str, Any]) -> dict[str, Any]:
        try:
            cfg = msgspec.convert(config, WebhookConfig)
        except msgspec.ValidationError as exc:
            raise InvalidChannelConfig(*describe(exc, "config")) from exc
        validate_url(cfg.url, allow_private_networks=self._rules.allow_private_networks,
                     allowed_cidrs=self._rules.allowed)  # fmt: skip
        if (problem := headers_problem(cfg.headers)) is not None:
            raise InvalidChannelConfig(*problem)
        secret = cfg.secret
        if secret is None:
            secret = generate_secret()
        else:
            try:
                raw = secret_bytes(secret)
            except ValueError as exc:
                raise InvalidChannelConfig(
                    "config.secret", "must be whsec_ followed by base64"
                ) from exc
            if not secret.startswith(SECRET_PREFIX) or not 24 <= len(raw) <= 64:
                raise InvalidChannelConfig(
                    "config.secret", "must be whsec_ followed by base64 of 24 to 64 bytes"
                )
        return {"url": cfg.url, "secret": secret, "headers": dict(cfg.headers)}

    def prepare_config_update(
        self, config: dict[str, Any], previous: dict[str, Any]
    ) -> dict[str, Any]:
        """``prepare_config`` for a PATCH of a channel whose stored config is ``previous``: a
        new secret starts a rotation (the replaced one keeps signing for the grace period)."""
        config = dict(config)
        if "secret" in config and config["secret"] is None:
            # A generated secret is shown only in the 201 of a create: after a PATCH nobody
            # would ever learn it.
            raise InvalidChannelConfig("config.secret", "a PATCH must give the new secret")
        for key in ROTATION_FIELDS:
            # The API carries secret fields over from the stored config; anything else is a
            # client trying to set them.
            if key in config and config.pop(key) != previous.get(key):
                raise InvalidChannelConfig(f"config.{key}", "is managed by notifier")
        prepared = self.prepare_config(config)
        prepared.update(
            rotate_secret(previous, prepared["secret"], now=self._clock(),
                          grace_seconds=self._grace)
        )  # fmt: skip
        return prepared

    async def check_destination(self, config: dict[str, Any]) -> None:
        """At channel create/patch: refuse a host that resolves to a blocked address now. A
        host that does not resolve is accepted (its DNS may not be set up yet); every delivery
        resolves again and fails closed."""
        if self._rules.allow_private_networks:
            return
        url = httpx.URL(config["url"])
        host = dial_host(url)
        if literal_address(host) is not None:
            return  # checked by validate_url already
        try:
            addresses = await self._rules.resolve(host, default_port(url))
        except (OSError, trio.TooSlowError):
            return
        if (blocked := self._rules.first_blocked(addresses)) is not None:
            raise InvalidChannelConfig("config.url", blocked_message(host, *blocked))
