"""Telegram adapter: one Bot API ``sendMessage`` per delivery, rate limited per chat, per tenant
and per bot (buckets shared by every worker process, ``rate_buckets``).

A channel's config is validated by ``telegram_channels.TelegramChannels`` (no token needed).
Pure parts (``build_text``, ``build_request``, ``classify``, ``transport_error``) are separate
from the thin httpx I/O in ``deliver`` so they are tested as tables without sockets.

The bot token is part of every request URL (``{api_base_url}/bot<token>/sendMessage``), so it
is kept out of everything notifier writes down:

- error strings are built without the URL, and whatever text comes from elsewhere (an httpx
  exception, a response body) loses the token first (``notifier.secrets``);
- an httpx exception is never chained to the error raised in its place (its message and its
  request hold the URL);
- the token is registered with ``notifier.adapters.http.protect_in_http_logs``: a logging
  filter on the ``httpx`` and ``httpcore`` loggers (httpx logs every request URL at INFO)
  replaces it in their records, whatever level they are configured at, and the log handler
  scrubs it from every record of every logger.

Long texts are truncated, not refused: Telegram takes at most 4096 characters (counted in
UTF-16 code units, as it counts them), and a notification cut short with a trailing "…" is more
useful than a delivery that is ``DEAD`` because an event's payload was large.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec

from notifier.adapters.base import InvalidChannelConfig, Receipt
from notifier.adapters.http import (
    BoundedTransport,
    ClientPool,
    delivery_error,
    new_client,
    protect_in_http_logs,
)
from notifier.adapters.telegram_channels import TEXT_TEMPLATE_FIELD, prepare_chat_id
from notifier.adapters.templates import render
from notifier.config import TelegramWorkersConfig
from notifier.errors import AdapterCrash, ConfigError, PermanentError, RetriableError
from notifier.messages import WorkerMessage
from notifier.ratelimit import Bucket
from notifier.secrets import replace_forms, scrub_known, secret_forms

MAX_TEXT_UNITS = 4096  # Telegram's limit for a message text, in UTF-16 code units
TRUNCATION_MARK = "…"
DEFAULT_TEXT_TEMPLATE = "{{ event_type }}\n\n{{ payload_json }}"
EXCERPT_BYTES = 2048
READ_LIMIT_BYTES = 64 * 1024
REDACTED = "***"

_BOT_TOKEN = re.compile(r"[0-9]+:[A-Za-z0-9_-]+")


def scrub(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` (raw or percent-encoded, as it may appear in a URL) replaced."""
    return replace_forms(text, secret_forms(secret or ""), REDACTED)


# -- channel config -----------------------------------------------------------------------------


def chat_key(config: Mapping[str, Any]) -> int | str | None:
    """The rate-limit key of a channel's chat (usernames are case-insensitive), or None."""
    try:
        chat_id = prepare_chat_id(config.get("chat_id"))
    except InvalidChannelConfig:
        return None
    return chat_id.lower() if isinstance(chat_id, str) else chat_id


# -- request ------------------------------------------------------------------------------------


def utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def fit_text(text: str, limit: int = MAX_TEXT_UNITS) -> str:
    """``text`` if Telegram takes it whole, else its start and "…" within ``limit`` units."""
    if len(text) <= limit // 2 or utf16_units(text) <= limit:
        return text
    budget = limit - utf16_units(TRUNCATION_MARK)
    used = 0
    for index, char in enumerate(text):
        used += 2 if ord(char) > 0xFFFF else 1
        if used > budget:
            return text[:index] + TRUNCATION_MARK
    return text


def build_text(message: WorkerMessage) -> str:
    """The message text: the channel's template (or the default) rendered, fitted to the limit.
    A template that fails, or renders nothing but whitespace, is a ``PermanentError``."""
    source = message.channel_config.get("text_template") or DEFAULT_TEXT_TEMPLATE
    if not isinstance(source, str):
        raise PermanentError(f"{TEXT_TEMPLATE_FIELD}: must be a string")
    text = render(source, message, TEXT_TEMPLATE_FIELD)
    if not text.strip():
        raise PermanentError(f"{TEXT_TEMPLATE_FIELD}: the rendered text is empty")
    return fit_text(text)


def build_request(
    api_base_url: str, token: str, chat_id: int | str, text: str
) -> tuple[str, bytes]:
    """The URL and JSON body of one ``sendMessage`` call (plain text: no ``parse_mode``)."""
    url = f"{api_base_url.rstrip('/')}/bot{token}/sendMessage"
    return url, msgspec.json.encode({"chat_id": chat_id, "text": text})


# -- response -----------------------------------------------------------------------------------


class BotApiAnswer(msgspec.Struct):
    """The parts of a Bot API answer that matter here; anything else is ignored."""

    ok: bool = False
    description: str | None = None
    parameters: dict[str, Any] | None = None


def _parse_answer(body: bytes) -> BotApiAnswer | None:
    try:
        return msgspec.json.decode(body, type=BotApiAnswer)
    except msgspec.DecodeError:  # not JSON (a proxy's error page) or cut at the read limit
        return None


def _retry_after(answer: BotApiAnswer | None, header: str | None) -> float | None:
    value = (answer.parameters or {}).get("retry_after") if answer else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if header and header.strip().isdigit():
        return float(header.strip())
    return None


def classify(
    status_code: int,
    body: bytes,
    *,
    retry_after_header: str | None = None,
    secret: str | None = None,
) -> Receipt:
    """A Bot API answer → a receipt, or the error it means.

    200 with ``ok: true`` → receipt; 429 → ``RetriableError`` with ``parameters.retry_after``;
    403 (the bot was blocked or kicked) → ``PermanentError`` that disables the channel; 400
    (chat not found, ...) and any other 4xx → ``PermanentError``; 5xx (and a 200 that is not
    a Bot API success) → ``RetriableError``; anything else (3xx is never followed) → permanent.
    """
    # Postgres text cannot hold NUL: an answer carrying one must not make the attempt unstorable.
    excerpt = scrub(body[:EXCERPT_BYTES].decode("utf-8", "ignore"), secret).replace("\0", "")
    answer = _parse_answer(body)
    if 200 <= status_code < 300 and answer is not None and answer.ok:
        return Receipt(status_code=status_code, response_excerpt=excerpt or None)
    described = answer.description if answer and answer.description else excerpt
    described = scrub(described, secret).replace("\0", "")[:200]
    detail = f"HTTP {status_code}" + (f": {described}" if described else "")
    if status_code == 429:
        raise RetriableError(
            detail,
            retry_after=_retry_after(answer, retry_after_header),
            status_code=status_code,
        )
    if status_code >= 500 or 200 <= status_code < 300:
        if status_code < 300:
            detail += " (not a Bot API success)"
        raise RetriableError(detail, status_code=status_code)
    if status_code == 403:
        raise PermanentError(detail, status_code=status_code, disable_channel=True)
    migrated = (answer.parameters or {}).get("migrate_to_chat_id") if answer else None
    if isinstance(migrated, int) and not isinstance(migrated, bool):
        detail += f" (the group is now the supergroup {migrated}: set config.chat_id to it)"
    raise PermanentError(detail, status_code=status_code)


def transport_error(exc: Exception, secret: str | None) -> Exception:
    """What to raise in place of an exception from the I/O layer, with ``secret`` and every
    registered secret scrubbed from its text (httpx exceptions may name the request URL).
    Timeouts and connection errors are retriable; an unusable URL is permanent; anything else
    is an adapter crash (a bug)."""
    forms = secret_forms(secret or "")
    return delivery_error(
        exc, lambda text: scrub_known(text, forms, marker=REDACTED), TelegramAdapterCrash,
        url="Bot API URL",
    )  # fmt: skip


class TelegramAdapterCrash(AdapterCrash):
    """An unexpected exception from the I/O layer, its text scrubbed (the worker's panic path
    logs and stores it)."""


# -- the adapter --------------------------------------------------------------------------------


class TelegramAdapter:
    """The Telegram deliverer: holds the bot token."""

    channel_type = "telegram"

    def __init__(
        self,
        token: str,
        *,
        api_base_url: str = "https://api.telegram.org",
        timeout_seconds: float = 10.0,
        per_chat_per_second: float = 1.0,
        per_bot_per_second: float = 30.0,
        per_tenant_per_second: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``per_tenant_per_second``: one tenant's share of the bot, at most
        ``per_bot_per_second``; ``None``, a quarter of it."""
        if not token:
            raise ValueError("the bot token is empty")
        if per_tenant_per_second is None:
            per_tenant_per_second = per_bot_per_second / 4
        if per_tenant_per_second > per_bot_per_second:
            raise ValueError("per_tenant_per_second must be at most per_bot_per_second")
        protect_in_http_logs(token)  # scrubbed from every log line from now on
        self._token = token
        self._api_base_url = api_base_url.rstrip("/")
        self._timeout = timeout_seconds
        self._transport = transport  # tests pass httpx.MockTransport
        # Keyed by the bot's id (the token's public part): every process delivering for this
        # bot shares them, and another bot has its own.
        self._bot_key = f"telegram:{token.split(':', 1)[0]}"
        self._per_chat_per_second = per_chat_per_second
        # A tenant's share equal to the bot's whole rate limits nothing the bot's bucket does not.
        self._per_tenant_per_second = (
            per_tenant_per_second if per_tenant_per_second < per_bot_per_second else None
        )
        self.bot_bucket = Bucket.per_second(self._bot_key, per_bot_per_second)
        self._clients = ClientPool(self._new_client)

    @classmethod
    def from_config(
        cls, config: TelegramWorkersConfig, environ: Mapping[str, str]
    ) -> TelegramAdapter:
        """The adapter of ``[workers.telegram]``, its token read from ``bot_token_env``."""
        var = config.bot_token_env
        token = environ.get(var, "").strip()
        if not token:
            raise ConfigError(
                f"workers.telegram.bot_token_env: the environment variable {var} "
                "(the bot token) is not set or empty"
            )
        if not _BOT_TOKEN.fullmatch(token):
            raise ConfigError(
                f"workers.telegram.bot_token_env: the environment variable {var} does not hold "
                "a bot token (digits, a colon, then letters, digits, _ or -)"
            )
        parts = urlsplit(config.api_base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("workers.telegram.api_base_url: must be an http(s) URL with a host")
        return cls(
            token,
            api_base_url=config.api_base_url,
            timeout_seconds=config.timeout_seconds,
            per_chat_per_second=config.per_chat_per_second,
            per_bot_per_second=config.per_bot_per_second,
            per_tenant_per_second=config.tenant_rate_per_second,
        )

    def __repr__(self) -> str:  # never the token
        return f"TelegramAdapter(api_base_url={self._api_base_url!r})"

    def rate_buckets(self, message: WorkerMessage) -> Sequence[Bucket]:
        """``RateLimiter``: the chat's bucket, the tenant's share of the bot and the bot's,
        taken together. The chat's is the tenant's own (``...:tenant:<id>:chat:<chat>``): one
        tenant's messages never spend a token of another's, even to the same chat id. The
        tenant's share is a fixed rate, not the bot's rate divided among the tenants sending
        now (docs/architecture.md §9 says why); it is left out when it is the bot's whole rate.
        """
        key = chat_key(message.channel_config)
        if key is None:
            return ()  # an unusable chat id: ``deliver`` fails it for good
        tenant_key = f"{self._bot_key}:tenant:{message.tenant_id}"
        chat = Bucket.per_second(f"{tenant_key}:chat:{key}", self._per_chat_per_second)
        if self._per_tenant_per_second is None:
            return (chat, self.bot_bucket)
        tenant = Bucket.per_second(tenant_key, self._per_tenant_per_second)
        return (chat, tenant, self.bot_bucket)

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        try:
            chat_id = prepare_chat_id(message.channel_config.get("chat_id"))
        except InvalidChannelConfig as exc:
            raise PermanentError(str(exc)) from None
        url, body = build_request(self._api_base_url, self._token, chat_id, build_text(message))
        headers = {"content-type": "application/json", "user-agent": "notifier"}
        failure: Exception | None = None
        status_code = 0
        retry_after: str | None = None
        data = b""
        try:
            with self._clients.borrow() as client:
                async with client.stream("POST", url, content=body, headers=headers) as resp:
                    status_code, retry_after = resp.status_code, resp.headers.get("retry-after")
                    async for chunk in resp.aiter_bytes():  # the transport stops at the limit
                        data += chunk
        except Exception as exc:
            # Raised below, outside this block, so nothing chains back to ``exc`` (whose text
            # and request hold the URL with the token).
            failure = transport_error(exc, self._token)
        if failure is not None:
            raise failure
        return classify(
            status_code, data[:READ_LIMIT_BYTES], retry_after_header=retry_after,
            secret=self._token,
        )  # fmt: skip

    def _new_client(self) -> httpx.AsyncClient:
        """A client whose answers end at ``READ_LIMIT_BYTES`` (the rest is never read)."""
        transport = self._transport
        if transport is None:
            transport = BoundedTransport(max_body_bytes=READ_LIMIT_BYTES)
        return new_client(self._timeout, transport)

    async def aclose(self) -> None:
        await self._clients.aclose()
