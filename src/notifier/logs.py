"""Logging: one line per record on stderr, JSON or console, with secrets scrubbed.

``setup_logging(config.logging)`` installs one handler on the root logger, so every logger of
the process (notifier's and third-party ones: httpx, httpcore, aiormq, hypercorn) goes through
it. The handler carries a ``SecretFilter`` that rewrites each record before it is formatted:
its message (with the arguments merged in), its ``extra=`` fields, its traceback and its stack
lose every secret a pattern recognises (API keys, webhook secrets, bot tokens, ``Authorization``
values, passwords in URLs and in ``password=…`` pairs) and every exact string registered with
``notifier.secrets.register_secret`` (the SMTP password and the bot token). The
record is rewritten in place, so whatever sees it after the handler (Sentry's breadcrumbs)
sees it scrubbed too.

Before the config is loaded, ``setup_fallback_logging()`` installs the same handler in the
console format, so anything logged while the config is read is still readable.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

import msgspec

from notifier.config import LoggingConfig
from notifier.errors import ConfigError
from notifier.secrets import (
    REDACTED,
    SECRET_KEY_NAME,
    SECRETS,
    SecretRegistry,
)
from notifier.tracing import current_span

LEVEL_ENV = "NOTIFIER_LOG_LEVEL"
NOISY_LOGGERS = ("httpx", "httpcore", "aiormq", "hypercorn.access")

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}

# -- scrubbing ----------------------------------------------------------------------------------


# The extra fields notifier fills only from ids, numbers and its own names (the worker's line
# per attempt has all seven): no secret can be in them, so the filter passes them as they are.
PLAIN_FIELDS = frozenset(
    {"delivery_id", "event_id", "channel_id", "tenant_id", "channel_type", "attempt", "outcome",
     "trace_id", "span_id"}
)  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _secret_key_name(key: str) -> bool:
    # A log line's extra fields are the same few names again and again (the worker's line has
    # seven): one regex match per name, not per line.
    return SECRET_KEY_NAME.fullmatch(key) is not None


class SecretFilter(logging.Filter):
    """Scrubs a record in place: message and arguments, ``extra=`` fields, traceback, stack.

    Installed on a handler, it applies to the records of every logger that handler serves.
    The message is merged with its arguments (``args`` becomes empty); the traceback is
    formatted into ``exc_text``, which formatters use instead of ``exc_info``. An ``extra=``
    value other than a str, int, float, bool or None becomes its scrubbed ``str()``, and one
    under a secret-looking name (``password``, ``token``, …) becomes ``[redacted]``. The id
    fields notifier fills itself (``PLAIN_FIELDS``) pass as they are.
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
            if key in PLAIN_FIELDS and type(value) in (str, int):
                continue
            if _secret_key_name(key) and value is not None:
                setattr(record, key, REDACTED)
            elif isinstance(value, str):
                setattr(record, key, scrub(value))
            elif not isinstance(value, int | float | bool | None):
                setattr(record, key, scrub(str(value)))
        return True


class TraceFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` to a record logged inside a span (or a trace context
    carried along with tracing off: then ``trace_id`` alone), unless the call gave them."""

    def filter(self, record: logging.LogRecord) -> bool:
        span = current_span()
        if span is not None and span.trace_id is not None and not hasattr(record, "trace_id"):
            record.trace_id = span.trace_id
            if span.span_id is not None:
                record.span_id = span.span_id
        return True


class KnownSecretsFilter(logging.Filter):
    """Replaces the registered secrets (``notifier.secrets``) with ``marker`` in the records of
    the loggers it is installed on, before any handler sees them (whatever level the loggers
    are configured at, whichever handlers they have)."""

    def __init__(self, marker: str = REDACTED, secrets: SecretRegistry | None = None) -> None:
        super().__init__()
        self._marker = marker
        self._secrets = secrets if secrets is not None else SECRETS

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a broken record: leave it to the handler to complain
            return True
        clean = self._secrets.known(text, marker=self._marker)
        if clean != text:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            traceback = logging.Formatter().formatException(record.exc_info)
            record.exc_text = self._secrets.known(traceback, marker=self._marker)
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
    handler.addFilter(TraceFilter())
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
    # What neither formatter writes is not collected for every record: the thread and the
    # process (switches the logging HOWTO's "Optimization" section names). The caller's file
    # and line stay: without them logging also drops ``stack_info``, which the formatters write.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
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
