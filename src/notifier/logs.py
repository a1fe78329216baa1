"""Logging: one line per record on stderr, JSON or console, with secrets scrubbed.

``setup_logging(config.logging)`` installs one handler on the root logger, so every logger of
the process (notifier's and third-party ones: httpx, httpcore, aiormq, hypercorn) goes through
it. The handler carries a ``SecretFilter`` that rewrites each record before it is formatted:
its message (with the arguments merged in), its ``extra=`` fields, its traceback and its stack
lose every secret a pattern recognises (API keys, webhook secrets, bot tokens, ``Authorization``
values, passwords in URLs and in ``password=…`` pairs) and every exact string registered with
``register_secret`` (the SMTP password and the bot token, read from the environment). The
record is rewritten in place, so whatever sees it after the handler (Sentry's breadcrumbs)
sees it scrubbed too.

Before the config is loaded, ``setup_fallback_logging()`` installs the same handler in the
console format, so anything logged while the config is read is still readable.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import quote

import msgspec

from notifier.config import LoggingConfig
from notifier.errors import ConfigError

LEVEL_ENV = "NOTIFIER_LOG_LEVEL"
REDACTED = "[redacted]"
NOISY_LOGGERS = ("httpx", "httpcore", "aiormq", "hypercorn.access")

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}

# -- scrubbing ----------------------------------------------------------------------------------

_NOT_DONE = rf"(?!{re.escape(REDACTED)})"  # scrubbing twice changes nothing
_SECRET_KEY = r"[\w-]*(?:password|passwd|secret|token|api[_-]?key)"
_Sub = tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]


def _pair(m: re.Match[str]) -> str:
    quote_ = m["quote"] or ""
    return f"{m['key']}{m['sep']}{m['b'] or ''}{quote_}{REDACTED}{quote_}"


_PATTERNS: tuple[_Sub, ...] = (
    # An Authorization header's value, with or without its scheme.
    (
        re.compile(
            r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)"
            rf"((?>(?:(?:bearer|basic|digest|token)\s+)?)){_NOT_DONE}[^\s\"',;]+"
        ),
        rf"\1\2{REDACTED}",
    ),
    # Bearer credentials anywhere; Basic ones when they look like base64 (not "basic setup").
    (re.compile(rf"(?i)\b(bearer\s+){_NOT_DONE}[A-Za-z0-9._~+/=-]+"), rf"\1{REDACTED}"),
    (
        re.compile(r"(?i)\b(basic\s+)(?-i:(?![a-z]+\b))[A-Za-z0-9+/]{6,}={0,2}(?![\w+/=])"),
        rf"\1{REDACTED}",
    ),
    # A bot token in a Bot API URL path (/bot<id>:<secret>/sendMessage), whatever its shape.
    (re.compile(rf"(/bot\d+(?::|%3A)){_NOT_DONE}[^/\s?#\"']+"), rf"\1{REDACTED}"),
    # A bot token anywhere: <bot id>:<35-ish urlsafe characters>; the bot id is not a secret.
    # (A uuid after a number and a colon is not a token.)
    (
        re.compile(r"(?<!\d)(\d{3,}:)(?![0-9a-f]{8}-[0-9a-f]{4}-)[A-Za-z0-9_-]{30,}"),
        rf"\1{REDACTED}",
    ),
    # notifier API keys (nk_ + urlsafe token) and webhook secrets (whsec_ + base64).
    (re.compile(r"\bnk_[A-Za-z0-9_-]+"), f"nk_{REDACTED}"),
    (re.compile(r"\bwhsec_[A-Za-z0-9+/=_-]+"), f"whsec_{REDACTED}"),
    # A header value an HTTP library refuses and quotes (h11: ``Illegal header value b'…'``):
    # custom webhook headers carry credentials, and httpcore logs its errors at DEBUG. The
    # value ends h11's message but may be escaped any number of times: the line goes.
    (re.compile(rf"(?i)(illegal header value ){_NOT_DONE}[^\n]*"), rf"\1{REDACTED}"),
    # scheme://user:password@host → scheme://user:***@host
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*):[^/?#\s]*@"), r"\1:***@"),
    # password=…, "password": "…", token='…', api_key=… (the key is kept, the value goes).
    (
        re.compile(
            rf"(?i)(?P<key>\b{_SECRET_KEY})(?P<sep>\s*=\s*|[\"']\s*:\s*)"
            rf"(?:(?P<b>b?)(?P<quote>[\"'])(?:(?!(?P=quote))[^\\]|\\.)*(?P=quote)"
            rf"|{_NOT_DONE}[^\s,;&\"'()\[\]{{}}]+)"
        ),
        _pair,
    ),
)
_SECRET_KEY_NAME = re.compile(rf"(?i){_SECRET_KEY}")
# What every pattern above needs somewhere in the text (a superset: one search rules them all
# out for the usual line of ids and numbers, which then costs one scan instead of nine).
_MAY_HOLD_SECRET = re.compile(
    r"(?i)authorization|bearer|basic|/bot|\d{3}(?::|%3A)[\w-]{30}|nk_|whsec_|://|passw|secret"
    r"|token|api[_-]?key|header value"
)
# Text of only these characters (ids, numbers) cannot hold anything a pattern looks for.
_PLAINLY_SAFE = "0123456789abcdefABCDEF-. "


class SecretRegistry:
    """Exact secret strings known at run time, scrubbed wherever they appear (also
    percent-encoded, as they appear in URLs). A secret is never unregistered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forms: tuple[str, ...] = ()

    def register(self, secret: str) -> None:
        if not secret:
            return
        with self._lock:
            forms = {*self._forms, secret, quote(secret, safe="")}
            # Longest first, so a secret containing another one is replaced whole.
            self._forms = tuple(sorted(forms, key=len, reverse=True))

    def scrub(self, text: str) -> str:
        """``text`` without the registered secrets and without anything a pattern recognises."""
        for form in self._forms:  # a tuple, replaced whole: safe to read while one is added
            text = text.replace(form, REDACTED)
        if not text.strip(_PLAINLY_SAFE) or not _MAY_HOLD_SECRET.search(text):
            return text
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text


SECRETS = SecretRegistry()


def register_secret(secret: str) -> None:
    """Scrub ``secret`` from every log line of this process from now on."""
    SECRETS.register(secret)


class SecretFilter(logging.Filter):
    """Scrubs a record in place: message and arguments, ``extra=`` fields, traceback, stack.

    Installed on a handler, it applies to the records of every logger that handler serves.
    The message is merged with its arguments (``args`` becomes empty); the traceback is
    formatted into ``exc_text``, which formatters use instead of ``exc_info``. An ``extra=``
    value other than a str, int, float, bool or None becomes its scrubbed ``str()``, and one
    under a secret-looking name (``password``, ``token``, …) becomes ``[redacted]``.
    """

    def __init__(self, secrets: SecretRegistry | None = None) -> None:
        super().__init__()
        self._secrets = secrets if secrets is not None else SECRETS

    def filter(self, record: logging.LogRecord) -> bool:
        scrub = self._secrets.scrub
        try:
            record.msg = scrub(record.getMessage())
            record.args = ()
        except Exception:  # arguments that do not fit the message: keep both, scrubbed
            record.msg = scrub(str(record.msg))
            if isinstance(record.args, tuple):
                record.args = tuple(scrub(str(arg)) for arg in record.args)
            else:
                record.args = ()
        record.message = record.msg  # as a formatter that already ran would have left it
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        for key, value in extra_fields(record).items():
            if _SECRET_KEY_NAME.fullmatch(key) and value is not None:
                setattr(record, key, REDACTED)
            elif isinstance(value, str):
                setattr(record, key, scrub(value))
            elif not isinstance(value, int | float | bool | None):
                setattr(record, key, scrub(str(value)))
        return True


# -- formatting ---------------------------------------------------------------------------------


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a logging call passed with ``extra=``."""
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS}


def _timestamp(record: logging.LogRecord) -> str:
    when = datetime.fromtimestamp(record.created, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _traceback(record: logging.LogRecord) -> str | None:
    """The record's traceback (and stack), formatted; None when it has neither."""
    exc = record.exc_text
    if record.exc_info and not exc:
        exc = logging.Formatter().formatException(record.exc_info)
    parts = [p for p in (exc, record.stack_info) if p]
    return "\n".join(parts) if parts else None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO-8601, UTC), ``level``, ``logger``, ``message``, the
    ``extra=`` fields, and ``exc`` (the formatted traceback) when there is one. An extra field
    named like one of those is left out rather than hiding it."""

    _encoder = msgspec.json.Encoder(enc_hook=str)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            line.setdefault(key, value)
        if (exc := _traceback(record)) is not None:
            line["exc"] = exc
        return self._encoder.encode(line).decode()


_PLAIN_VALUE = re.compile(r"[^\s=\"']+")


def _console_value(value: object) -> str:
    text = str(value)
    return text if _PLAIN_VALUE.fullmatch(text) else msgspec.json.encode(text).decode()


class ConsoleFormatter(logging.Formatter):
    """``2024-05-01T12:00:00.123Z INFO notifier.worker: message key=value …``, then the
    traceback, if any, on the lines below."""

    def format(self, record: logging.LogRecord) -> str:
        fields = "".join(f" {k}={_console_value(v)}" for k, v in extra_fields(record).items())
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        exc = _traceback(record)
        return f"{line}{fields}" + (f"\n{exc}" if exc else "")


# -- set-up -------------------------------------------------------------------------------------


class LogHandler(logging.StreamHandler[TextIO]):
    """The handler ``setup_logging`` installs (and replaces when it is called again)."""


def make_handler(
    log_format: str, stream: TextIO | None = None, *, secrets: SecretRegistry | None = None
) -> LogHandler:
    """A handler writing ``log_format`` (``json`` or ``console``) lines to ``stream`` (default:
    stderr), with the secret filter on it."""
    handler = LogHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else ConsoleFormatter())
    handler.addFilter(SecretFilter(secrets))
    return handler


def resolve_level(config: LoggingConfig, environ: Mapping[str, str] | None = None) -> str:
    """``logging.level``, or ``$NOTIFIER_LOG_LEVEL`` when it is set (in any case)."""
    override = (os.environ if environ is None else environ).get(LEVEL_ENV, "").strip()
    if not override:
        return config.level
    level = override.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"{LEVEL_ENV}: expected DEBUG, INFO, WARNING or ERROR, got {override!r}")
    return level


def _install(handler: LogHandler, level: str, noisy: Iterable[str] = NOISY_LOGGERS) -> None:
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, LogHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    for name in noisy:
        logging.getLogger(name).setLevel(logging.WARNING)


def setup_logging(
    config: LoggingConfig, *, stream: TextIO | None = None, environ: Mapping[str, str] | None = None
) -> None:
    """Log every logger's records to ``stream`` (default: stderr) in ``config.format`` at
    ``config.level`` (or ``$NOTIFIER_LOG_LEVEL``), secrets scrubbed; replaces the handler an
    earlier call installed. The noisy libraries (httpx, httpcore, aiormq, hypercorn's access
    log) stay at WARNING."""
    _install(make_handler(config.format, stream), resolve_level(config, environ))


def setup_fallback_logging(*, stream: TextIO | None = None) -> None:
    """Console logging, secrets scrubbed, for the time before the config is loaded (at
    ``$NOTIFIER_LOG_LEVEL``, or INFO when it is unset or not a level)."""
    try:
        level = resolve_level(LoggingConfig(format="console"))
    except ConfigError:  # setup_logging reports it, once the config is loaded
        level = "INFO"
    _install(make_handler("console", stream), level)
