"""Log lines: JSON and console formats, the per-delivery outcome line, and the secret filter.

Records go through the real handler (``make_handler``) into an ``io.StringIO``; loggers are
standalone ``logging.Logger`` instances unless the test is about a named one.
"""

from __future__ import annotations

import io
import json
import logging
import re
import secrets
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from notifier.adapters.email import EmailAdapter
from notifier.adapters.telegram import TelegramAdapter
from notifier.adapters.webhook import generate_secret
from notifier.broker.base import Incoming, Settle
from notifier.config import EmailWorkersConfig, LoggingConfig, SentryConfig
from notifier.errors import ConfigError, PermanentError
from notifier.logs import NOISY_LOGGERS, PLAIN_FIELDS, LogHandler, make_handler, setup_logging
from notifier.messages import encode_message
from notifier.observability import setup_sentry
from notifier.secrets import SecretRegistry, register_secret
from notifier.testing import (
    MemoryBroker,
    MemoryDeliveries,
    RecordingAdapter,
    RecordingReporter,
    SettleRecorder,
    worker_message,
)
from notifier.worker.decide import RetryPolicy
from notifier.worker.group import outcome_observers
from notifier.worker.handle import Handler


def capture(
    log_format: str = "json", registry: SecretRegistry | None = None
) -> tuple[logging.Logger, io.StringIO]:
    """A logger of its own (not in the logging tree) writing through the real handler."""
    out = io.StringIO()
    logger = logging.Logger("notifier.test", logging.DEBUG)
    logger.addHandler(make_handler(log_format, out, secrets=registry or SecretRegistry()))
    return logger, out


def json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


# -- JSON ---------------------------------------------------------------------------------------


def test_a_json_line_has_the_time_level_logger_and_message() -> None:
    logger, out = capture()
    before = datetime.now(UTC)
    logger.info("delivered %d of %s", 3, "four")

    (line,) = json_lines(out)
    assert set(line) == {"ts", "level", "logger", "message"}
    assert line["level"] == "INFO"
    assert line["logger"] == "notifier.test"
    assert line["message"] == "delivered 3 of four"
    ts = datetime.fromisoformat(line["ts"])
    assert line["ts"].endswith("Z")
    assert ts.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= ts <= datetime.now(UTC)


def test_extras_are_fields_of_the_line_with_their_types() -> None:
    logger, out = capture()
    delivery_id = uuid.uuid4()
    logger.warning(
        "slow", extra={"delivery_id": str(delivery_id), "attempt": 2, "ratio": 0.5,
                       "event_id": delivery_id, "level": "not the level"},
    )  # fmt: skip

    (line,) = json_lines(out)
    assert line["delivery_id"] == str(delivery_id)
    assert line["attempt"] == 2
    assert line["ratio"] == 0.5
    assert line["event_id"] == str(delivery_id)  # a non-JSON value: its str()
    assert line["level"] == "WARNING"  # an extra cannot hide a field of the line


def test_an_exception_is_the_exc_field_and_a_multiline_message_stays_one_line() -> None:
    logger, out = capture()
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("it failed\non two lines")

    assert len(out.getvalue().splitlines()) == 1
    (line,) = json_lines(out)
    assert line["level"] == "ERROR"
    assert line["message"] == "it failed\non two lines"
    assert line["exc"].startswith("Traceback (most recent call last):")
    assert line["exc"].endswith("ValueError: boom")


def test_a_stack_is_part_of_the_exc_field() -> None:
    logger, out = capture()
    logger.info("where am I", stack_info=True)

    (line,) = json_lines(out)
    assert line["exc"].startswith("Stack (most recent call last):")
    assert "test_a_stack_is_part_of_the_exc_field" in line["exc"]


# -- console ------------------------------------------------------------------------------------

CONSOLE_TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def test_the_console_line_is_time_level_logger_message_then_the_extras() -> None:
    logger, out = capture("console")
    logger.info("delivered", extra={"delivery_id": "d-1", "attempt": 2, "note": "two words"})

    assert re.fullmatch(
        rf'{CONSOLE_TS} INFO notifier.test: delivered delivery_id=d-1 attempt=2 note="two words"\n',
        out.getvalue(),
    ), out.getvalue()


def test_the_console_traceback_follows_the_line() -> None:
    logger, out = capture("console")
    try:
        raise KeyError("k")
    except KeyError:
        logger.exception("failed")

    first, *rest = out.getvalue().splitlines()
    assert re.fullmatch(rf"{CONSOLE_TS} ERROR notifier.test: failed", first)
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "KeyError: 'k'"


# -- the per-delivery line ----------------------------------------------------------------------


@pytest.fixture
def worker_log() -> Iterator[io.StringIO]:
    """The JSON lines of the ``notifier.worker`` logger at INFO, for one test."""
    out = io.StringIO()
    logger = logging.getLogger("notifier.worker")
    handler, level = make_handler("json", out), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield out
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_each_delivery_outcome_is_one_line_with_its_ids(worker_log: io.StringIO) -> None:
    message = worker_message(5, attempt=2)
    store = MemoryDeliveries()
    store.add(message.delivery_id, attempt=1)
    adapter = RecordingAdapter("webhook", PermanentError("HTTP 404: gone", status_code=404))
    handler = Handler(
        store, adapter, MemoryBroker().publish, timeout_seconds=5, policy=RetryPolicy(),
        observer=outcome_observers("webhook", reporter=RecordingReporter(), metrics=None),
    )  # fmt: skip
    sink = SettleRecorder()
    incoming = Incoming(encode_message(message), str(message.delivery_id), 1, False, sink)
    await handler.handle(incoming)

    assert sink.settled == [Settle.REJECT]
    (line,) = [line for line in json_lines(worker_log) if "outcome" in line]
    assert line["level"] == "INFO"
    assert line["logger"] == "notifier.worker"
    assert line["message"] == f"delivery {message.delivery_id} attempt 2: dead (HTTP 404: gone)"
    assert {k: line[k] for k in ("delivery_id", "event_id", "channel_id", "tenant_id")} == {
        "delivery_id": str(message.delivery_id),
        "event_id": str(message.event_id),
        "channel_id": str(message.channel_id),
        "tenant_id": str(message.tenant_id),
    }
    assert (line["channel_type"], line["attempt"], line["outcome"]) == ("webhook", 2, "dead")


# -- secrets ------------------------------------------------------------------------------------

API_KEY = "nk_" + secrets.token_urlsafe(32)
WEBHOOK_SECRET = generate_secret()
BOT_TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw2"

# (what is logged, the secret in it, what the scrubbed text says instead)
SECRET_CASES = [
    pytest.param(f"key {API_KEY} refused", API_KEY, "key nk_[redacted] refused", id="api key"),
    pytest.param(
        f"signing with {WEBHOOK_SECRET}.", WEBHOOK_SECRET, "signing with whsec_[redacted].",
        id="webhook secret",
    ),
    pytest.param(f"token {BOT_TOKEN}", BOT_TOKEN, "token 123456789:[redacted]", id="bot token"),
    pytest.param(
        "POST https://api.telegram.org/bot42:odd-Token/sendMessage 200",
        "odd-Token",
        "POST https://api.telegram.org/bot42:[redacted]/sendMessage 200",
        id="bot token in a Bot API URL",
    ),
    pytest.param(
        "{'Authorization': 'Bearer hdr.4c1d-8e0b'}", "hdr.4c1d-8e0b",
        "{'Authorization': 'Bearer [redacted]'}", id="Authorization Bearer",
    ),
    pytest.param(
        "Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA==",
        "Authorization: Basic [redacted]", id="Authorization Basic",
    ),
    pytest.param(
        "authorization=raw-key-77", "raw-key-77", "authorization=[redacted]",
        id="Authorization without a scheme",
    ),
    pytest.param(
        "(b'authorization', b'bearer tok_123')", "tok_123",
        "(b'authorization', b'bearer [redacted]')", id="Bearer anywhere",
    ),
    pytest.param(
        "connecting to amqp://notifier:s3cr3t-pw@rabbit:5672/vhost", "s3cr3t-pw",
        "connecting to amqp://notifier:***@rabbit:5672/vhost", id="password in a URL",
    ),
    pytest.param(
        "login user=a password=hunter2-x&next=1", "hunter2-x",
        "login user=a password=[redacted]&next=1", id="password=…",
    ),
    pytest.param(
        'sent {"smtp_password": "hunter 2", "to": "a@b.c"}', "hunter 2",
        'sent {"smtp_password": "[redacted]", "to": "a@b.c"}', id='"password": "…"',
    ),
    pytest.param(
        "LocalProtocolError(\"Illegal header value b'sk-9f2e 7a1c '\")", "sk-9f2e 7a1c",
        "LocalProtocolError(\"Illegal header value [redacted]", id="h11's illegal value",
    ),
    pytest.param(
        """Illegal header value b"it's-x9\\"q" (b'x-a')""", "it's-x9",
        "Illegal header value [redacted]", id="h11's illegal value, quoted",
    ),
]  # fmt: skip


def log_in_message(logger: logging.Logger, text: str) -> None:
    logger.info(text)


def log_in_args(logger: logging.Logger, text: str) -> None:
    logger.info("got %s from %r", text, (text,))


def log_in_extra(logger: logging.Logger, text: str) -> None:
    logger.info("with an extra", extra={"detail": text, "detail_obj": ValueError(text)})


def log_in_traceback(logger: logging.Logger, text: str) -> None:
    try:
        try:
            raise KeyError(text)
        except KeyError as exc:
            raise RuntimeError(text) from exc
    except RuntimeError:
        logger.exception("failed")


@pytest.mark.parametrize(
    "log", [log_in_message, log_in_args, log_in_extra, log_in_traceback],
    ids=["message", "args", "extra", "traceback"],
)  # fmt: skip
@pytest.mark.parametrize("log_format", ["json", "console"])
@pytest.mark.parametrize(("text", "secret", "scrubbed"), SECRET_CASES)
def test_secrets_never_reach_the_output(
    text: str, secret: str, scrubbed: str, log_format: str,
    log: Callable[[logging.Logger, str], None],
) -> None:  # fmt: skip
    logger, out = capture(log_format)
    log(logger, text)

    written = out.getvalue()
    assert secret not in written
    if log_format == "json":
        (line,) = json_lines(out)
        written = " ".join(str(v) for v in line.values())  # JSON escapes undone
        assert secret not in written
    # (the console format quotes an extra holding spaces or quotes the way JSON does)
    assert scrubbed in written or json.dumps(scrubbed)[1:-1] in written


@pytest.mark.parametrize(("text", "secret", "scrubbed"), SECRET_CASES)
def test_scrubbing_twice_changes_nothing(text: str, secret: str, scrubbed: str) -> None:
    registry = SecretRegistry()
    assert registry.scrub(text) == registry.scrub(registry.scrub(text))


def test_an_extra_under_a_secret_name_is_redacted_whatever_it_holds() -> None:
    logger, out = capture()
    logger.info("config", extra={"smtp_password": "plain", "api_key": 12345, "token": None})

    (line,) = json_lines(out)
    assert (line["smtp_password"], line["api_key"], line["token"]) == ("[redacted]",) * 2 + (None,)


@pytest.mark.parametrize("field", sorted(PLAIN_FIELDS))
def test_the_id_fields_pass_as_they_are_and_every_other_extra_is_scrubbed(field: str) -> None:
    # The worker's line per attempt carries seven fields notifier fills from ids, numbers and
    # its own names (PLAIN_FIELDS); the filter spends nothing on a str or an int there. Any
    # other field, or any other value under those names, is scrubbed as before.
    registry = SecretRegistry()
    same = "0b1e3c3a-5d0e-4c1b-9f59-0e6f2ab1c0de"
    registry.register(same)
    logger, out = capture("json", registry)
    logger.info("x", extra={field: same, "detail": same})
    logger.info("x", extra={field: 3})
    logger.info("x", extra={field: [same]})

    plain, number, other = json_lines(out)
    assert (plain[field], plain["detail"]) == (same, "[redacted]")
    assert number[field] == 3
    assert other[field] == "['[redacted]']"


def test_a_registered_secret_is_scrubbed_even_when_no_pattern_knows_it() -> None:
    registry = SecretRegistry()
    registry.register("p@ss/wörd-42")
    logger, out = capture("json", registry)
    logger.info("login with p@ss/wörd-42 (in a URL: x=p%40ss%2Fw%C3%B6rd-42)")
    logger.info("again", extra={"detail": "p@ss/wörd-42"})

    first, second = json_lines(out)
    assert first["message"] == "login with [redacted] (in a URL: x=[redacted])"
    assert second["detail"] == "[redacted]"


def test_the_adapters_register_the_secrets_they_read_from_the_environment() -> None:
    password, token = f"pw-{uuid.uuid4().hex}", f"77:{uuid.uuid4().hex[:6]}"
    EmailAdapter.from_config(
        EmailWorkersConfig(smtp_username="mailer"), {"NOTIFIER_SMTP_PASSWORD": password}
    )
    TelegramAdapter(token)
    out = io.StringIO()
    logger = logging.Logger("notifier.test", logging.DEBUG)
    logger.addHandler(make_handler("json", out))  # the process-wide registry
    logger.info("password %s, token %s", password, token)

    (line,) = json_lines(out)
    assert line["message"] == "password [redacted], token [redacted]"


def test_register_secret_applies_to_every_handler_made_by_default() -> None:
    secret = f"s-{uuid.uuid4().hex}"
    logger, out = capture("console")
    register_secret(secret)
    other = io.StringIO()
    logger.addHandler(make_handler("console", other))
    logger.info(secret)

    assert secret in out.getvalue()  # a handler with its own (empty) registry
    assert secret not in other.getvalue()


def test_arguments_that_do_not_fit_the_message_leak_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logger, out = capture()
    logger.info("%d items", API_KEY)  # a broken call: the handler reports it on stderr

    assert API_KEY not in out.getvalue()
    assert API_KEY not in capsys.readouterr().err


def test_ids_and_ordinary_text_are_left_alone() -> None:
    delivery_id, event_id = uuid.uuid4(), uuid.uuid4()
    text = (
        f"delivery {delivery_id} attempt 3: delivered (HTTP 200) event {event_id}"
        f" 12345:{uuid.uuid4()} at 2024-01-01T00:00:00.000Z to https://example.com/hook?x=1#top"
        " from postgresql://postgres@127.0.0.1:5432/notifier, http://[::1]:8080/a@b,"
        " basic setup, secret_rotation_grace_seconds=86400 bot_token_env=NOTIFIER_TOKEN"
        " tokens: 5, nk_ keys and whsec_ secrets, chunk_size=10, see Basic settings"
    )
    logger, out = capture()
    logger.info(text, extra={"delivery_id": str(delivery_id)})

    (line,) = json_lines(out)
    assert line["message"] == text
    assert line["delivery_id"] == str(delivery_id)


class KeepingTransport(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.envelopes: list[Envelope] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)


def test_the_log_lines_sentry_keeps_as_breadcrumbs_are_scrubbed_too() -> None:
    kept = KeepingTransport()
    assert setup_sentry(SentryConfig(dsn="https://key@sentry.invalid/1"), transport=kept)
    try:
        logger, _ = capture()
        logger.info("refused %s", API_KEY, extra={"detail": f"Bearer {API_KEY}"})
        sentry_sdk.capture_message("after the log line")
        sentry_sdk.flush()
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)

    (envelope,) = kept.envelopes
    raw = envelope.serialize().decode()
    assert "refused nk_[redacted]" in raw
    assert API_KEY not in raw


# -- set-up -------------------------------------------------------------------------------------


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    """The root logger, put back as it was afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    noisy = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    yield root
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    for name, noisy_level in noisy.items():
        logging.getLogger(name).setLevel(noisy_level)


def test_setup_logging_installs_one_handler_and_replaces_it(root_logging: logging.Logger) -> None:
    first, second = io.StringIO(), io.StringIO()
    setup_logging(LoggingConfig(format="console", level="WARNING"), stream=first, environ={})
    assert root_logging.level == logging.WARNING
    setup_logging(LoggingConfig(level="DEBUG"), stream=second, environ={})
    logging.getLogger("notifier.test.setup").debug("hello %s", API_KEY)

    assert len([h for h in root_logging.handlers if isinstance(h, LogHandler)]) == 1
    assert first.getvalue() == ""
    (line,) = json_lines(second)
    assert line["message"] == "hello nk_[redacted]"
    assert all(logging.getLogger(name).level == logging.WARNING for name in NOISY_LOGGERS)


def test_the_level_comes_from_the_environment_when_it_is_set(
    root_logging: logging.Logger,
) -> None:
    config = LoggingConfig(level="ERROR")
    setup_logging(config, stream=io.StringIO(), environ={"NOTIFIER_LOG_LEVEL": "debug"})
    assert root_logging.level == logging.DEBUG
    with pytest.raises(ConfigError, match="NOTIFIER_LOG_LEVEL: expected DEBUG, INFO"):
        setup_logging(config, stream=io.StringIO(), environ={"NOTIFIER_LOG_LEVEL": "loud"})
