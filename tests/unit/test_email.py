"""Email adapter, the sans-io parts: channel config, the message, classifying SMTP failures."""

from __future__ import annotations

import json
import ssl
import uuid
from datetime import UTC, datetime
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import format_datetime
from typing import Any

import msgspec
import pytest
from aiosmtplib import (
    SMTPAuthenticationError,
    SMTPConnectError,
    SMTPConnectResponseError,
    SMTPConnectTimeoutError,
    SMTPDataError,
    SMTPException,
    SMTPHeloError,
    SMTPNotSupported,
    SMTPReadTimeoutError,
    SMTPRecipientRefused,
    SMTPRecipientsRefused,
    SMTPResponse,
    SMTPResponseException,
    SMTPSenderRefused,
    SMTPServerDisconnected,
    SMTPTimeoutError,
)

from notifier.adapters.base import InvalidChannelConfig, Receipt
from notifier.adapters.email import (
    EXCERPT_CHARS,
    MAX_RECIPIENTS,
    EmailAdapter,
    EmailChannels,
    EmailConfig,
    build_message,
    classify_error,
    message_id,
    receipt,
)
from notifier.adapters.registry import build_adapters
from notifier.config import EmailWorkersConfig, parse_config
from notifier.errors import ConfigError, PermanentError, RetriableError
from notifier.messages import WorkerMessage
from notifier.testing import worker_message

NOW = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
DELIVERY = uuid.UUID("0b7c8f4e-2f4b-4f8e-9a53-6a1c2d3e4f50")
FROM = "notifier@mail.example.com"
PASSWORD = "s3cret-Passw0rd"


def message(channel_config: dict[str, Any] | None = None, **changes: Any) -> WorkerMessage:
    return worker_message(**{
        "delivery_id": DELIVERY,
        "event_id": uuid.UUID(int=2),
        "channel_type": "email",
        "channel_config": channel_config or {"to": "ops@example.com"},
        "payload": {"order": 42, "customer": "Zoë", "items": ["a", "b"]},
        "created_at": datetime(2024, 5, 6, 7, 0, 0, tzinfo=UTC),
        **changes,
    })  # fmt: skip


def adapter(**settings: Any) -> EmailAdapter:
    return EmailAdapter(EmailWorkersConfig(**{"from_address": FROM, **settings}))


def channels() -> EmailChannels:
    return EmailChannels(EmailWorkersConfig(from_address=FROM))


def build(channel_config: dict[str, Any], **changes: Any) -> EmailMessage:
    msg = message(channel_config, **changes)
    return build_message(msg, msgspec.convert(msg.channel_config, EmailConfig), FROM, now=NOW)


def wire(msg: EmailMessage) -> EmailMessage:
    """The message as a mail client parses it after it went over SMTP (with CRLF line ends,
    which a client shows as plain line breaks)."""
    data = msg.as_bytes(policy=policy.SMTP).replace(b"\r\n", b"\n")
    parsed = BytesParser(policy=policy.default).parsebytes(data)
    assert isinstance(parsed, EmailMessage)
    return parsed


# -- channel config -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "prepared"),
    [
        # One address, kept as the string it was given.
        ({"to": "ops@example.com"}, {"to": "ops@example.com"}),
        # A list, kept as a list, in order.
        (
            {"to": ["a@example.com", "b.c+tag@sub.example.org"]},
            {"to": ["a@example.com", "b.c+tag@sub.example.org"]},
        ),
        # Unusual but valid local parts, and a single-label host (a local relay).
        ({"to": "o'brien_{x}@localhost"}, {"to": "o'brien_{x}@localhost"}),
        # Templates are kept as given.
        (
            {"to": "a@example.com", "subject_template": "Order {{ payload.order }}",
             "body_template": "Hi\n{{ payload_json }}\n"},
            {"to": "a@example.com", "subject_template": "Order {{ payload.order }}",
             "body_template": "Hi\n{{ payload_json }}\n"},
        ),
        # Explicit nulls mean the defaults and are not stored.
        ({"to": "a@example.com", "subject_template": None}, {"to": "a@example.com"}),
        # The most recipients a channel may have.
        (
            {"to": [f"u{i}@example.com" for i in range(MAX_RECIPIENTS)]},
            {"to": [f"u{i}@example.com" for i in range(MAX_RECIPIENTS)]},
        ),
    ],
)  # fmt: skip
def test_a_good_config_is_prepared(config: dict[str, Any], prepared: dict[str, Any]) -> None:
    assert channels().prepare_config(config) == prepared


@pytest.mark.parametrize(
    ("config", "field", "problem"),
    [
        ({}, "config.to", "missing required key"),
        ({"to": 5}, "config.to", "Expected"),
        ({"to": "a@example.com", "cc": "b@example.com"}, "config.cc", "unknown key"),
        ({"to": "a@example.com", "subject_template": 1}, "config.subject_template", "Expected"),
        # Not addresses.
        ({"to": "not-an-address"}, "config.to", "not an email address"),
        ({"to": "@example.com"}, "config.to", "not an email address"),
        ({"to": "a..b@example.com"}, "config.to", "not an email address"),
        ({"to": "a@b@example.com"}, "config.to", "not an email address"),
        ({"to": "a@example..com"}, "config.to", "invalid domain"),
        ({"to": "a@-example.com"}, "config.to", "invalid domain"),
        ({"to": "a@"}, "config.to", "invalid domain"),
        ({"to": "x" * 250 + "@example.com"}, "config.to", "longer than 254"),
        ({"to": "x" * 65 + "@example.com"}, "config.to", "not an email address"),
        # Display names and lists in one string are refused: one bare address per entry.
        ({"to": "Ops <ops@example.com>"}, "config.to", "not an email address"),
        ({"to": "a@example.com, b@example.com"}, "config.to", "not an email address"),
        ({"to": "jörg@example.com"}, "config.to", "ASCII"),
        # Header injection through the address.
        ({"to": "a@example.com\r\nBcc: victim@example.org"}, "config.to", "CR, LF or NUL"),
        ({"to": "a@example.com\nBcc: victim@example.org"}, "config.to", "CR, LF or NUL"),
        ({"to": "a@example.com\rX"}, "config.to", "CR, LF or NUL"),
        ({"to": "a@example.com\x00"}, "config.to", "CR, LF or NUL"),
        # The list is checked entry by entry, and the entry is named.
        ({"to": ["ok@example.com", "b@example.com\r\nBcc: x@y.z"]}, "config.to[1]", "CR, LF"),
        ({"to": ["ok@example.com", "nope"]}, "config.to[1]", "not an email address"),
        ({"to": []}, "config.to", "at least one"),
        ({"to": [f"u{i}@example.com" for i in range(MAX_RECIPIENTS + 1)]}, "config.to",
         f"more than {MAX_RECIPIENTS}"),
        # Header injection through the subject template itself.
        ({"to": "a@example.com", "subject_template": "Hi\r\nBcc: x@y.z"},
         "config.subject_template", "CR, LF or NUL"),
        ({"to": "a@example.com", "subject_template": "Hi\n"}, "config.subject_template", "CR"),
        # Templates that do not compile.
        ({"to": "a@example.com", "subject_template": "{{ event_type"},
         "config.subject_template", "template error on line 1"),
        ({"to": "a@example.com", "body_template": "ok\n{% for x in payload %}"},
         "config.body_template", "template error"),
        ({"to": "a@example.com", "body_template": "x" * 20_000}, "config.body_template",
         "longer than"),
    ],
)  # fmt: skip
def test_a_bad_config_is_refused_naming_the_field(
    config: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(InvalidChannelConfig) as info:
        channels().prepare_config(config)
    assert info.value.field == field
    assert problem in info.value.message


def test_nothing_in_the_channel_config_is_secret() -> None:
    assert (adapter().channel_type, channels().secret_fields) == ("email", frozenset())


# -- the message --------------------------------------------------------------------------------


def test_the_message_has_the_headers_of_a_notification() -> None:
    msg = wire(build({"to": ["a@example.com", "b@example.org"]}))
    assert msg["From"] == FROM
    assert msg["To"] == "a@example.com, b@example.org"
    assert [a.addr_spec for a in msg["To"].addresses] == ["a@example.com", "b@example.org"]
    assert msg["Subject"] == "[notifier] order.created"
    assert msg["Date"] == format_datetime(NOW)
    assert msg["Message-ID"] == f"<{DELIVERY}@mail.example.com>"
    assert msg["Auto-Submitted"] == "auto-generated"
    assert msg.get_content_type() == "text/plain"
    assert msg.get_content_charset() == "utf-8"
    assert "Bcc" not in msg


def test_the_message_id_is_stable_per_delivery() -> None:
    first = build({"to": "a@example.com"}, attempt=1)
    retry = build_message(
        message(attempt=3), EmailConfig(to="a@example.com"), FROM, now=datetime.now(UTC)
    )
    other = build({"to": "a@example.com"}, delivery_id=uuid.UUID(int=9))
    assert first["Message-ID"] == retry["Message-ID"] == f"<{DELIVERY}@mail.example.com>"
    assert other["Message-ID"] == f"<{uuid.UUID(int=9)}@mail.example.com>"


@pytest.mark.parametrize(
    ("from_address", "expected"),
    [
        ("n@example.com", f"<{DELIVERY}@example.com>"),
        ("notifier@localhost", f"<{DELIVERY}@localhost>"),
    ],
)
def test_the_message_id_uses_the_from_domain(from_address: str, expected: str) -> None:
    assert message_id(DELIVERY, from_address) == expected


def test_the_default_body_names_the_event_and_shows_the_payload() -> None:
    body = wire(build({"to": "a@example.com"})).get_content()
    head, payload = body.split("Payload:\n", 1)
    assert "Event: order.created" in head
    assert f"Event id: {uuid.UUID(int=2)}" in head
    assert "Created at: 2024-05-06T07:00:00+00:00" in head
    assert "Recipient" not in head
    assert json.loads(payload) == {"order": 42, "customer": "Zoë", "items": ["a", "b"]}
    assert '  "customer": "Zoë"' in payload  # readable: indented, not \u-escaped


def test_the_default_body_names_the_recipient_when_there_is_one() -> None:
    body = wire(build({"to": "a@example.com"}, recipient="user-7")).get_content()
    assert "Recipient: user-7\n" in body


def test_custom_templates_are_rendered_from_the_event() -> None:
    msg = wire(
        build(
            {
                "to": "a@example.com",
                "subject_template": "Bestellung {{ payload.order }} für {{ payload.customer }}",
                "body_template": "Hallo {{ payload.customer }},\n"
                "{% for i in payload['items'] %}- {{ i }}\n{% endfor %}",
            }
        )
    )
    assert msg["Subject"] == "Bestellung 42 für Zoë"  # RFC 2047-encoded on the wire
    assert msg.get_content() == "Hallo Zoë,\n- a\n- b\n"


def test_the_rendered_subject_is_stripped_of_outer_whitespace() -> None:
    msg = build({"to": "a@example.com", "subject_template": "  {{ payload.customer }}  "})
    assert msg["Subject"] == "Zoë"


@pytest.mark.parametrize("breaker", ["\r\n", "\n", "\r", "\x00"])
def test_a_subject_that_renders_a_line_break_is_a_permanent_error(breaker: str) -> None:
    payload = {"title": f"hello{breaker}Bcc: victim@example.org"}
    with pytest.raises(PermanentError, match=r"config.subject_template.*CR, LF or NUL"):
        build({"to": "a@example.com", "subject_template": "{{ payload.title }}"}, payload=payload)


def test_a_line_break_in_the_body_is_just_text() -> None:
    msg = wire(build({"to": "a@example.com", "body_template": "{{ payload.t }}"},
                     payload={"t": "a\r\nBcc: x@y.z"}))  # fmt: skip
    assert "Bcc" not in msg
    assert msg.get_content() == "a\nBcc: x@y.z\n"


def test_a_template_failing_at_delivery_is_a_permanent_error() -> None:
    with pytest.raises(PermanentError, match=r"config.body_template: rendering failed"):
        build({"to": "a@example.com", "body_template": "{{ 1 / 0 }}"})


def test_a_bad_address_in_the_snapshot_is_a_permanent_error() -> None:
    # The config travels in the queue message; one that bypassed the API is checked again.
    with pytest.raises(PermanentError, match=r"config.to\[0\]: contains CR, LF or NUL"):
        build({"to": "a@example.com\r\nBcc: x@y.z"})


async def test_deliver_refuses_a_snapshot_config_it_cannot_read() -> None:
    with pytest.raises(PermanentError, match=r"channel config: config.url: unknown key"):
        await adapter().deliver(message({"url": "https://example.com"}))


# -- classification -----------------------------------------------------------------------------


def refused(code: int, address: str = "a@example.com") -> SMTPRecipientRefused:
    return SMTPRecipientRefused(code, f"{code} says no", address)


@pytest.mark.parametrize(
    ("exc", "kind", "status_code", "text"),
    [
        # The only recipient refused for good, or for now.
        (SMTPRecipientsRefused([refused(550)]), PermanentError, 550,
         "all recipients refused: a@example.com: 550 550 says no"),
        (SMTPRecipientsRefused([refused(451)]), RetriableError, 451, "451 says no"),
        # Every recipient refused, one only for now: a later attempt may reach that one.
        (SMTPRecipientsRefused([refused(550, "a@x.y"), refused(452, "b@x.y")]), RetriableError,
         452, "a@x.y: 550 550 says no; b@x.y: 452"),
        (SMTPRecipientsRefused([refused(550), refused(553)]), PermanentError, 550, "553"),
        # Replies at the other steps: 4xx retriable, 5xx permanent.
        (SMTPSenderRefused(553, "sender not allowed", "n@x.y"), PermanentError, 553,
         "SMTP 553: sender refused: sender not allowed"),
        (SMTPSenderRefused(451, "try later", "n@x.y"), RetriableError, 451, "sender refused"),
        (SMTPDataError(554, "looks like spam"), PermanentError, 554, "message refused"),
        (SMTPDataError(452, "insufficient storage"), RetriableError, 452, "message refused"),
        (SMTPAuthenticationError(535, "5.7.8 credentials invalid"), PermanentError, 535,
         "login refused"),
        (SMTPAuthenticationError(454, "4.7.0 temporary failure"), RetriableError, 454,
         "login refused"),
        (SMTPHeloError(501, "bad hostname"), PermanentError, 501, "greeting refused"),
        (SMTPConnectResponseError(554, "no service here"), PermanentError, 554,
         "connection refused by the server"),
        (SMTPConnectResponseError(421, "too busy"), RetriableError, 421, "too busy"),
        (SMTPResponseException(421, "closing channel"), RetriableError, 421,
         "SMTP 421: the server answered: closing channel"),
        (SMTPResponseException(500, "syntax error"), PermanentError, 500, "syntax error"),
        # A code outside 4xx/5xx (a confused server) is not a verdict on the message.
        (SMTPResponseException(-1, "malformed response"), RetriableError, -1, "malformed"),
        # No reply at all: the network or the server's availability.
        (SMTPConnectError("Error connecting to h on port 25: [Errno 111] refused"),
         RetriableError, None, "connection failed: SMTPConnectError"),
        (SMTPServerDisconnected("Connection lost"), RetriableError, None, "connection failed"),
        (ConnectionRefusedError(111, "Connection refused"), RetriableError, None,
         "connection failed: ConnectionRefusedError"),
        (ssl.SSLCertVerificationError("certificate verify failed"), RetriableError, None,
         "connection failed: SSLCertVerificationError"),
        (SMTPConnectTimeoutError("Timed out connecting"), RetriableError, None, "timed out"),
        (SMTPReadTimeoutError("Timed out waiting for server response"), RetriableError, None,
         "timed out"),
        (SMTPTimeoutError("Timed out while upgrading transport"), RetriableError, None,
         "timed out"),
        (TimeoutError(), RetriableError, None, "timed out"),
        # The server lacks what [workers.email] asks for: fixable by an operator, so retried.
        (SMTPException("SMTP STARTTLS extension not supported by server."), RetriableError,
         None, "STARTTLS"),
        (SMTPException("The SMTP AUTH extension is not supported by this server."),
         RetriableError, None, "AUTH"),
        # Something about this message the server cannot take.
        (SMTPNotSupported("SMTPUTF8 is not supported by this server"), PermanentError, None,
         "SMTPUTF8"),
        (ValueError("Command arg contains a prohibited control character"), PermanentError,
         None, "prohibited control character"),
    ],
)  # fmt: skip
def test_smtp_failures_are_classified(
    exc: Exception, kind: type[Exception], status_code: int | None, text: str
) -> None:
    error = classify_error(exc)
    assert type(error) is kind
    assert error.status_code == status_code
    assert text in str(error)
    # No reply at all (a timeout, a connection failure) is the server unreachable, what counts
    # towards the channel's circuit; any reply is an answer.
    no_reply = text.startswith(("connection failed", "timed out"))
    assert getattr(error, "unreachable", False) is no_reply


@pytest.mark.parametrize("exc", [RuntimeError("bug"), KeyError("x"), TypeError("nope")])
def test_what_is_not_an_smtp_failure_is_left_alone(exc: Exception) -> None:
    assert classify_error(exc) is None


def test_a_long_server_reply_is_clipped_and_nul_free() -> None:
    error = classify_error(SMTPDataError(554, "x\x00" + "y" * 5000))
    assert error is not None
    assert "\x00" not in str(error)
    assert len(str(error)) < 300


@pytest.mark.parametrize(
    ("refused_", "reply", "excerpt"),
    [
        ({}, "2.0.0 Ok: queued as ABC", "2.0.0 Ok: queued as ABC"),
        # Some recipients took it: delivered, the refusals on record.
        ({"b@x.y": SMTPResponse(550, "no such user")}, "OK",
         "OK (refused: b@x.y: 550 no such user)"),
        ({}, "", None),
    ],
)  # fmt: skip
def test_the_receipt_carries_the_servers_reply(
    refused_: dict[str, SMTPResponse], reply: str, excerpt: str | None
) -> None:
    assert receipt(refused_, reply) == Receipt(status_code=250, response_excerpt=excerpt)


def test_the_receipt_excerpt_fits_the_attempt_log() -> None:
    got = receipt({f"u{i}@x.y": SMTPResponse(550, "é" * 100) for i in range(50)}, "OK")
    assert got.response_excerpt is not None
    assert len(got.response_excerpt) <= EXCERPT_CHARS
    assert len(got.response_excerpt.encode()) <= 2048  # the column's limit


# -- [workers.email] ----------------------------------------------------------------------------


def workers(**email: Any) -> EmailWorkersConfig:
    config = parse_config({"workers": {"email": email}}, env={})
    assert config.workers.email is not None
    return config.workers.email


@pytest.mark.parametrize("environ", [{}, {"NOTIFIER_SMTP_PASSWORD": ""}])
def test_a_login_without_its_password_in_the_environment_is_a_config_error(
    environ: dict[str, str],
) -> None:
    with pytest.raises(ConfigError) as info:
        EmailAdapter.from_config(workers(smtp_username="mailer"), environ)
    assert str(info.value).startswith("workers.email.smtp_password_env: ")
    assert "NOTIFIER_SMTP_PASSWORD" in str(info.value)


def test_the_password_is_read_from_the_variable_the_config_names() -> None:
    settings = workers(smtp_username="mailer", smtp_password_env="MY_SMTP_PW")
    with pytest.raises(ConfigError, match="MY_SMTP_PW"):
        EmailAdapter.from_config(settings, {"NOTIFIER_SMTP_PASSWORD": PASSWORD})
    a = EmailAdapter.from_config(settings, {"MY_SMTP_PW": PASSWORD})
    assert PASSWORD not in repr(a)
    assert PASSWORD not in str(vars(a).get("_settings"))


def test_without_a_login_no_password_is_needed() -> None:
    assert isinstance(EmailAdapter.from_config(workers(), {}), EmailAdapter)


@pytest.mark.parametrize(
    "from_address", ["n@example.com\r\nBcc: victim@example.org", "n@example.com\x00", "nobody"]
)
def test_a_from_address_that_cannot_be_a_header_is_a_config_error(from_address: str) -> None:
    with pytest.raises(ConfigError, match=r"^workers.email.from: "):
        EmailAdapter.from_config(workers(**{"from": from_address}), {})
    with pytest.raises(ConfigError, match=r"^workers.email.from: "):  # in every role
        EmailChannels(workers(**{"from": from_address}))


def test_the_registry_builds_the_email_adapter_when_it_is_enabled() -> None:
    data = {"workers": {"email": {"smtp_username": "mailer", "from": "n@example.com"}}}
    config = parse_config(data, env={})
    adapters = build_adapters(config, {"NOTIFIER_SMTP_PASSWORD": PASSWORD})
    assert isinstance(adapters["email"], EmailAdapter)
    with pytest.raises(ConfigError, match=r"workers.email.smtp_password_env"):
        build_adapters(config, {})
    assert "email" not in build_adapters(parse_config({}, env={}), {})
