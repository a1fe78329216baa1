"""A Telegram channel's config: its struct and its validation at create and PATCH. None of it
needs the bot token, so every role that serves the API builds it; the deliverer is
``telegram.TelegramAdapter``."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from notifier.adapters.base import InvalidChannelConfig
from notifier.adapters.templates import compile_template
from notifier.config import TelegramWorkersConfig
from notifier.validation import describe

EXAMPLE = {"chat_id": 123456789}
TEXT_TEMPLATE_FIELD = "config.text_template"
CHAT_ID_FIELD = "config.chat_id"
MAX_CHAT_ID = 2**53  # Telegram ids fit in 52 bits; JSON-safe integers are below 2^53

_CHANNEL_USERNAME = re.compile(r"@[A-Za-z0-9_]{5,32}")


class TelegramConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    chat_id: int | str
    text_template: str | None = None


def prepare_chat_id(value: object) -> int | str:
    """An integer chat id, or ``@channelusername`` (5 to 32 letters, digits or underscores)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value == 0 or abs(value) >= MAX_CHAT_ID:
            raise InvalidChannelConfig(CHAT_ID_FIELD, "is not a valid Telegram chat id")
        return value
    if isinstance(value, str) and _CHANNEL_USERNAME.fullmatch(value):
        return value
    raise InvalidChannelConfig(
        CHAT_ID_FIELD,
        'must be an integer chat id or "@channelusername" '
        "(@ then 5 to 32 letters, digits or underscores)",
    )


class TelegramChannels:
    """The ``ChannelValidator`` of Telegram channels: it needs no bot token."""

    secret_fields: frozenset[str] = frozenset()  # the token is the bot's, not the channel's

    def __init__(self, settings: TelegramWorkersConfig | None = None) -> None:
        """``settings`` are not needed to check a channel's config (the spec builds every
        validator from its ``[workers.<type>]`` table)."""

    def prepare_config(self, config: dict[str, Any]) -> dict[str, Any]:
        try:
            cfg = msgspec.convert(config, TelegramConfig)
        except msgspec.ValidationError as exc:
            raise InvalidChannelConfig(*describe(exc, "config")) from exc
        out: dict[str, Any] = {"chat_id": prepare_chat_id(cfg.chat_id)}
        if cfg.text_template is not None:
            compile_template(cfg.text_template, TEXT_TEMPLATE_FIELD)
            out["text_template"] = cfg.text_template
        return out
