"""The one registry of secrets: a value registered once is kept out of the log lines and out of
every adapter's error texts, and each library edge maps its errors through one table."""

from __future__ import annotations

import logging
import uuid

import aiormq
import aiosmtplib
import httpx
import pytest

from notifier.adapters.email import smtp_errors
from notifier.adapters.http import protect_in_http_logs
from notifier.adapters.telegram import TelegramAdapterCrash
from notifier.adapters.telegram import transport_error as telegram_error
from notifier.adapters.webhook.answers import WebhookAdapterCrash
from notifier.adapters.webhook.answers import transport_error as webhook_error
from notifier.broker.amqp import broker_errors
from notifier.errors import BrokerError, PermanentError, RetriableError
from notifier.secrets import SecretRegistry, register_secret, scrub_known


def fresh_secret() -> str:
    return f"sekret/{uuid.uuid4().hex}"


def test_a_registered_secret_leaves_every_adapters_error_text() -> None:
    secret = fresh_secret()
    register_secret(secret)
    encoded = secret.replace("/", "%2F")
    for text in (f"near {secret}", f"near {encoded}"):
        for mapped in (
            webhook_error(httpx.ConnectError(text), ()),
            webhook_error(ValueError(text), ()),
            telegram_error(httpx.ConnectError(text), None),
            telegram_error(ValueError(text), None),
        ):
            assert isinstance(mapped, RetriableError | WebhookAdapterCrash | TelegramAdapterCrash)
            assert secret not in str(mapped)
            assert encoded not in str(mapped)


def test_an_smtp_error_echoing_a_registered_secret_keeps_neither_it_nor_its_cause() -> None:
    secret = fresh_secret()
    register_secret(secret)
    with pytest.raises(PermanentError) as info, smtp_errors():
        raise aiosmtplib.SMTPDataError(554, f"rejected: {secret}")
    assert str(info.value) == "SMTP 554: message refused: rejected: ***"
    assert info.value.__cause__ is None


def test_an_smtp_error_keeps_its_cause_when_it_holds_no_secret() -> None:
    refused = "connection failed: ConnectionRefusedError"
    with pytest.raises(RetriableError, match=refused) as info, smtp_errors("pw"):
        raise ConnectionRefusedError("refused")
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_request_forms_are_scrubbed_with_the_registered_ones() -> None:
    secret = fresh_secret()
    registry = SecretRegistry()
    registry.register(secret)
    assert registry.known(f"{secret} and header-value", ["header-value"]) == (
        "[redacted] and [redacted]"
    )
    assert scrub_known("nothing here", ["header-value"]) == "nothing here"


def test_the_http_library_loggers_lose_a_registered_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = fresh_secret()
    protect_in_http_logs(secret)
    caplog.set_level(logging.DEBUG, logger="httpcore.http11")
    logging.getLogger("httpcore.http11").debug("sending %s", secret)
    assert "sending ***" in caplog.text
    assert secret not in caplog.text


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ReadTimeout("slow"), RetriableError),
        (httpx.UnsupportedProtocol("ftp"), PermanentError),
        (OSError("unreachable"), RetriableError),
    ],
)
def test_the_http_edge_maps_through_one_table(exc: Exception, kind: type[Exception]) -> None:
    assert isinstance(telegram_error(exc, None), kind)


def test_aiormq_errors_become_broker_errors_with_the_callers_words() -> None:
    with (
        pytest.raises(
            BrokerError, match=r"^declaring the topology failed: ConnectionError"
        ) as info,
        broker_errors("declaring the topology failed"),
    ):
        raise ConnectionError("gone")
    assert isinstance(info.value.__cause__, ConnectionError)
    closed = pytest.raises(BrokerError, match="ChannelInvalidStateError")
    with closed, broker_errors("consuming q failed"):
        raise aiormq.exceptions.ChannelInvalidStateError("closed")
    with pytest.raises(ValueError, match="a bug"), broker_errors("not aiormq's"):
        raise ValueError("a bug")
