"""The email adapter against a real SMTP server (aiosmtpd on 127.0.0.1): delivery parsed back,
SMTP replies, connection failures, login, STARTTLS and TLS; then the whole service end to end."""

from __future__ import annotations

import functools
import json
import logging
import shutil
import socket
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from notifier.adapters.base import Receipt
from notifier.adapters.email import EmailAdapter
from notifier.bridge import open_bridge
from notifier.config import EmailWorkersConfig
from notifier.errors import DeliveryError, PermanentError, RetriableError
from notifier.messages import WorkerMessage
from notifier.testing import worker_message
from notifier.testing_smtp import SmtpSink, open_smtp_server
from tests.integration.conftest import (
    count_rows,
    create_tenant,
    make_config,
    run_notifier,
    sql,
    wait_status,
)

FROM = "notifier@mail.example.com"
USER, PASSWORD = "mailer", "pw-7f3a9c1e-never-logged"


def message(config: dict[str, Any] | None = None, **changes: Any) -> WorkerMessage:
    return worker_message(**{
        "delivery_id": uuid.uuid4(),
        "channel_type": "email",
        "channel_config": config or {"to": "ops@example.com"},
        "payload": {"order": 42, "customer": "Zoë"},
        "created_at": datetime.now(UTC),
        **changes,
    })  # fmt: skip


def settings(port: int, **changes: Any) -> EmailWorkersConfig:
    fields: dict[str, Any] = {"smtp_port": port, "from_address": FROM, "timeout_seconds": 5.0}
    fields.update(changes)
    return EmailWorkersConfig(**fields)


async def deliver(adapter: EmailAdapter, msg: WorkerMessage) -> Receipt | None:
    """Deliver (on the bridge the test opened, as a worker does); bounded so a hang fails."""
    with trio.fail_after(10):
        return await adapter.deliver(msg)


def causes(exc: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


# -- delivery -----------------------------------------------------------------------------------


async def test_an_email_is_delivered_and_parses_back() -> None:
    msg = message()
    async with open_smtp_server() as sink, open_bridge():
        got = await deliver(EmailAdapter(settings(sink.port)), msg)
        (mail,) = sink.received
    assert got is not None
    assert got.status_code == 250
    assert got.response_excerpt == "2.0.0 OK queued as 1"
    assert (mail.mail_from, mail.rcpt_tos, mail.login) == (FROM, ("ops@example.com",), None)
    email = mail.message()
    assert email["From"] == FROM
    assert email["To"] == "ops@example.com"
    assert email["Subject"] == "[notifier] order.created"
    assert email["Message-ID"] == f"<{msg.delivery_id}@mail.example.com>"
    assert email["Date"] is not None
    body = email.get_content()
    assert "Event: order.created\n" in body
    assert json.loads(body.split("Payload:\n", 1)[1]) == {"order": 42, "customer": "Zoë"}


async def test_templates_several_recipients_and_utf8_arrive_intact() -> None:
    config = {
        "to": ["a@example.com", "b@example.org"],
        "subject_template": "Bestellung {{ payload.order }} für {{ payload.customer }}",
        "body_template": "Grüße, {{ payload.customer }}! — {{ event_type }}\n",
    }
    async with open_smtp_server() as sink, open_bridge():
        await deliver(EmailAdapter(settings(sink.port)), message(config))
        (mail,) = sink.received
    assert mail.rcpt_tos == ("a@example.com", "b@example.org")
    email = mail.message()
    assert email["To"] == "a@example.com, b@example.org"
    assert email["Subject"] == "Bestellung 42 für Zoë"
    assert email.get_content_charset() == "utf-8"
    assert email.get_content() == "Grüße, Zoë! — order.created\n"


async def test_every_attempt_of_a_delivery_has_the_same_message_id() -> None:
    first = message()
    retry = message(delivery_id=first.delivery_id, attempt=2)
    other = message()
    async with open_smtp_server() as sink, open_bridge():
        adapter = EmailAdapter(settings(sink.port))
        for msg in (first, retry, other):
            await deliver(adapter, msg)
    ids = [m.message()["Message-ID"] for m in sink.received]
    assert ids[0] == ids[1] == f"<{first.delivery_id}@mail.example.com>"
    assert ids[2] == f"<{other.delivery_id}@mail.example.com>"


async def test_a_subject_rendering_a_line_break_is_refused_before_anything_is_sent() -> None:
    config = {"to": "a@example.com", "subject_template": "{{ payload.title }}"}
    async with open_smtp_server() as sink, open_bridge():
        with pytest.raises(PermanentError, match="CR, LF or NUL"):
            await deliver(
                EmailAdapter(settings(sink.port)),
                message(config, payload={"title": "Hi\r\nBcc: victim@example.org"}),
            )
    assert sink.received == []


# -- what the server answers --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "kind"),
    [("550 5.1.1 No such user", PermanentError), ("451 4.3.0 Try again later", RetriableError)],
)
async def test_a_refused_recipient_is_classified_by_its_reply(
    reply: str, kind: type[DeliveryError]
) -> None:
    async with open_smtp_server(refuse={"ops@example.com": reply}) as sink, open_bridge():
        with pytest.raises(kind) as info:
            await deliver(EmailAdapter(settings(sink.port)), message())
    assert type(info.value) is kind
    assert info.value.status_code == int(reply[:3])
    assert f"all recipients refused: ops@example.com: {reply}" in str(info.value)
    assert sink.received == []


async def test_one_refused_recipient_among_several_is_noted_and_the_rest_get_it() -> None:
    config = {"to": ["gone@example.com", "ops@example.com"]}
    refuse = {"gone@example.com": "550 5.1.1 No such user"}
    async with open_smtp_server(refuse=refuse) as sink, open_bridge():
        got = await deliver(EmailAdapter(settings(sink.port)), message(config))
        (mail,) = sink.received
    assert mail.rcpt_tos == ("ops@example.com",)
    assert got == Receipt(
        status_code=250,
        response_excerpt="2.0.0 OK queued as 1 (refused: gone@example.com: 550 5.1.1 No such user)",
    )


@pytest.mark.parametrize(
    ("reply", "kind"),
    [("554 5.7.1 Looks like spam", PermanentError), ("452 4.3.1 Out of storage", RetriableError)],
)
async def test_a_refused_message_is_classified_by_its_reply(
    reply: str, kind: type[DeliveryError]
) -> None:
    async with open_smtp_server(data_reply=reply) as sink, open_bridge():
        with pytest.raises(kind) as info:
            await deliver(EmailAdapter(settings(sink.port)), message())
    assert type(info.value) is kind
    assert info.value.status_code == int(reply[:3])
    assert f"message refused: {reply[4:]}" in str(info.value)


async def test_a_refused_connection_is_retriable() -> None:
    with socket.socket() as reserved:  # bound, never listening: connecting is refused
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
        async with open_bridge():
            with pytest.raises(RetriableError, match="connection failed: SMTPConnectError") as info:
                await deliver(EmailAdapter(settings(port)), message())
    assert info.value.status_code is None


async def test_a_server_that_never_greets_times_out_retriably() -> None:
    async def hold(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    async with open_bridge(), trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            functools.partial(trio.serve_tcp, hold, 0, host="127.0.0.1")
        )
        port = listener.socket.getsockname()[1]
        t0 = trio.current_time()
        with pytest.raises(RetriableError, match="timed out"):
            await deliver(EmailAdapter(settings(port, timeout_seconds=0.5)), message())
        assert trio.current_time() - t0 < 5
        nursery.cancel_scope.cancel()


# -- login ----------------------------------------------------------------------------------------


async def test_a_login_with_the_right_password_delivers() -> None:
    async with open_smtp_server(credentials=(USER, PASSWORD)) as sink, open_bridge():
        adapter = EmailAdapter(settings(sink.port, smtp_username=USER), password=PASSWORD)
        await deliver(adapter, message())
        (mail,) = sink.received
    assert mail.login == USER


async def test_a_wrong_password_is_a_permanent_error_that_does_not_show_it() -> None:
    wrong = "wrong-" + PASSWORD
    async with open_smtp_server(credentials=(USER, PASSWORD)) as sink, open_bridge():
        adapter = EmailAdapter(settings(sink.port, smtp_username=USER), password=wrong)
        with pytest.raises(PermanentError, match="SMTP 535: login refused") as info:
            await deliver(adapter, message())
    assert info.value.status_code == 535
    assert sink.received == []
    assert sink.failed_logins >= 1  # aiosmtplib tries each mechanism offered (PLAIN, LOGIN)
    for exc in causes(info.value):
        assert wrong not in str(exc)
        assert wrong not in repr(exc)
    assert wrong not in repr(adapter)


async def test_no_login_where_the_server_requires_one_is_permanent() -> None:
    async with open_smtp_server(credentials=(USER, PASSWORD)) as sink, open_bridge():
        with pytest.raises(PermanentError, match="SMTP 530: sender refused"):
            await deliver(EmailAdapter(settings(sink.port)), message())


# -- TLS ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificate:
    server: ssl.SSLContext  # presents a self-signed certificate for 127.0.0.1
    client: ssl.SSLContext  # trusts exactly that certificate


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    d: Path = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(d / "cert.pem", d / "key.pem")
    client = ssl.create_default_context(cafile=str(d / "cert.pem"))
    return Certificate(server, client)


async def test_starttls_with_a_login_delivers(certificate: Certificate) -> None:
    async with (
        open_smtp_server(tls_context=certificate.server, credentials=(USER, PASSWORD)) as sink,
        open_bridge(),
    ):
        adapter = EmailAdapter(
            settings(sink.port, smtp_security="starttls", smtp_username=USER),
            password=PASSWORD, tls_context=certificate.client,
        )  # fmt: skip
        await deliver(adapter, message())
        (mail,) = sink.received
    assert mail.login == USER


async def test_implicit_tls_delivers(certificate: Certificate) -> None:
    async with (
        open_smtp_server(tls_context=certificate.server, implicit_tls=True) as sink,
        open_bridge(),
    ):
        adapter = EmailAdapter(
            settings(sink.port, smtp_security="tls"), tls_context=certificate.client
        )
        await deliver(adapter, message())
    assert len(sink.received) == 1


async def test_an_untrusted_certificate_is_refused_retriably(certificate: Certificate) -> None:
    async with (
        open_smtp_server(tls_context=certificate.server, implicit_tls=True) as sink,
        open_bridge(),
    ):
        adapter = EmailAdapter(settings(sink.port, smtp_security="tls"))  # the system's CAs
        with pytest.raises(RetriableError, match=r"connection failed.*CERTIFICATE_VERIFY_FAILED"):
            await deliver(adapter, message())
    assert sink.received == []


async def test_starttls_configured_but_not_offered_is_retriable_and_sends_nothing() -> None:
    async with open_smtp_server() as sink, open_bridge():
        adapter = EmailAdapter(settings(sink.port, smtp_security="starttls"))
        with pytest.raises(RetriableError, match="STARTTLS extension not supported"):
            await deliver(adapter, message())
    assert sink.received == []


# -- the whole service ----------------------------------------------------------------------------


@asynccontextmanager
async def email_service(
    database_url: str, broker_url: str, sink: SmtpSink, **email: Any
) -> AsyncIterator[Any]:
    workers = {"email": {"smtp_port": sink.port, "from": FROM, "concurrency": 2, **email}}
    config = make_config(database_url, broker_url, workers=workers)
    key = await create_tenant(database_url)
    async with run_notifier(config) as running, running.client(key) as api:
        yield api


async def test_an_event_posted_over_http_is_emailed(
    database_url: str, broker_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFIER_SMTP_PASSWORD", PASSWORD)  # read by the registry
    async with (
        open_smtp_server(credentials=(USER, PASSWORD)) as sink,
        email_service(database_url, broker_url, sink, smtp_username=USER) as api,
    ):
        resp = await api.post("/v1/channels", json={
            "type": "email", "event_types": ["order.*"],
            "config": {"to": "ops@example.com", "subject_template": "Order {{ payload.n }}"},
        })  # fmt: skip
        assert resp.status_code == 201, resp.text
        assert resp.json()["config"] == {
            "to": "ops@example.com",
            "subject_template": "Order {{ payload.n }}",
        }
        resp = await api.post("/v1/events", json={"type": "order.created", "payload": {"n": 7}})
        assert resp.status_code == 202, resp.text
        (delivery,) = resp.json()["deliveries"]
        with trio.fail_after(30):
            (mail,) = await sink.wait_for(1)
            await wait_status(database_url, delivery["id"], "DELIVERED")
    email = mail.message()
    assert (email["To"], email["Subject"]) == ("ops@example.com", "Order 7")
    assert email["Message-ID"] == f"<{delivery['id']}@mail.example.com>"
    assert mail.login == USER
    (attempt,) = await sql(
        database_url,
        "SELECT outcome, status_code, response_excerpt FROM delivery_attempts"
        " WHERE delivery_id = $1", uuid.UUID(delivery["id"]),
    )  # fmt: skip
    assert tuple(attempt) == ("delivered", 250, "2.0.0 OK queued as 1")


async def test_a_recipient_refused_for_good_ends_dead_after_one_attempt(
    database_url: str, broker_url: str
) -> None:
    refuse = {"gone@example.com": "550 5.1.1 No such user"}
    async with (
        open_smtp_server(refuse=refuse) as sink,
        email_service(database_url, broker_url, sink) as api,
    ):
        resp = await api.post("/v1/channels", json={
            "type": "email", "event_types": ["*"], "config": {"to": "gone@example.com"},
        })  # fmt: skip
        assert resp.status_code == 201, resp.text
        resp = await api.post("/v1/events", json={"type": "order.created", "payload": {}})
        (delivery,) = resp.json()["deliveries"]
        with trio.fail_after(30):
            await wait_status(database_url, delivery["id"], "DEAD")
    row = (await sql(database_url, "SELECT attempt, last_error FROM deliveries WHERE id = $1",
                     uuid.UUID(delivery["id"])))[0]  # fmt: skip
    assert row["attempt"] == 1
    assert "550 5.1.1 No such user" in row["last_error"]
    assert sink.received == []


async def test_a_wrong_password_ends_dead_and_is_in_no_log_and_no_stored_error(
    database_url: str, broker_url: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-" + PASSWORD
    monkeypatch.setenv("NOTIFIER_SMTP_PASSWORD", wrong)
    async with (
        open_smtp_server(credentials=(USER, PASSWORD)) as sink,
        email_service(database_url, broker_url, sink, smtp_username=USER) as api,
    ):
        resp = await api.post("/v1/channels", json={
            "type": "email", "event_types": ["*"], "config": {"to": "ops@example.com"},
        })  # fmt: skip
        assert resp.status_code == 201, resp.text
        resp = await api.post("/v1/events", json={"type": "order.created", "payload": {}})
        (delivery,) = resp.json()["deliveries"]
        with trio.fail_after(30):
            await wait_status(database_url, delivery["id"], "DEAD")
    errors = await sql(
        database_url,
        "SELECT d.last_error, a.error FROM deliveries d"
        " JOIN delivery_attempts a ON a.delivery_id = d.id WHERE d.id = $1",
        uuid.UUID(delivery["id"]),
    )  # fmt: skip
    assert errors
    for last_error, error in errors:
        assert "SMTP 535: login refused" in last_error
        assert wrong not in last_error
        assert wrong not in error
    assert sink.received == []
    assert caplog.records  # the run did log
    assert wrong not in caplog.text


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"to": "ops@example.com\r\nBcc: victim@example.org"}, "config.to"),
        ({"to": "ops@example.com", "subject_template": "Hi\r\nBcc: v@example.org"},
         "config.subject_template"),
    ],
)  # fmt: skip
async def test_a_header_injection_is_refused_at_channel_create(
    database_url: str, broker_url: str, config: dict[str, Any], field: str
) -> None:
    async with (
        open_smtp_server() as sink,
        email_service(database_url, broker_url, sink) as api,
    ):
        resp = await api.post(
            "/v1/channels", json={"type": "email", "event_types": ["*"], "config": config}
        )
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "validation_error"
    assert error["message"].startswith(f"{field}: ")
    assert "CR, LF or NUL" in error["message"]
    assert (await count_rows(database_url))["channels"] == 0
