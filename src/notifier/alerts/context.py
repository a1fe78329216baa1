"""What a failure alert says about a dead delivery, built without I/O: the ``AlertContext``, the
destination as an origin that holds no secret, the payload excerpt with secret-looking keys
scrubbed, and the latest attempts (docs/architecture.md §5, "Failure alerts").

Everything here is pure: the history comes in as rows the store read (``DeadHistory``), the
delivery as the worker's ``Outcome``.
"""

from __future__ import annotations

import itertools
import re
import urllib.parse
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import msgspec

from notifier.secrets import SECRETS
from notifier.store.rows import AttemptRow, DeadHistory
from notifier.worker.observe import Outcome

SCRUBBED = "[scrubbed]"
# An error (an attempt's, the delivery's last) is cut to this many characters.
ERROR_CHARS = 300
# Deeper than this, a payload's values are not looked into: they are left out.
MAX_DEPTH = 32
TOO_DEEP = "[too deep]"

# Keys whose value is a secret whatever it looks like: matched against the key lowercased, with
# '-' and ' ' read as '_' (so "API-Key", "apiKey" and "x_api_key" all match), a word's plural
# as the word ("tokens", "apiKeys"). Words that merely contain one of these ("tokenizer",
# "secretary", "author") are not secrets: only whole words of the key's name (split at '_' and
# at camelCase) or the compounds listed count.
_SECRET_WORDS = frozenset(
    {
        "password", "passwd", "pwd", "passphrase", "secret", "token", "jwt", "bearer",
        "apikey", "authorization", "auth", "cookie", "credential", "signature", "privatekey",
        "accesskey", "clientkey", "signingkey", "encryptionkey", "pin", "cvv", "cvc", "otp",
        "sessionid",
    }
)  # fmt: skip
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _secret_word(word: str) -> bool:
    return word in _SECRET_WORDS or (word.endswith("s") and word[:-1] in _SECRET_WORDS)


def is_secret_key(key: str) -> bool:
    """Whether a payload key names a secret: one of its words (``client_secret``,
    ``accessToken``, ``X-Api-Key``, ``set-cookie``, ``refreshTokens``) or two adjacent words
    joined (``api_key``, ``private_keys``, ``session_id``) is a secret word or its plural."""
    words = [w for w in re.split(r"[_\-\s.]+", _CAMEL.sub("_", key).lower()) if w]
    if any(_secret_word(w) for w in words):
        return True
    return any(_secret_word(a + b) for a, b in itertools.pairwise(words))


def scrub(value: Any, depth: int = 0) -> Any:
    """``value`` (decoded JSON) with the value of every secret-looking key, at any depth,
    replaced by ``"[scrubbed]"``, and strings that hold a recognisable secret (a registered
    one, an API key, a webhook secret, a bearer token, a URL's password) redacted."""
    if depth >= MAX_DEPTH:
        return TOO_DEEP
    if isinstance(value, dict):
        return {
            k: SCRUBBED if isinstance(k, str) and is_secret_key(k) else scrub(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [scrub(v, depth + 1) for v in value]
    if isinstance(value, str):
        return SECRETS.scrub(value)
    return value


def payload_excerpt(payload: Any, limit_bytes: int) -> tuple[str, bool]:
    """The scrubbed payload as compact JSON (what ``msgspec.json.encode(scrub(payload))``
    gives), cut to ``limit_bytes`` at a character boundary, and whether it was cut.

    The JSON is written piece by piece and only until the limit is passed, so a large payload
    costs about the excerpt's size, not its own: the alert task shares the worker's thread. A
    long string is cut to ``limit_bytes + STRING_MARGIN`` characters before it is scrubbed; a
    secret shorter than the margin that starts inside the excerpt is still whole there."""
    out = bytearray()
    for chunk in _json_chunks(payload, 0, limit_bytes + STRING_MARGIN):
        out += chunk
        if len(out) > limit_bytes:
            return bytes(out[:limit_bytes]).decode("utf-8", "ignore"), True
    return out.decode(), False


# See payload_excerpt: how much of a long string beyond the excerpt's size is scrubbed with it.
STRING_MARGIN = 256


def _json_chunks(value: Any, depth: int, max_chars: int) -> Iterator[bytes]:
    """Compact JSON of ``scrub(value)``, in pieces, strings cut to ``max_chars``."""
    encode = msgspec.json.encode
    if depth >= MAX_DEPTH:
        yield encode(TOO_DEEP)
    elif isinstance(value, dict):
        yield b"{"
        for i, (key, item) in enumerate(value.items()):
            if i:
                yield b","
            yield encode(str(key))
            yield b":"
            if isinstance(key, str) and is_secret_key(key):
                yield encode(SCRUBBED)
            else:
                yield from _json_chunks(item, depth + 1, max_chars)
        yield b"}"
    elif isinstance(value, list):
        yield b"["
        for i, item in enumerate(value):
            if i:
                yield b","
            yield from _json_chunks(item, depth + 1, max_chars)
        yield b"]"
    elif isinstance(value, str):
        yield encode(SECRETS.scrub(value[:max_chars]))
    else:
        yield encode(value)


def short_error(error: str | None, limit: int = ERROR_CHARS) -> str | None:
    """An error as an alert quotes it: scrubbed of secrets, cut to ``limit`` characters."""
    if error is None:
        return None
    text = SECRETS.scrub(error)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def destination_origin(channel_type: str, config: dict[str, Any], channel_id: uuid.UUID) -> str:
    """Where the channel delivers, in a form that holds no secret: a webhook's origin
    (``scheme://host:port``; never its path, query or credentials), the domains of an email's
    recipients, a Telegram chat's public ``@name`` (a numeric chat id only by its last
    digits); another type's channel id."""
    if channel_type == "webhook":
        return _url_origin(config.get("url"))
    if channel_type == "email":
        to = config.get("to")
        addresses = [to] if isinstance(to, str) else to if isinstance(to, list) else []
        domains = sorted(
            {a.rpartition("@")[2].lower() for a in addresses if isinstance(a, str) and "@" in a}
        )
        return "email:" + ",".join(f"@{d}" for d in domains) if domains else "email:(unknown)"
    if channel_type == "telegram":
        chat = config.get("chat_id")
        if isinstance(chat, str) and chat.startswith("@"):
            return f"telegram:{chat}"
        if isinstance(chat, int | str) and str(chat):
            return f"telegram:chat …{str(chat)[-4:]}"
        return "telegram:(unknown)"
    return f"{channel_type}:channel:{channel_id}"


def _url_origin(url: object) -> str:
    """``scheme://host:port`` of ``url`` (the default port written out), or a placeholder."""
    if not isinstance(url, str):
        return "(no url)"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "(invalid url)"
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        return "(invalid url)"
    port = port or (443 if parts.scheme == "https" else 80)
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}:{port}"


class AttemptSummary(msgspec.Struct, frozen=True, kw_only=True):
    attempt: int
    started_at: datetime
    outcome: str
    status_code: int | None
    duration_ms: int | None
    error_class: str | None  # what the error says it is: "HTTP 503", "timed out", ...
    error: str | None


class AlertContext(msgspec.Struct, frozen=True, kw_only=True):
    """Everything an alert of a dead delivery says; its JSON is the operator webhook's ``data``
    and Sentry's ``dead_delivery`` context."""

    tenant_id: uuid.UUID
    event_id: uuid.UUID
    event_type: str
    event_created_at: datetime
    delivery_id: uuid.UUID
    channel_id: uuid.UUID
    channel_name: str | None
    channel_type: str
    destination: str
    outcome: str  # the last attempt's: "dead" or "panic"
    error: str | None
    attempt: int  # attempts made
    max_attempts: int
    dead_at: datetime
    attempts: tuple[AttemptSummary, ...]  # the latest, newest first
    payload_excerpt: str
    payload_truncated: bool

    def tags(self) -> dict[str, str]:
        """The tags a Sentry event of this alert carries (short, low-cardinality values first)."""
        return {
            "event_type": self.event_type,
            "channel_type": self.channel_type,
            "destination": self.destination,
            "delivery_id": str(self.delivery_id),
            "event_id": str(self.event_id),
            "channel_id": str(self.channel_id),
            "tenant_id": str(self.tenant_id),
            "attempt": str(self.attempt),
            "outcome": self.outcome,
        }

    def as_json(self) -> dict[str, Any]:
        """The context as JSON types (ids and times as strings, lists): what the webhook's
        ``data`` decodes to."""
        data: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(self))
        return data


_ERROR_CLASS = re.compile(r"HTTP \d{3}|timed out|rate limited|circuit open|adapter raised \w+")


def error_class(error: str | None, status_code: int | None) -> str | None:
    """A short kind for an attempt's error: ``HTTP 503``, ``timed out``, ``adapter raised
    KeyError``, ...; else the text before its first colon (at most 60 characters)."""
    if error is None:
        return f"HTTP {status_code}" if status_code is not None else None
    if found := _ERROR_CLASS.search(error):
        return found.group(0)
    if status_code is not None:
        return f"HTTP {status_code}"
    head = SECRETS.scrub(error.split(":", 1)[0]).strip()
    return head[:60] or None


def build_context(
    outcome: Outcome, history: DeadHistory, *, history_attempts: int, payload_excerpt_bytes: int
) -> AlertContext:
    """The alert of a dead delivery (``outcome`` must carry its message)."""
    message = outcome.message
    if message is None:
        raise ValueError("an alert needs the delivery's message")
    excerpt, cut = payload_excerpt(message.payload, payload_excerpt_bytes)
    attempts = tuple(
        AttemptSummary(
            attempt=a.attempt,
            started_at=a.started_at,
            outcome=a.outcome,
            status_code=a.status_code,
            duration_ms=a.duration_ms,
            error_class=error_class(a.error, a.status_code),
            error=short_error(a.error),
        )
        for a in history.attempts[:history_attempts]
    )
    return AlertContext(
        tenant_id=message.tenant_id, event_id=message.event_id, event_type=message.event_type,
        event_created_at=message.created_at, delivery_id=message.delivery_id,
        channel_id=message.channel_id, channel_name=history.channel_name,
        channel_type=message.channel_type,
        destination=destination_origin(
            message.channel_type, message.channel_config, message.channel_id
        ),
        outcome=outcome.outcome, error=short_error(outcome.error), attempt=message.attempt,
        max_attempts=message.max_attempts, dead_at=outcome.finished_at, attempts=attempts,
        payload_excerpt=excerpt, payload_truncated=cut,
    )  # fmt: skip


def newest_first(rows: Sequence[AttemptRow]) -> tuple[AttemptRow, ...]:
    """``rows`` newest first (by attempt number, then start)."""
    return tuple(sorted(rows, key=lambda r: (r.attempt, r.started_at), reverse=True))
