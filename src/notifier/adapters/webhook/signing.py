"""Webhook signing as Standard Webhooks defines it: the secrets, the signature, the envelope of
an attempt, and rotation (the secret a PATCH replaced keeps signing for a grace period)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from typing import Any

import msgspec

from notifier.messages import WorkerMessage

SECRET_PREFIX = "whsec_"
# Secret rotation: the secret a PATCH replaced keeps signing until this time (epoch seconds).
PREVIOUS_SECRET = "previous_secret"
PREVIOUS_SECRET_EXPIRES_AT = "previous_secret_expires_at"
ROTATION_FIELDS = (PREVIOUS_SECRET, PREVIOUS_SECRET_EXPIRES_AT)


def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` as Standard Webhooks defines it."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signing_secrets(config: dict[str, Any], now: float) -> list[str]:
    """The secrets a delivery is signed with: the channel's secret, then the one it replaced
    while that is still inside its grace period."""
    out: list[str] = []
    current = config.get("secret")
    if isinstance(current, str) and current:
        out.append(current)
    previous = config.get(PREVIOUS_SECRET)
    expires_at = config.get(PREVIOUS_SECRET_EXPIRES_AT)
    if (
        isinstance(previous, str)
        and previous
        and previous != current
        and isinstance(expires_at, int | float)
        and now < expires_at
    ):
        out.append(previous)
    return out


def rotate_secret(
    stored: dict[str, Any], new_secret: str, *, now: float, grace_seconds: float
) -> dict[str, Any]:
    """The rotation fields of a channel whose stored config is ``stored`` and whose secret is
    now ``new_secret``: a replaced secret keeps signing for ``grace_seconds``; an unchanged
    secret keeps a previous one that has not expired. Only the latest replaced secret is kept."""
    old = stored.get("secret")
    if isinstance(old, str) and old and old != new_secret:
        if grace_seconds <= 0:
            return {}
        return {PREVIOUS_SECRET: old, PREVIOUS_SECRET_EXPIRES_AT: now + grace_seconds}
    previous = stored.get(PREVIOUS_SECRET)
    expires_at = stored.get(PREVIOUS_SECRET_EXPIRES_AT)
    if (
        isinstance(previous, str)
        and previous != new_secret
        and isinstance(expires_at, int | float)
        and now < expires_at
    ):
        return {PREVIOUS_SECRET: previous, PREVIOUS_SECRET_EXPIRES_AT: expires_at}
    return {}


def build_request(
    message: WorkerMessage,
    secret: str | Sequence[str] | None,
    headers: dict[str, str],
    now: int,
) -> tuple[dict[str, str], bytes]:
    """The headers and body of one attempt. ``webhook-id`` is stable across retries; with
    several secrets (a rotation) ``webhook-signature`` has one space-separated entry each."""
    body = msgspec.json.encode(
        {"type": message.event_type, "timestamp": message.created_at, "data": message.payload}
    )
    msg_id = str(message.delivery_id)
    ours = {
        "content-type": "application/json",
        "user-agent": "notifier",
        "accept-encoding": "identity",  # the answer is only excerpted: no decompression
        "webhook-id": msg_id,
        "webhook-timestamp": str(now),
    }
    out = {k: v for k, v in headers.items() if k.lower() not in ours}
    out.update(ours)
    keys = [secret] if isinstance(secret, str) else list(secret or ())
    signatures = [sign(key, msg_id, now, body) for key in keys if key]
    if signatures:
        out["webhook-signature"] = " ".join(signatures)
    return out, body
