"""Webhook adapter, the sans-io parts: signing, the request, classifying answers, config."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import re
import time
import uuid
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest
import standardwebhooks
import trio

from notifier.adapters.base import (
    ChannelValidator,
    ChecksDestination,
    InvalidChannelConfig,
    NamesDestinations,
    Receipt,
    UpdatesConfig,
    channel_destination,
    destination_of,
    public_config,
)
from notifier.adapters.webhook import (
    WebhookAdapter,
    WebhookChannels,
    build_request,
    check_address,
    classify,
    generate_secret,
    literal_address,
    parse_retry_after,
    rotate_secret,
    sign,
    signing_secrets,
    validate_url,
)
from notifier.errors import PermanentError, RetriableError
from notifier.messages import WorkerMessage
from notifier.testing import worker_message

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NOW = 1_700_000_000


def message(**changes: Any) -> WorkerMessage:
    return worker_message(**{
        "delivery_id": uuid.UUID("0b7c8f4e-2f4b-4f8e-9a53-6a1c2d3e4f50"),
        "channel_config": {"url": "https://example.com/hook", "secret": SECRET},
        "payload": {"order": 42, "items": ["a", "b"]},
        "created_at": datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
        **changes,
    })  # fmt: skip


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
        "http://169.254.169.1/",
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://localhost:8080/hook",
    ],
)
def test_validate_url_allows_private_destinations_when_configured(url: str) -> None:
    validate_url(url, allow_private_networks=True)


@pytest.mark.parametrize(
    ("ip", "reason"),
    [
        ("169.254.169.254", "cloud metadata"),  # AWS, GCP, Azure, Oracle ... IMDS
        ("169.254.170.2", "container metadata"),  # ECS task credentials
        ("169.254.170.23", "container metadata"),  # EKS Pod Identity
        ("100.100.100.200", "cloud metadata"),  # Alibaba Cloud
        ("168.63.129.16", "cloud metadata"),  # Azure WireServer (a public address)
        ("fd00:ec2::254", "cloud metadata"),  # AWS IMDS over IPv6
        ("fd00:ec2::23", "container metadata"),  # EKS Pod Identity over IPv6
        ("::ffff:169.254.169.254", "cloud metadata"),  # IPv4-mapped: the IPv4 address
        ("::ffff:168.63.129.16", "cloud metadata"),
        ("::ffff:169.254.170.23", "container metadata"),
        ("64:ff9b::a9fe:a9fe", "NAT64 of 169.254.169.254, cloud metadata"),
        ("64:ff9b::a83f:8110", "NAT64 of 168.63.129.16, cloud metadata"),
        ("64:ff9b::a9fe:aa17", "NAT64 of 169.254.170.23, container metadata"),
        ("2002:a9fe:a9fe::1", "6to4 of 169.254.169.254, cloud metadata"),
        ("2002:a83f:8110::", "6to4 of 168.63.129.16, cloud metadata"),
        ("::a9fe:a9fe", "IPv4-compatible of 169.254.169.254, cloud metadata"),
    ],
)
def test_closed_addresses_stay_closed_whatever_the_settings(ip: str, reason: str) -> None:
    assert check_address(ip, False, ()) == reason
    assert check_address(ip, True, ()) == reason
    literal = f"[{ip}]" if ":" in ip else ip
    with pytest.raises(InvalidChannelConfig, match=re.escape(reason)) as info:
        validate_url(f"http://{literal}/latest/meta-data", allow_private_networks=True)
    assert "always closed" in str(info.value)
    # not even an allowed_cidrs entry that names the address exactly opens it
    destination = ipaddress.ip_address(ip)
    if isinstance(destination, ipaddress.IPv6Address) and destination.ipv4_mapped:
        destination = destination.ipv4_mapped  # what is dialed
    for cidrs in [(ipaddress.ip_network(destination),), ("0.0.0.0/0", "::/0")]:
        assert check_address(ip, True, cidrs) == reason
        assert check_address(ip, False, cidrs) == reason


@pytest.mark.parametrize(
    "ip",
    [
        "169.254.169.253",  # beside the metadata endpoint: link-local, opened by the settings
        "168.63.129.17",  # beside Azure's: an ordinary public address
        "fd00:ec2::22",  # beside EKS Pod Identity's: unique local
    ],
)
def test_neighbours_of_closed_addresses_follow_the_settings(ip: str) -> None:
    assert check_address(ip, True, ()) is None
    assert check_address(ip, False, (ipaddress.ip_network(ip),)) is None


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
def adapter() -> WebhookChannels:
    return WebhookChannels(timeout_seconds=5, allow_private_networks=False)


def refused(adapter: WebhookChannels, config: dict[str, Any]) -> InvalidChannelConfig:
    with pytest.raises(InvalidChannelConfig) as info:
        adapter.prepare_config(config)
    return info.value


def test_prepare_config_fills_in_defaults(adapter: WebhookChannels) -> None:
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


def test_a_good_given_secret_is_kept(adapter: WebhookChannels) -> None:
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
def test_a_bad_given_secret_is_refused(adapter: WebhookChannels, secret: str) -> None:
    error = refused(adapter, {"url": "https://example.com/hook", "secret": secret})
    assert error.field == "config.secret"


def test_user_headers_are_kept(adapter: WebhookChannels) -> None:
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
def test_reserved_header_names_are_refused(adapter: WebhookChannels, name: str) -> None:
    error = refused(adapter, {"url": "https://example.com/hook", "headers": {name: "x"}})
    assert error.field == f"config.headers.{name}"


def test_a_private_url_is_refused_unless_allowed() -> None:
    strict = WebhookChannels(timeout_seconds=5, allow_private_networks=False)
    assert refused(strict, {"url": "http://10.0.0.1/hook"}).field == "config.url"
    lenient = WebhookChannels(timeout_seconds=5, allow_private_networks=True)
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
    adapter: WebhookChannels, config: dict[str, Any], key: str
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
    adapter: WebhookChannels, config: dict[str, Any], field: str
) -> None:
    # InvalidChannelConfig: "``field`` names the offending key (e.g. ``config.url``)"
    assert refused(adapter, config).field == field


# -- the standardwebhooks package agrees --------------------------------------------------------

VECTOR = {
    "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "msg_id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
    "timestamp": 1614265330,
    "payload": '{"test": 2432232314}',
    "signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
}


def test_the_published_test_vector_is_what_the_standardwebhooks_package_signs() -> None:
    theirs = standardwebhooks.Webhook(VECTOR["secret"]).sign(
        VECTOR["msg_id"], datetime.fromtimestamp(VECTOR["timestamp"], UTC), VECTOR["payload"]
    )
    ours = sign(VECTOR["secret"], VECTOR["msg_id"], VECTOR["timestamp"], VECTOR["payload"].encode())
    assert ours == theirs == VECTOR["signature"]


def test_a_request_verifies_with_the_standardwebhooks_package() -> None:
    headers, body = build_request(message(), SECRET, {"x-team": "billing"}, int(time.time()))
    assert standardwebhooks.Webhook(SECRET).verify(body, headers) == json.loads(body)


def test_a_request_signed_with_another_secret_does_not_verify() -> None:
    headers, body = build_request(message(), generate_secret(), {}, int(time.time()))
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(SECRET).verify(body, headers)


# -- secret rotation ----------------------------------------------------------------------------

OLD = "whsec_" + base64.b64encode(b"o" * 32).decode()
NEW = "whsec_" + base64.b64encode(b"n" * 32).decode()


def test_during_a_rotation_both_signatures_are_sent_and_each_verifies_alone() -> None:
    headers, body = build_request(message(), [NEW, OLD], {}, int(time.time()))
    first, second = headers["webhook-signature"].split(" ")
    for secret in (NEW, OLD):  # a receiver with either secret accepts the request
        standardwebhooks.Webhook(secret).verify(body, headers)
    for signature, secret, other in ((first, NEW, OLD), (second, OLD, NEW)):
        alone = {**headers, "webhook-signature": signature}
        standardwebhooks.Webhook(secret).verify(body, alone)
        with pytest.raises(standardwebhooks.WebhookVerificationError):
            standardwebhooks.Webhook(other).verify(body, alone)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"secret": NEW}, [NEW]),  # no rotation
        (
            {"secret": NEW, "previous_secret": OLD, "previous_secret_expires_at": NOW + 1},
            [NEW, OLD],
        ),
        ({"secret": NEW, "previous_secret": OLD, "previous_secret_expires_at": NOW}, [NEW]),  # over
        ({"secret": NEW, "previous_secret": OLD, "previous_secret_expires_at": NOW - 9}, [NEW]),
        ({"secret": NEW, "previous_secret": OLD}, [NEW]),  # no expiry: not used
        ({"secret": NEW, "previous_secret": OLD, "previous_secret_expires_at": "x"}, [NEW]),
        ({"secret": NEW, "previous_secret": NEW, "previous_secret_expires_at": NOW + 1}, [NEW]),
        ({}, []),  # no secret at all: unsigned
    ],
)
def test_signing_secrets(config: dict[str, Any], expected: list[str]) -> None:
    assert signing_secrets(config, NOW) == expected


@pytest.mark.parametrize(
    ("stored", "new", "expected"),
    [
        # a new secret: the replaced one signs along for the grace period
        ({"secret": OLD}, NEW, {"previous_secret": OLD, "previous_secret_expires_at": NOW + 60}),
        # the same secret (a PATCH of something else): nothing to keep
        ({"secret": NEW}, NEW, {}),
        # the same secret during a rotation: the previous one keeps its expiry
        (
            {"secret": NEW, "previous_secret": OLD, "previous_secret_expires_at": NOW + 5},
            NEW,
            {"previous_secret": OLD, "previous_secret_expires_at": NOW + 5},
        ),
        # ... unless it has expired
        ({"secret": NEW, "previous_secret": OLD, "previous_secret_expires_at": NOW}, NEW, {}),
        # rotating again: only the latest replaced secret is kept
        (
            {"secret": NEW, "previous_secret": OLD, "previous_secret_expires_at": NOW + 5},
            SECRET,
            {"previous_secret": NEW, "previous_secret_expires_at": NOW + 60},
        ),
        # rotating back to the previous secret: the one it replaces becomes the previous
        (
            {"secret": NEW, "previous_secret": OLD, "previous_secret_expires_at": NOW + 5},
            OLD,
            {"previous_secret": NEW, "previous_secret_expires_at": NOW + 60},
        ),
        ({}, NEW, {}),  # nothing stored before
    ],
)
def test_rotate_secret(stored: dict[str, Any], new: str, expected: dict[str, Any]) -> None:
    assert rotate_secret(stored, new, now=NOW, grace_seconds=60) == expected


def test_without_a_grace_period_a_replaced_secret_stops_at_once() -> None:
    assert rotate_secret({"secret": OLD}, NEW, now=NOW, grace_seconds=0) == {}


def rotating_adapter(grace: float = 60) -> WebhookChannels:
    return WebhookChannels(
        timeout_seconds=5, allow_private_networks=False, secret_rotation_grace_seconds=grace,
        clock=lambda: float(NOW),
    )  # fmt: skip


def test_the_webhook_adapter_takes_part_in_patches_and_destination_checks() -> None:
    adapter: ChannelValidator = rotating_adapter()
    assert isinstance(adapter, UpdatesConfig)
    assert isinstance(adapter, ChecksDestination)
    assert {"secret", "previous_secret", "previous_secret_expires_at"} <= adapter.secret_fields


@pytest.mark.parametrize(
    ("url", "destination"),
    [
        ("https://example.com/hook", "https://example.com:443"),
        ("http://example.com/a?b=c", "http://example.com:80"),
        ("HTTPS://Example.COM:8443/x", "https://example.com:8443"),  # as dialed: lowercased
        ("https://bücher.example/in", "https://xn--bcher-kva.example:443"),  # IDNA-mapped
        ("http://[::1]:8080/", "http://[::1]:8080"),
        ("http://10.1.2.3/", "http://10.1.2.3:80"),
        # no origin to send to: the channel's own destination
        ("ftp://example.com/", None),
        ("not a url", None),
    ],
)
def test_a_stored_config_names_the_destination_its_messages_go_to(
    url: str, destination: str | None
) -> None:
    validator = WebhookChannels(
        timeout_seconds=1, allow_private_networks=True, secret_rotation_grace_seconds=60
    )
    assert isinstance(validator, NamesDestinations)
    message = worker_message(1, channel_config={"url": url})
    adapter = WebhookAdapter(timeout_seconds=1, allow_private_networks=True)
    own = f"channel:{message.channel_id}"
    assert validator.config_destination({"url": url}) == destination
    # the API finds a channel's circuit by the key the worker keeps it under
    key = channel_destination(validator, message.channel_id, {"url": url})
    assert key == destination_of(adapter, message) == (destination or own)


def test_a_patch_with_a_new_secret_keeps_the_old_one_for_the_grace_period() -> None:
    adapter = rotating_adapter()
    stored = adapter.prepare_config({"url": "https://example.com/hook", "secret": OLD})
    patched = adapter.prepare_config_update({"url": "https://example.com/hook", "secret": NEW},
                                            stored)  # fmt: skip
    assert patched == {
        "url": "https://example.com/hook", "secret": NEW, "headers": {},
        "previous_secret": OLD, "previous_secret_expires_at": NOW + 60,
    }  # fmt: skip
    assert signing_secrets(patched, NOW + 59) == [NEW, OLD]
    assert signing_secrets(patched, NOW + 60) == [NEW]
    assert public_config(adapter, patched) == {"url": "https://example.com/hook", "headers": {}}


def test_a_patch_that_carries_the_secret_fields_over_keeps_the_rotation() -> None:
    # What the API does: stored secret fields are copied into the PATCH body where absent.
    adapter = rotating_adapter()
    stored = {
        "url": "https://example.com/hook", "secret": NEW, "headers": {},
        "previous_secret": OLD, "previous_secret_expires_at": NOW + 30,
    }  # fmt: skip
    body = {"url": "https://example.com/other", "headers": {"x-a": "b"}}
    carried = {**body, **{k: stored[k] for k in adapter.secret_fields if k in stored}}
    patched = adapter.prepare_config_update(carried, stored)
    assert patched["url"] == "https://example.com/other"
    assert patched["secret"] == NEW
    assert patched["previous_secret"] == OLD
    assert patched["previous_secret_expires_at"] == NOW + 30


@pytest.mark.parametrize(
    ("key", "value"),
    [("previous_secret", NEW), ("previous_secret_expires_at", NOW + 10**9)],
)
def test_a_client_cannot_set_the_rotation_fields(key: str, value: Any) -> None:
    adapter = rotating_adapter()
    stored = adapter.prepare_config({"url": "https://example.com/hook", "secret": OLD})
    body = {"url": "https://example.com/hook", "secret": NEW, key: value}
    with pytest.raises(InvalidChannelConfig) as info:  # at a PATCH
        adapter.prepare_config_update(body, stored)
    assert info.value.field == f"config.{key}"
    with pytest.raises(InvalidChannelConfig) as info:  # nor at create
        adapter.prepare_config(body)
    assert info.value.field == f"config.{key}"


def test_a_patch_cannot_ask_for_a_generated_secret_it_would_never_show() -> None:
    adapter = rotating_adapter()
    stored = adapter.prepare_config({"url": "https://example.com/hook", "secret": OLD})
    with pytest.raises(InvalidChannelConfig) as info:
        adapter.prepare_config_update({"url": "https://example.com/hook", "secret": None}, stored)
    assert info.value.field == "config.secret"


# -- more of classifying ------------------------------------------------------------------------


def test_410_disables_the_channel() -> None:
    with pytest.raises(PermanentError) as info:
        classify(410, None, "gone", NOW)
    assert info.value.disable_channel
    assert info.value.status_code == 410


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 301, 302, 307, 308])
def test_other_permanent_statuses_leave_the_channel_enabled(status: int) -> None:
    with pytest.raises(PermanentError) as info:
        classify(status, None, "", NOW)
    assert not info.value.disable_channel


@pytest.mark.parametrize("status", [300, 301, 302, 303, 304, 307, 308])
def test_a_redirect_is_a_permanent_failure_that_says_so(status: int) -> None:
    with pytest.raises(PermanentError) as info:
        classify(status, "5", "moved", NOW, location="https://elsewhere.example/hook")
    assert not isinstance(info.value, RetriableError)
    assert "redirect to https://elsewhere.example/hook not followed" in str(info.value)


@pytest.mark.parametrize("status", [504, 599])
def test_every_5xx_is_retriable(status: int) -> None:
    with pytest.raises(RetriableError):
        classify(status, None, "", NOW)


@pytest.mark.parametrize("status", [100, 101, 600, 999])
def test_statuses_outside_the_known_classes_are_permanent(status: int) -> None:
    with pytest.raises(PermanentError) as info:
        classify(status, None, "", NOW)
    assert not isinstance(info.value, RetriableError)


def test_a_retry_after_date_is_honoured_on_a_429() -> None:
    when = format_datetime(datetime.fromtimestamp(NOW + 42, UTC), usegmt=True)
    with pytest.raises(RetriableError) as info:
        classify(429, when, "", NOW)
    assert info.value.retry_after == 42.0


# -- user headers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "Content-Length", "CONTENT-LENGTH", "Transfer-Encoding", "Content-Type", "Connection",
        "Keep-Alive", "TE", "Trailer", "Upgrade", "Proxy-Authorization", "Proxy-Authenticate",
        "Proxy-Connection", "HOST", "Webhook-Signature", "WEBHOOK-ID",
    ],
)  # fmt: skip
def test_hop_by_hop_and_signature_headers_are_refused_in_any_case(
    adapter: WebhookAdapter, name: str
) -> None:
    error = refused(adapter, {"url": "https://example.com/hook", "headers": {name: "x"}})
    assert error.field == f"config.headers.{name}"


def test_a_user_header_cannot_duplicate_ours_in_another_case() -> None:
    headers, _ = build_request(
        message(), SECRET, {"User-Agent": "mine", "Accept-Encoding": "gzip", "X-A": "b"}, NOW
    )
    lowered = [k.lower() for k in headers]
    assert len(lowered) == len(set(lowered))
    assert headers["user-agent"] == "notifier"
    assert headers["X-A"] == "b"


# -- the address check --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ip", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.0.1", "private"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.255", "carrier-grade NAT"),
        ("169.254.169.254", "cloud metadata"),
        ("169.254.1.1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "broadcast"),
        ("192.0.2.1", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("198.18.0.1", "benchmarking"),
        ("198.19.255.255", "benchmarking"),
        ("192.0.0.8", "IETF protocol assignment"),
        ("192.88.99.1", "6to4 relay anycast"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped: judged as the IPv4 address
        ("::ffff:7f00:1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:169.254.169.254", "cloud metadata"),
        ("::127.0.0.1", "IPv4-compatible"),
        ("::a00:1", "IPv4-compatible"),
        ("::ffff:0:7f00:1", "reserved"),  # IPv4-translated
        ("64:ff9b::7f00:1", "NAT64 of 127.0.0.1, loopback"),
        ("64:ff9b::a00:1", "NAT64 of 10.0.0.1, private"),
        ("64:ff9b::a9fe:a9fe", "NAT64 of 169.254.169.254, cloud metadata"),
        ("64:ff9b:1::808:808", "local-use NAT64"),
        ("2002:7f00:1::1", "6to4 of 127.0.0.1, loopback"),
        ("2002:a00:1::", "6to4 of 10.0.0.1, private"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
        ("2001:db8::1", "documentation"),
        ("3fff::1", "documentation"),
        ("2001:2::1", "benchmarking"),
        ("2001:10::1", "IETF protocol assignment"),
        ("fd00:ec2::254", "cloud metadata"),
        ("fc00::1", "unique local"),
        ("fd12:3456::1", "unique local"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("ff05::1:3", "multicast"),
        ("100::1", "discard-only"),
        ("4000::1", "reserved"),
        ("not-an-ip", "not an IP address"),
        ("", "not an IP address"),
    ],
)
def test_check_address_blocks(ip: str, reason: str) -> None:
    got = check_address(ip, False, ())
    assert got is not None
    assert reason in got
    # allow_private_networks opens all of them but the metadata endpoints and non-addresses
    kept = "metadata" in reason or reason == "not an IP address"
    assert check_address(ip, True, ()) == (got if kept else None)


@pytest.mark.parametrize(
    "ip",
    [
        "93.184.216.34",
        "8.8.8.8",
        "1.1.1.1",
        "100.63.255.255",  # just below CGNAT
        "100.128.0.0",  # just above
        "172.32.0.1",  # just outside 172.16/12
        "::ffff:8.8.8.8",
        "2606:4700:4700::1111",
        "2a00:1450:4001::200e",
        "64:ff9b::808:808",  # NAT64 of a public address
        "2002:808:808::1",  # 6to4 of a public address
    ],
)
def test_check_address_allows_public_addresses(ip: str) -> None:
    assert check_address(ip, False, ()) is None


@pytest.mark.parametrize(
    ("cidrs", "ip", "allowed"),
    [
        (("10.0.0.0/8",), "10.1.2.3", True),
        (("10.0.0.0/8",), "::ffff:10.1.2.3", True),  # the same destination
        (("10.0.0.0/8",), "192.168.0.1", False),
        (("10.0.0.0/8",), "64:ff9b::a00:1", False),  # exact: NAT64 forms are not opened
        (("10.0.0.0/8",), "169.254.169.254", False),
        (("127.0.0.1/32",), "127.0.0.1", True),
        (("127.0.0.1/32",), "127.0.0.2", False),
        (("fd00::/8",), "fd00::1", True),
        (("fd00::/8",), "fc00::1", False),
        ((ipaddress.ip_network("10.0.0.0/8"),), "10.0.0.1", True),  # parsed networks too
    ],
)
def test_allowed_cidrs_open_exactly_their_networks(
    cidrs: tuple[Any, ...], ip: str, allowed: bool
) -> None:
    assert (check_address(ip, False, cidrs) is None) is allowed


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),  # decimal
        ("0x7f000001", "127.0.0.1"),  # hex
        ("0x7f.1", "127.0.0.1"),  # hex, two parts
        ("017700000001", "127.0.0.1"),  # octal
        ("0177.0.0.1", "127.0.0.1"),  # octal part
        ("127.1", "127.0.0.1"),  # short form
        ("0", "0.0.0.0"),
        ("93.184.216.34.", "93.184.216.34"),  # trailing dot
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("example.com", None),
        ("1example.com", None),
        ("xn--bcher-kva.de", None),
    ],
)
def test_literal_address(host: str, expected: str | None) -> None:
    got = literal_address(host)
    assert (None if got is None else str(got)) == expected


@pytest.mark.parametrize("host", ["example.123", "256.1.1.1", "4294967296", "0x"])
def test_a_host_ending_in_a_number_must_be_a_valid_address(host: str) -> None:
    with pytest.raises(ValueError, match="not a valid IPv4 address"):
        literal_address(host)


@pytest.mark.parametrize(
    "url",
    [
        "http://2130706433/hook",  # 127.0.0.1 in decimal
        "http://0x7f.1/hook",  # ... in hex
        "http://0x7f000001/hook",
        "http://017700000001/hook",  # ... in octal
        "http://0177.0.0.1/hook",
        "http://127.1/hook",
        "http://0/hook",  # 0.0.0.0
        "http://[::]/hook",
        "http://[::ffff:7f00:1]/hook",  # IPv4-mapped, hex
        "http://[::127.0.0.1]/hook",  # IPv4-compatible
        "http://[64:ff9b::a00:1]/hook",  # NAT64 of 10.0.0.1
        "http://[64:ff9b::7f00:1]/hook",  # NAT64 of 127.0.0.1
        "http://[2002:7f00:1::1]/hook",  # 6to4 of 127.0.0.1
        "http://[fd00:ec2::254]/latest/meta-data/",  # the IPv6 metadata address
        "http://[ff02::1]/hook",  # multicast
        "http://100.64.0.1/hook",  # CGNAT
        "http://198.18.0.1/hook",  # benchmarking
        "http://224.0.0.1/hook",  # multicast
        "http://255.255.255.255/hook",  # broadcast
        "http://192.0.2.1/hook",  # documentation
        "http://localhost./hook",  # the loopback name, fully qualified
        "http://api.localhost./hook",
        "http://example.123/hook",  # ends in a number, not an address
        "http://exa mple.com/hook",  # not a host httpx accepts
    ],
)
def test_validate_url_refuses_blocked_literals_in_every_notation(url: str) -> None:
    with pytest.raises(InvalidChannelConfig) as info:
        validate_url(url, allow_private_networks=False)
    assert info.value.field == "config.url"


def test_a_blocked_literal_says_why() -> None:
    with pytest.raises(InvalidChannelConfig) as info:
        validate_url("http://0x7f.1/hook", allow_private_networks=False)
    assert info.value.message.startswith(
        "destination blocked: 0x7f.1 is 127.0.0.1, a loopback address"
    )
    with pytest.raises(InvalidChannelConfig) as info:
        validate_url("http://127.0.0.1/hook", allow_private_networks=False)
    assert info.value.message.startswith("destination blocked: 127.0.0.1 is a loopback address")


def test_allowed_cidrs_open_a_literal_at_create() -> None:
    validate_url("http://10.0.0.5/hook", allow_private_networks=False,
                 allowed_cidrs=["10.0.0.0/8"])  # fmt: skip
    with pytest.raises(InvalidChannelConfig):
        validate_url("http://10.0.0.5/hook", allow_private_networks=False,
                     allowed_cidrs=["10.0.1.0/24"])  # fmt: skip
    adapter = WebhookChannels(timeout_seconds=5, allow_private_networks=False,
                              allowed_cidrs=["10.0.0.0/8"])  # fmt: skip
    assert adapter.prepare_config({"url": "http://10.0.0.5/hook"})["url"] == "http://10.0.0.5/hook"


# -- what a tenant reads about a refused destination --------------------------------------------


def answering(addresses: tuple[str, ...]) -> Any:
    async def resolve(host: str, port: int) -> tuple[str, ...]:
        await trio.lowlevel.checkpoint()
        return addresses

    return resolve


@pytest.mark.parametrize(
    ("addresses", "allow_private", "text"),
    [
        (("10.0.0.7",), False, "internal.example resolves to a private address (set "),
        (("93.184.216.34", "169.254.169.254"), False,
         "internal.example resolves to a cloud metadata address (metadata and credential "
         "endpoints are always closed)"),
        (("169.254.169.254",), True,
         "internal.example resolves to a cloud metadata address (metadata"),
        (("fd00:ec2::23",), True, "internal.example resolves to a container metadata address"),
        (("64:ff9b::a9fe:a9fe",), True,
         "internal.example resolves to a cloud metadata (NAT64) address"),
        (("64:ff9b::a00:7",), False, "internal.example resolves to a private (NAT64) address"),
    ],
)  # fmt: skip
async def test_a_refused_name_is_told_without_the_address_it_resolves_to(
    addresses: tuple[str, ...], allow_private: bool, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = "https://internal.example/hook"
    validator = WebhookChannels(
        timeout_seconds=5, allow_private_networks=allow_private, resolver=answering(addresses)
    )
    with pytest.raises(InvalidChannelConfig) as created:
        await validator.check_destination({"url": url})
    adapter = WebhookAdapter(
        timeout_seconds=5, allow_private_networks=allow_private, resolver=answering(addresses)
    )
    with pytest.raises(PermanentError) as delivered:
        await adapter.deliver(message(channel_config={"url": url}))
    for told in (created.value.message, str(delivered.value)):
        assert told.startswith(f"destination blocked: {text}")
        for address in addresses:
            assert address not in told
        assert "10.0.0.7" not in told  # nor the address a NAT64 form embeds
        assert "169.254.169.254" not in told
    # the operator's log has the address, from create and from delivery
    logged = [r.getMessage() for r in caplog.records if r.name == "notifier.webhook"]
    assert len(logged) == 2
    assert all("internal.example resolves to" in line for line in logged)
    assert all(any(a in line for a in addresses) for line in logged)


async def test_a_literal_address_the_tenant_wrote_is_named() -> None:
    adapter = WebhookAdapter(timeout_seconds=5, allow_private_networks=True)
    with pytest.raises(PermanentError) as info:
        await adapter.deliver(message(channel_config={"url": "http://168.63.129.16/machine"}))
    assert str(info.value) == (
        "destination blocked: 168.63.129.16 is a cloud metadata address (metadata and "
        "credential endpoints are always closed)"
    )
