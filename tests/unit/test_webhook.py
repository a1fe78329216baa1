"""Webhook adapter, the sans-io parts: signing, the request, classifying answers, config."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import uuid
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest

from notifier.adapters.base import InvalidChannelConfig, Receipt
from notifier.adapters.webhook import (
    WebhookAdapter,
    build_request,
    classify,
    generate_secret,
    parse_retry_after,
    sign,
    validate_url,
)
from notifier.errors import PermanentError, RetriableError
from notifier.messages import WorkerMessage

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NOW = 1_700_000_000


def message(**changes: Any) -> WorkerMessage:
    fields: dict[str, Any] = {
        "delivery_id": uuid.UUID("0b7c8f4e-2f4b-4f8e-9a53-6a1c2d3e4f50"),
        "event_id": uuid.UUID(int=2),
        "tenant_id": uuid.UUID(int=3),
        "channel_id": uuid.UUID(int=4),
        "channel_type": "webhook",
        "channel_config": {"url": "https://example.com/hook", "secret": SECRET},
        "event_type": "order.created",
        "recipient": None,
        "payload": {"order": 42, "items": ["a", "b"]},
        "created_at": datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
        "attempt": 1,
        "max_attempts": 5,
    }
    fields.update(changes)
    return WorkerMessage(**fields)


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Standard Webhooks verification, written out independently of ``sign``."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        hmac.compare_digest(sig.removeprefix("v1,"), expected)
        for sig in headers["webhook-signature"].split()
        if sig.startswith("v1,")
    )


# -- signing ------------------------------------------------------------------------------------


def test_sign_reproduces_the_standard_webhooks_test_vector() -> None:
    got = sign(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert got == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_sign_depends_on_every_part() -> None:
    base = sign(SECRET, "msg_1", 1, b"{}")
    assert sign(SECRET, "msg_2", 1, b"{}") != base
    assert sign(SECRET, "msg_1", 2, b"{}") != base
    assert sign(SECRET, "msg_1", 1, b"{ }") != base
    assert sign(generate_secret(), "msg_1", 1, b"{}") != base


# -- the request --------------------------------------------------------------------------------


def test_build_request_headers() -> None:
    m = message()
    headers, body = build_request(m, SECRET, {"x-team": "billing"}, NOW)
    assert headers["webhook-id"] == str(m.delivery_id)
    assert headers["webhook-timestamp"] == str(NOW)
    assert headers["content-type"] == "application/json"
    assert headers["x-team"] == "billing"
    assert re.fullmatch(r"v1,[A-Za-z0-9+/]{43}=", headers["webhook-signature"])
    assert verify(SECRET, headers, body)


def test_build_request_body_is_the_envelope() -> None:
    _, body = build_request(message(), SECRET, {}, NOW)
    assert json.loads(body) == {
        "type": "order.created",
        "timestamp": "2024-05-06T07:08:09Z",
        "data": {"order": 42, "items": ["a", "b"]},
    }


def test_webhook_id_is_stable_across_retries_and_the_timestamp_is_now() -> None:
    first, _ = build_request(message(attempt=1), SECRET, {}, NOW)
    retry, body = build_request(message(attempt=2), SECRET, {}, NOW + 90)
    assert retry["webhook-id"] == first["webhook-id"]
    assert retry["webhook-timestamp"] == str(NOW + 90)
    assert retry["webhook-signature"] != first["webhook-signature"]
    assert verify(SECRET, retry, body)


def test_build_request_without_a_secret_sends_no_signature() -> None:
    headers, _ = build_request(message(), None, {}, NOW)
    assert "webhook-signature" not in headers
    assert headers["webhook-id"] == str(message().delivery_id)


def test_build_request_does_not_change_the_callers_headers() -> None:
    given = {"x-team": "billing"}
    build_request(message(), SECRET, given, NOW)
    assert given == {"x-team": "billing"}


# -- classifying answers ------------------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 201, 204])
def test_2xx_is_a_receipt(status: int) -> None:
    assert classify(status, None, "ok", NOW) == Receipt(status_code=status, response_excerpt="ok")


def test_an_empty_answer_has_no_excerpt() -> None:
    assert classify(204, None, "", NOW) == Receipt(status_code=204, response_excerpt=None)


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503])
def test_retriable_statuses(status: int) -> None:
    with pytest.raises(RetriableError) as info:
        classify(status, None, "busy", NOW)
    assert info.value.status_code == status
    assert info.value.retry_after is None
    assert str(info.value) == f"HTTP {status}: busy"


def test_retry_after_in_seconds_is_honoured() -> None:
    with pytest.raises(RetriableError) as info:
        classify(429, "120", "", NOW)
    assert info.value.retry_after == 120.0


def test_retry_after_as_an_http_date_is_honoured() -> None:
    when = format_datetime(datetime.fromtimestamp(NOW + 300, UTC), usegmt=True)
    with pytest.raises(RetriableError) as info:
        classify(503, when, "", NOW)
    assert info.value.retry_after == 300.0


@pytest.mark.parametrize(
    "status",
    [
        400,  # bad request
        401,  # unauthorised
        404,  # not found
        410,  # gone: the receiver asks us to stop
        422,  # unprocessable
        301,  # a redirect is never followed ...
        302,  # ... so it is a configuration problem, not a transient one
    ],
)
def test_permanent_statuses(status: int) -> None:
    with pytest.raises(PermanentError) as info:
        classify(status, "5", "nope", NOW)
    assert info.value.status_code == status
    assert not isinstance(info.value, RetriableError)


def test_the_error_excerpt_is_short() -> None:
    with pytest.raises(PermanentError) as info:
        classify(400, None, "x" * 5000, NOW)
    assert str(info.value) == "HTTP 400: " + "x" * 200


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),  # no header
        ("", None),  # empty header
        ("0", 0.0),  # seconds
        ("30", 30.0),
        (" 30 ", 30.0),  # whitespace around it
        ("Tue, 14 Nov 2023 22:13:20 GMT", 0.0),  # a date that is NOW
        ("Tue, 14 Nov 2023 22:14:20 GMT", 60.0),  # a date a minute after NOW
        ("Mon, 13 Nov 2023 22:13:20 GMT", 0.0),  # a day before NOW: never negative
        ("soon", None),  # nonsense
        ("-5", None),  # negative seconds are not a valid delay
        ("1.5", None),  # nor fractions (delta-seconds is an integer)
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, NOW) == expected


# -- URL checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",  # not http(s)
        "file:///etc/passwd",  # not http(s)
        "https://user:pass@example.com/hook",  # user info
        "https://user@example.com/hook",  # user info without a password
        "https://example.com/" + "a" * 2048,  # longer than 2048 characters
        "https:///hook",  # no host
        "https://example.com:99999/",  # a port out of range
        "http://127.0.0.1/hook",  # loopback
        "http://127.1.2.3:8080/",  # loopback, all of 127/8
        "http://10.0.0.5/hook",  # private
        "http://192.168.1.1/hook",  # private
        "http://172.16.0.1/hook",  # private
        "http://169.254.169.254/latest/meta-data",  # link-local (cloud metadata)
        "http://[::1]/hook",  # IPv6 loopback
        "http://[::ffff:127.0.0.1]/hook",  # IPv4-mapped loopback
        "http://[fe80::1]/hook",  # IPv6 link-local
        "http://[fd00::1]/hook",  # IPv6 unique local
        "http://0.0.0.0/hook",  # unspecified
        "http://localhost/hook",  # the loopback name
        "http://LOCALHOST:8080/hook",  # in any case
        "http://api.localhost/hook",  # a .localhost name
    ],
)
def test_validate_url_refuses(url: str) -> None:
    with pytest.raises(InvalidChannelConfig) as info:
        validate_url(url, allow_private_networks=False)
    assert info.value.field == "config.url"


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com",
        "https://example.com/hook?x=1",
        "http://example.com:8080/hook",
        "https://93.184.216.34/hook",  # a public literal address
        "https://[2606:2800:220:1:248:1893:25c8:1946]/hook",  # a public IPv6 literal
    ],
)
def test_validate_url_allows_public_destinations(url: str) -> None:
    validate_url(url, allow_private_networks=False)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/hook",
        "http://10.0.0.5/hook",
        "http://192.168.1.1/hook",
        "http://169.254.169.254/",
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://localhost:8080/hook",
    ],
)
def test_validate_url_allows_private_destinations_when_configured(url: str) -> None:
    validate_url(url, allow_private_networks=True)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "https://user:pass@example.com/hook",
        "https://example.com/" + "a" * 2048,
    ],
)
def test_allowing_private_networks_does_not_allow_everything(url: str) -> None:
    with pytest.raises(InvalidChannelConfig):
        validate_url(url, allow_private_networks=True)


# -- channel config -----------------------------------------------------------------------------


@pytest.fixture
def adapter() -> WebhookAdapter:
    return WebhookAdapter(timeout_seconds=5, allow_private_networks=False)


def refused(adapter: WebhookAdapter, config: dict[str, Any]) -> InvalidChannelConfig:
    with pytest.raises(InvalidChannelConfig) as info:
        adapter.prepare_config(config)
    return info.value


def test_prepare_config_fills_in_defaults(adapter: WebhookAdapter) -> None:
    cfg = adapter.prepare_config({"url": "https://example.com/hook"})
    assert cfg["url"] == "https://example.com/hook"
    assert cfg["headers"] == {}
    assert set(cfg) == {"url", "secret", "headers"}


def test_a_generated_secret_is_whsec_and_base64_of_32_bytes(adapter: WebhookAdapter) -> None:
    secret = adapter.prepare_config({"url": "https://example.com/hook"})["secret"]
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) == 32
    again = adapter.prepare_config({"url": "https://example.com/hook"})["secret"]
    assert again != secret


def test_a_good_given_secret_is_kept(adapter: WebhookAdapter) -> None:
    cfg = adapter.prepare_config({"url": "https://example.com/hook", "secret": SECRET})
    assert cfg["secret"] == SECRET


@pytest.mark.parametrize(
    "secret",
    [
        "not-a-secret",  # no prefix, not base64
        "whsec_!!!notbase64!!!",  # prefix, not base64
        base64.b64encode(bytes(32)).decode(),  # base64 of 32 bytes, but no prefix
        "whsec_" + base64.b64encode(bytes(8)).decode(),  # too short
        "whsec_" + base64.b64encode(bytes(100)).decode(),  # too long
        "whsec_",  # empty
    ],
)
def test_a_bad_given_secret_is_refused(adapter: WebhookAdapter, secret: str) -> None:
    error = refused(adapter, {"url": "https://example.com/hook", "secret": secret})
    assert error.field == "config.secret"


def test_user_headers_are_kept(adapter: WebhookAdapter) -> None:
    cfg = adapter.prepare_config(
        {"url": "https://example.com/hook", "headers": {"Authorization": "Bearer x", "X-A": "b"}}
    )
    assert cfg["headers"] == {"Authorization": "Bearer x", "X-A": "b"}


@pytest.mark.parametrize(
    "name",
    [
        "webhook-id",  # the Standard Webhooks headers are ours
        "webhook-signature",
        "Webhook-Timestamp",  # in any case
        "webhook-anything",
        "host",  # HTTP's own
        "Host",
        "content-length",
        "transfer-encoding",
        "connection",
    ],
)
def test_reserved_header_names_are_refused(adapter: WebhookAdapter, name: str) -> None:
    error = refused(adapter, {"url": "https://example.com/hook", "headers": {name: "x"}})
    assert error.field == f"config.headers.{name}"


@pytest.mark.parametrize("value", ["a\r\nX-Evil: 1", "a\nb", "a\rb", "a\0b"])
def test_cr_or_lf_in_a_header_value_is_refused(adapter: WebhookAdapter, value: str) -> None:
    error = refused(adapter, {"url": "https://example.com/hook", "headers": {"X-A": value}})
    assert error.field == "config.headers.X-A"


@pytest.mark.parametrize("name", ["X A", "X:A", "X\r\nA", ""])
def test_an_invalid_header_name_is_refused(adapter: WebhookAdapter, name: str) -> None:
    error = refused(adapter, {"url": "https://example.com/hook", "headers": {name: "x"}})
    assert error.field == f"config.headers.{name}"


def test_a_private_url_is_refused_unless_allowed() -> None:
    strict = WebhookAdapter(timeout_seconds=5, allow_private_networks=False)
    assert refused(strict, {"url": "http://10.0.0.1/hook"}).field == "config.url"
    lenient = WebhookAdapter(timeout_seconds=5, allow_private_networks=True)
    assert lenient.prepare_config({"url": "http://10.0.0.1/hook"})["url"] == "http://10.0.0.1/hook"


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({}, "url"),  # missing url
        ({"url": "https://example.com/hook", "foo": 1}, "foo"),  # unknown key
        ({"url": 5}, "url"),  # wrong type
    ],
)
def test_a_malformed_config_is_refused_and_the_message_names_the_key(
    adapter: WebhookAdapter, config: dict[str, Any], key: str
) -> None:
    error = refused(adapter, config)
    assert key in str(error)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({}, "config.url"),  # missing url
        ({"url": "https://example.com/hook", "foo": 1}, "config.foo"),  # unknown key
        ({"url": 5}, "config.url"),  # wrong type
    ],
    ids=["missing-url", "unknown-key", "wrong-type"],
)
def test_a_malformed_config_error_field_names_the_key(
    adapter: WebhookAdapter, config: dict[str, Any], field: str
) -> None:
    # InvalidChannelConfig: "``field`` names the offending key (e.g. ``config.url``)"
    assert refused(adapter, config).field == field
