"""Telegram adapter without a network: config, text and request building, classifying Bot API
answers, keeping the bot token out of errors and logs, and the per-chat/per-tenant/per-bot rate
limits (the buckets it names, taken from in-memory shared buckets under trio's MockClock).
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime
from typing import Any, NamedTuple

import httpx
import pytest
import trio
import trio.testing

from notifier.adapters.base import InvalidChannelConfig, RateLimiter, Receipt
from notifier.adapters.registry import build_adapters
from notifier.adapters.telegram import (
    DEFAULT_TEXT_TEMPLATE,
    MAX_TEXT_UNITS,
    TelegramAdapter,
    TelegramAdapterCrash,
    build_request,
    build_text,
    chat_key,
    classify,
    fit_text,
    scrub,
    transport_error,
    utf16_units,
)
from notifier.adapters.telegram_channels import TelegramChannels
from notifier.config import TelegramWorkersConfig, parse_config
from notifier.errors import ConfigError, PermanentError, RetriableError
from notifier.messages import WorkerMessage
from notifier.ratelimit import Bucket
from notifier.testing import worker_message
from notifier.testing.buckets import MemoryBuckets

TOKEN = "123456789:AAH-unit_test_token_do_not_leak"
BASE = "https://api.telegram.example"


def message(n: int = 1, **changes: Any) -> WorkerMessage:
    return worker_message(n, **{
        "channel_type": "telegram",
        "channel_config": {"chat_id": 4242},
        "payload": {"order": 42, "items": ["a", "b"]},
        "created_at": datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
        **changes,
    })  # fmt: skip


def to_chat(chat_id: int | str, n: int = 1) -> WorkerMessage:
    return message(n, channel_config={"chat_id": chat_id})


TENANT_A = worker_message().tenant_id  # every message's tenant unless it says otherwise
TENANT_B = uuid.UUID(int=0xB)


def of_tenant(tenant: uuid.UUID, chat_id: int | str, n: int = 1) -> WorkerMessage:
    return message(n, tenant_id=tenant, channel_config={"chat_id": chat_id})


@pytest.fixture
def adapter() -> TelegramAdapter:
    return TelegramAdapter(TOKEN, api_base_url=BASE)


# -- channel config -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "prepared"),
    [
        ({"chat_id": 123456789}, {"chat_id": 123456789}),
        ({"chat_id": -1001234567890}, {"chat_id": -1001234567890}),
        ({"chat_id": "@my_channel"}, {"chat_id": "@my_channel"}),
        ({"chat_id": "@abcde"}, {"chat_id": "@abcde"}),
        ({"chat_id": "@" + "a" * 32}, {"chat_id": "@" + "a" * 32}),
        (
            {"chat_id": 1, "text_template": "New {{ event_type }}"},
            {"chat_id": 1, "text_template": "New {{ event_type }}"},
        ),
        ({"chat_id": 1, "text_template": None}, {"chat_id": 1}),
    ],
)
def test_prepare_config_accepts(config: dict[str, Any], prepared: dict[str, Any]) -> None:
    assert TelegramChannels().prepare_config(config) == prepared


@pytest.mark.parametrize(
    ("config", "field", "says"),
    [
        ({}, "config.chat_id", "missing"),
        ({"chat_id": None}, "config.chat_id", "Expected"),
        ({"chat_id": 1.5}, "config.chat_id", "Expected"),
        ({"chat_id": True}, "config.chat_id", "Expected"),
        ({"chat_id": [1]}, "config.chat_id", "Expected"),
        ({"chat_id": 0}, "config.chat_id", "not a valid"),
        ({"chat_id": 2**53}, "config.chat_id", "not a valid"),
        ({"chat_id": "12345"}, "config.chat_id", "@channelusername"),
        ({"chat_id": "channel_name"}, "config.chat_id", "@channelusername"),
        ({"chat_id": "@abcd"}, "config.chat_id", "5 to 32"),
        ({"chat_id": "@" + "a" * 33}, "config.chat_id", "5 to 32"),
        ({"chat_id": "@bad-name"}, "config.chat_id", "@channelusername"),
        ({"chat_id": "@name\n"}, "config.chat_id", "@channelusername"),
        ({"chat_id": ""}, "config.chat_id", "@channelusername"),
        ({"chat_id": 1, "text_template": 5}, "config.text_template", "Expected"),
        ({"chat_id": 1, "text_template": "{{ oops"}, "config.text_template", "template error"),
        ({"chat_id": 1, "text_template": "x" * 20_000}, "config.text_template", "longer"),
        ({"chat_id": 1, "parse_mode": "HTML"}, "config.parse_mode", "unknown key"),
    ],
)
def test_prepare_config_refuses_naming_the_field(
    config: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(InvalidChannelConfig) as info:
        TelegramChannels().prepare_config(config)
    assert info.value.field == field
    assert says in info.value.message
    assert str(info.value).startswith(f"{field}: ")


def test_the_adapter_has_no_secret_config_fields(adapter: TelegramAdapter) -> None:
    assert adapter.channel_type == "telegram"
    assert TelegramChannels.secret_fields == frozenset()


# -- text ---------------------------------------------------------------------------------------


def test_the_default_text_is_the_event_type_and_the_readable_payload() -> None:
    text = build_text(message())
    assert text.startswith("order.created\n\n")
    assert json.loads(text.split("\n\n", 1)[1]) == {"order": 42, "items": ["a", "b"]}
    assert '\n  "items"' in text  # indented, not one long line
    assert "{{" in DEFAULT_TEXT_TEMPLATE


def test_a_channel_template_is_rendered_with_the_event() -> None:
    config = {"chat_id": 1, "text_template": "Order {{ payload.order }} ({{ event_type }})"}
    assert build_text(message(channel_config=config)) == "Order 42 (order.created)"


def test_the_template_never_sees_the_channel_config() -> None:
    config = {"chat_id": 1, "text_template": "[{{ config }}{{ channel_config }}]"}
    assert build_text(message(channel_config=config)) == "[]"


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{{ payload.order / 0 }}", "rendering failed"),
        ("{{ payload.__class__.__mro__ }}", "rendering failed"),
        ("{{ 'x' * 10000000 }}", "rendering failed"),
        ("{{ oops", "template error"),
        ("   {{ payload.missing }}  \n", "empty"),
    ],
)
def test_a_template_that_cannot_make_a_text_is_a_permanent_error(template: str, says: str) -> None:
    with pytest.raises(PermanentError) as info:
        build_text(message(channel_config={"chat_id": 1, "text_template": template}))
    assert str(info.value).startswith("config.text_template: ")
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("short", "short"),
        ("x" * MAX_TEXT_UNITS, "x" * MAX_TEXT_UNITS),
        ("x" * (MAX_TEXT_UNITS + 1), "x" * (MAX_TEXT_UNITS - 1) + "…"),
        ("é" * 5000, "é" * (MAX_TEXT_UNITS - 1) + "…"),
        # An emoji is two UTF-16 units, as Telegram counts: 2048 of them fill the limit ...
        ("😀" * 2048, "😀" * 2048),
        # ... and one more does not fit; never half an emoji (a lone surrogate).
        ("😀" * 2049, "😀" * 2047 + "…"),
        ("a" + "😀" * 2048, "a" + "😀" * 2047 + "…"),
    ],
)
def test_long_texts_are_truncated_to_telegrams_limit(text: str, expected: str) -> None:
    got = fit_text(text)
    assert got == expected
    assert utf16_units(got) <= MAX_TEXT_UNITS


def test_a_huge_payload_still_makes_a_message() -> None:
    text = build_text(message(payload={"blob": "z" * 100_000}))
    assert text.startswith("order.created\n\n")
    assert text.endswith("…")
    assert utf16_units(text) == MAX_TEXT_UNITS


# -- request ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "chat_id", "url", "body"),
    [
        (
            "https://api.telegram.org", 42,
            f"https://api.telegram.org/bot{TOKEN}/sendMessage", {"chat_id": 42, "text": "hi"},
        ),
        (
            "https://api.telegram.org/", -1001234567890,
            f"https://api.telegram.org/bot{TOKEN}/sendMessage",
            {"chat_id": -1001234567890, "text": "hi"},
        ),
        (
            "http://127.0.0.1:8081/prefix", "@my_channel",
            f"http://127.0.0.1:8081/prefix/bot{TOKEN}/sendMessage",
            {"chat_id": "@my_channel", "text": "hi"},
        ),
    ],
)  # fmt: skip
def test_build_request(base: str, chat_id: int | str, url: str, body: dict[str, Any]) -> None:
    got_url, got_body = build_request(base, TOKEN, chat_id, "hi")
    assert got_url == url
    assert json.loads(got_body) == body


def test_the_body_keeps_unicode_and_newlines() -> None:
    _, body = build_request(BASE, TOKEN, 1, "Grüße 😀\nline two")
    assert json.loads(body)["text"] == "Grüße 😀\nline two"


# -- classification -----------------------------------------------------------------------------


def answer(ok: bool, code: int | None = None, description: str = "", **params: Any) -> bytes:
    body: dict[str, Any] = {"ok": ok}
    if ok:
        body["result"] = {"message_id": 7, "chat": {"id": 42}, "text": "hi"}
    else:
        body |= {"error_code": code, "description": description}
        if params:
            body["parameters"] = params
    return json.dumps(body).encode()


OK = answer(True)
TOO_MANY = answer(False, 429, "Too Many Requests: retry after 2", retry_after=2)
NOT_FOUND = answer(False, 400, "Bad Request: chat not found")
BLOCKED = answer(False, 403, "Forbidden: bot was blocked by the user")
KICKED = answer(False, 403, "Forbidden: bot was kicked from the group chat")
MIGRATED = answer(
    False, 400, "Bad Request: group chat was upgraded to a supergroup chat",
    migrate_to_chat_id=-1009876543210,
)  # fmt: skip
UNAUTHORIZED = answer(False, 401, "Unauthorized")
SERVER = answer(False, 500, "Internal Server Error")

# (status, body, Retry-After header) → ("receipt" | "retry" | "permanent" | "disable",
#                                       retry_after, text in the error)
CLASSIFICATION = [
    (200, OK, None, "receipt", None, None),
    (429, TOO_MANY, None, "retry", 2.0, "HTTP 429: Too Many Requests: retry after 2"),
    (429, TOO_MANY, "30", "retry", 2.0, "retry after 2"),  # the body's retry_after wins
    (429, answer(False, 429, "Too Many Requests"), "7", "retry", 7.0, "HTTP 429"),
    (429, b"slow down", None, "retry", None, "HTTP 429: slow down"),
    (400, NOT_FOUND, None, "permanent", None, "HTTP 400: Bad Request: chat not found"),
    (400, MIGRATED, None, "permanent", None, "set config.chat_id to it"),
    (403, BLOCKED, None, "disable", None, "HTTP 403: Forbidden: bot was blocked by the user"),
    (403, KICKED, None, "disable", None, "kicked"),
    (401, UNAUTHORIZED, None, "permanent", None, "HTTP 401: Unauthorized"),
    (404, answer(False, 404, "Not Found"), None, "permanent", None, "HTTP 404: Not Found"),
    (409, b"", None, "permanent", None, "HTTP 409"),
    (500, SERVER, None, "retry", None, "HTTP 500: Internal Server Error"),
    (502, b"<html>Bad Gateway</html>", None, "retry", None, "HTTP 502: <html>Bad Gateway"),
    (503, b"", "5", "retry", None, "HTTP 503"),
    (200, b"<html>captive portal</html>", None, "retry", None, "not a Bot API success"),
    (200, answer(False, 200, "odd"), None, "retry", None, "not a Bot API success"),
    (302, b"", None, "permanent", None, "HTTP 302"),
]


@pytest.mark.parametrize(
    ("status", "body", "header", "kind", "retry_after", "text"), CLASSIFICATION
)
def test_classify(
    status: int, body: bytes, header: str | None, kind: str, retry_after: float | None,
    text: str | None,
) -> None:  # fmt: skip
    if kind == "receipt":
        receipt = classify(status, body, retry_after_header=header)
        assert receipt == Receipt(status_code=200, response_excerpt=body.decode())
        return
    expected = RetriableError if kind == "retry" else PermanentError
    with pytest.raises(expected) as info:
        classify(status, body, retry_after_header=header)
    err = info.value
    assert err.status_code == status
    assert text is not None
    assert text in str(err)
    if isinstance(err, RetriableError):
        assert err.retry_after == retry_after
    else:
        assert isinstance(err, PermanentError)
        assert err.disable_channel is (kind == "disable")


def test_the_excerpt_is_at_most_2_kib() -> None:
    body = json.dumps({"ok": True, "result": {"text": "x" * 10_000}}).encode()
    receipt = classify(200, body)
    assert receipt.response_excerpt is not None
    assert len(receipt.response_excerpt.encode()) <= 2048
    with pytest.raises(RetriableError) as info:
        classify(502, b"y" * 70_000)
    assert len(str(info.value)) < 300


def test_long_descriptions_are_cut_and_nul_characters_dropped() -> None:
    with pytest.raises(PermanentError) as info:
        classify(400, answer(False, 400, "Bad Request: " + "x" * 5000 + "\0"))
    assert len(str(info.value)) <= len("HTTP 400: ") + 200
    with pytest.raises(PermanentError) as info:
        classify(400, answer(False, 400, "bad\0chat"))
    assert str(info.value) == "HTTP 400: badchat"
    with pytest.raises(RetriableError) as retry:
        classify(502, b"bad\x00gateway")
    assert str(retry.value) == "HTTP 502: badgateway"


def test_a_body_cut_at_the_read_limit_is_still_classified() -> None:
    cut = TOO_MANY[:20]  # not valid JSON any more
    with pytest.raises(RetriableError) as info:
        classify(429, cut, retry_after_header="3")
    assert info.value.retry_after == 3.0


def test_the_token_is_scrubbed_from_answers_that_echo_it() -> None:
    body = answer(False, 400, f"Bad Request: no such bot {TOKEN}")
    with pytest.raises(PermanentError) as info:
        classify(400, body, secret=TOKEN)
    assert TOKEN not in str(info.value)
    assert "no such bot ***" in str(info.value)
    receipt = classify(200, OK[:-1] + f', "echo": "{TOKEN}"}}'.encode(), secret=TOKEN)
    assert receipt.response_excerpt is not None
    assert TOKEN not in receipt.response_excerpt


# -- transport errors and token scrubbing -------------------------------------------------------

URL = f"{BASE}/bot{TOKEN}/sendMessage"
ENCODED_URL = URL.replace(":AAH", "%3AAAH")


@pytest.mark.parametrize(
    ("exc", "kind", "says"),
    [
        (httpx.ConnectTimeout(f"timed out connecting to {URL}"), RetriableError, "timed out"),
        (httpx.ReadTimeout(""), RetriableError, "timed out: ReadTimeout"),
        (httpx.ConnectError(f"cannot connect to {URL}"), RetriableError, "connection failed"),
        (httpx.RemoteProtocolError(f"peer closed {ENCODED_URL}"), RetriableError, "connection"),
        (httpx.ReadError("connection reset"), RetriableError, "ReadError: connection reset"),
        (OSError(f"network unreachable for {URL}"), RetriableError, "connection failed"),
        (httpx.InvalidURL(f"Invalid URL {URL!r}"), PermanentError, "unusable Bot API URL"),
        (httpx.UnsupportedProtocol(f"no scheme: {URL}"), PermanentError, "unusable Bot API URL"),
        (ValueError(f"a bug near {URL}"), TelegramAdapterCrash, "ValueError: a bug near"),
    ],
)
def test_transport_errors_are_mapped_and_scrubbed(
    exc: Exception, kind: type[Exception], says: str
) -> None:
    mapped = transport_error(exc, TOKEN)
    assert isinstance(mapped, kind)
    assert says in str(mapped)
    assert TOKEN not in str(mapped)
    assert "AAH-unit_test_token" not in str(mapped)
    assert mapped.__cause__ is None
    assert mapped.__context__ is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (URL, f"{BASE}/bot***/sendMessage"),
        (ENCODED_URL, f"{BASE}/bot***/sendMessage"),
        (f"{TOKEN} and {TOKEN}", "*** and ***"),
        ("nothing secret", "nothing secret"),
    ],
)
def test_scrub(text: str, expected: str) -> None:
    assert scrub(text, TOKEN) == expected
    assert scrub(text, None) == text
    assert scrub(text, "") == text


def test_the_adapter_repr_hides_the_token(adapter: TelegramAdapter) -> None:
    assert TOKEN not in repr(adapter)


@pytest.mark.parametrize("logger", ["httpx", "httpcore", "httpcore.connection", "httpcore.http11"])
def test_http_library_log_records_are_scrubbed(
    adapter: TelegramAdapter, caplog: pytest.LogCaptureFixture, logger: str
) -> None:
    caplog.set_level(logging.DEBUG, logger=logger)  # another test may have quietened it
    log = logging.getLogger(logger)
    log.info('HTTP Request: %s %s "%s %d %s"', "POST", URL, "HTTP/1.1", 200, "OK")
    log.debug("plain %s", ENCODED_URL)
    try:
        raise httpx.ConnectError(f"failed {URL}")
    except httpx.ConnectError:
        log.exception("request failed")
    text = caplog.text
    assert f"{BASE}/bot***/sendMessage" in text
    assert TOKEN not in text
    assert "AAH-unit_test_token" not in text
    for record in caplog.records:
        assert "AAH-unit_test_token" not in record.getMessage()


# -- deliver, over httpx's MockTransport ----------------------------------------------------------


def mock_adapter(handler: Any) -> TelegramAdapter:
    return TelegramAdapter(TOKEN, api_base_url=BASE, transport=httpx.MockTransport(handler))


async def test_deliver_posts_send_message_and_returns_the_receipt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="httpx")  # another test may have quietened it
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=OK)

    adapter = mock_adapter(handler)
    try:
        config = {"chat_id": "@my_channel", "text_template": "{{ event_type }}!"}
        receipt = await adapter.deliver(message(channel_config=config))
    finally:
        await adapter.aclose()
    assert receipt == Receipt(status_code=200, response_excerpt=OK.decode())
    (request,) = seen
    assert (request.method, str(request.url)) == ("POST", URL)
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.content) == {"chat_id": "@my_channel", "text": "order.created!"}
    # httpx logged the request, with the token scrubbed by the adapter's filter.
    assert any("HTTP Request: POST" in r.getMessage() for r in caplog.records)
    assert "bot***/sendMessage" in caplog.text
    assert TOKEN not in caplog.text


async def test_deliver_maps_an_exception_naming_the_url_without_leaking_the_token() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"could not reach {request.url}", request=request)

    adapter = mock_adapter(handler)
    try:
        with pytest.raises(RetriableError) as info:
            await adapter.deliver(message())
    finally:
        await adapter.aclose()
    assert "connection failed: ConnectError: could not reach" in str(info.value)
    assert TOKEN not in str(info.value)
    # Nothing chains back to the httpx exception (its request holds the URL).
    assert info.value.__cause__ is None
    assert info.value.__context__ is None


async def test_deliver_raises_the_classified_error() -> None:
    adapter = mock_adapter(lambda _: httpx.Response(403, content=BLOCKED))
    try:
        with pytest.raises(PermanentError) as info:
            await adapter.deliver(message())
    finally:
        await adapter.aclose()
    assert info.value.disable_channel
    assert info.value.status_code == 403


async def test_deliver_with_an_unusable_snapshot_is_permanent_without_a_request() -> None:
    calls: list[httpx.Request] = []
    adapter = mock_adapter(lambda r: calls.append(r) or httpx.Response(200, content=OK))
    try:
        with pytest.raises(PermanentError, match=r"^config\.chat_id: "):
            await adapter.deliver(message(channel_config={"chat_id": "nope"}))
        bad_template = {"chat_id": 1, "text_template": "{{ 1 / 0 }}"}
        with pytest.raises(PermanentError, match=r"^config\.text_template: "):
            await adapter.deliver(message(channel_config=bad_template))
    finally:
        await adapter.aclose()
    assert calls == []


# -- construction from the config ---------------------------------------------------------------


def telegram_config(**values: Any) -> TelegramWorkersConfig:
    config = parse_config({"workers": {"telegram": values}}, env={})
    assert config.workers.telegram is not None
    return config.workers.telegram


def test_from_config_reads_the_token_from_the_named_variable() -> None:
    cfg = telegram_config(bot_token_env="MY_BOT_TOKEN", api_base_url="http://127.0.0.1:9")
    adapter = TelegramAdapter.from_config(cfg, {"MY_BOT_TOKEN": f" {TOKEN}\n"})
    assert adapter._token == TOKEN  # surrounding whitespace (a trailing newline) dropped
    assert repr(adapter) == "TelegramAdapter(api_base_url='http://127.0.0.1:9')"


@pytest.mark.parametrize(
    ("values", "share", "tokens"),
    [
        ({}, 7.5, 7),  # a quarter of the bot's 30/s
        ({"per_bot_per_second": 8}, 2.0, 2),
        ({"per_tenant_per_second": 12}, 12.0, 12),
        ({"per_bot_per_second": 10, "per_tenant_per_second": 2.5}, 2.5, 2),
    ],
)
def test_a_tenants_share_comes_from_the_config(
    values: dict[str, float], share: float, tokens: int
) -> None:
    cfg = telegram_config(bot_token_env="TG", **values)
    assert cfg.tenant_rate_per_second == share
    adapter = TelegramAdapter.from_config(cfg, {"TG": TOKEN})
    _, tenant, _ = adapter.rate_buckets(to_chat(1))
    assert tenant.key.endswith(f":tenant:{TENANT_A}")
    assert (tenant.tokens, tenant.period) == (tokens, pytest.approx(tokens / share))


@pytest.mark.parametrize(
    "values",
    [
        {"per_tenant_per_second": 31},  # over the default bot rate
        {"per_bot_per_second": 4, "per_tenant_per_second": 4.5},
        {"per_tenant_per_second": 0},
        {"per_tenant_per_second": -1},
    ],
)
def test_a_tenants_share_outside_0_to_the_bots_rate_is_a_config_error(
    values: dict[str, float],
) -> None:
    with pytest.raises(ConfigError, match=r"^workers\.telegram\.per_tenant_per_second: "):
        telegram_config(**values)


@pytest.mark.parametrize(
    ("environ", "base", "says"),
    [
        ({}, "https://api.telegram.org", "workers.telegram.bot_token_env: "),
        ({"MY_BOT_TOKEN": ""}, "https://api.telegram.org", "not set or empty"),
        ({"MY_BOT_TOKEN": "   "}, "https://api.telegram.org", "not set or empty"),
        ({"MY_BOT_TOKEN": "not a token/../x"}, "https://api.telegram.org", "does not hold"),
        ({"MY_BOT_TOKEN": TOKEN}, "ftp://api.telegram.org", "workers.telegram.api_base_url"),
        ({"MY_BOT_TOKEN": TOKEN}, "api.telegram.org", "workers.telegram.api_base_url"),
    ],
)
def test_from_config_refuses(environ: dict[str, str], base: str, says: str) -> None:
    cfg = telegram_config(bot_token_env="MY_BOT_TOKEN", api_base_url=base)
    with pytest.raises(ConfigError) as info:
        TelegramAdapter.from_config(cfg, environ)
    assert says in str(info.value)
    assert "MY_BOT_TOKEN" in str(info.value) or "api_base_url" in str(info.value)
    for value in environ.values():
        if value.strip():
            assert value not in str(info.value)


def test_the_registry_builds_the_telegram_adapter_only_when_enabled() -> None:
    without = parse_config({}, env={})
    assert "telegram" not in build_adapters(without, environ={})
    config = parse_config({"workers": {"telegram": {"bot_token_env": "TG"}}}, env={})
    adapters = build_adapters(config, environ={"TG": TOKEN})
    assert isinstance(adapters["telegram"], TelegramAdapter)
    assert isinstance(adapters["telegram"], RateLimiter)
    with pytest.raises(ConfigError, match=r"workers\.telegram\.bot_token_env"):
        build_adapters(config, environ={})


# -- the adapter's buckets, taken from in-memory shared buckets under trio's MockClock -----------


@pytest.mark.parametrize(
    ("rate", "tokens", "period"),
    [(1.0, 1, 1.0), (30.0, 30, 1.0), (0.5, 1, 2.0), (2.5, 2, 0.8), (0.1, 1, 10.0)],
)
def test_a_bucket_per_second(rate: float, tokens: int, period: float) -> None:
    bucket = Bucket.per_second("k", rate)
    assert (bucket.tokens, bucket.period) == (tokens, pytest.approx(period))


def test_the_buckets_are_the_tenants_chat_the_tenants_share_and_the_bots() -> None:
    adapter = TelegramAdapter(TOKEN, api_base_url=BASE, per_chat_per_second=0.5)
    msg = to_chat("@My_Channel")
    chat, tenant, bot = adapter.rate_buckets(msg)
    bot_id = TOKEN.split(":")[0]
    assert chat == Bucket(f"telegram:{bot_id}:tenant:{msg.tenant_id}:chat:@my_channel", 1, 2.0)
    # a quarter of the bot's 30/s by default: 7 tokens over 7 / 7.5 s
    assert (tenant.key, tenant.tokens, tenant.period) == (
        f"telegram:{bot_id}:tenant:{msg.tenant_id}",
        7,
        pytest.approx(7 / 7.5),
    )
    assert bot == Bucket(f"telegram:{bot_id}", 30, 1.0)
    assert TOKEN.split(":")[1] not in chat.key + tenant.key + bot.key  # the public part only
    other = TelegramAdapter("555:AAother", api_base_url=BASE)
    assert {b.key for b in other.rate_buckets(to_chat("@my_channel"))}.isdisjoint(
        {chat.key, tenant.key, bot.key}
    )


async def test_the_same_chat_id_under_two_tenants_is_two_buckets(
    adapter: TelegramAdapter, mock_clock: trio.testing.MockClock
) -> None:
    chat_a, tenant_a, bot_a = adapter.rate_buckets(of_tenant(TENANT_A, 4242))
    chat_b, tenant_b, bot_b = adapter.rate_buckets(of_tenant(TENANT_B, 4242))
    assert chat_a.key != chat_b.key
    assert tenant_a.key != tenant_b.key
    assert bot_a == bot_b
    buckets = MemoryBuckets()
    assert await take(adapter, buckets, of_tenant(TENANT_A, 4242)) == 0.0
    assert await take(adapter, buckets, of_tenant(TENANT_A, 4242)) == pytest.approx(1.0)
    # A spent its chat's token: B's chat of the same id still has its own
    assert await take(adapter, buckets, of_tenant(TENANT_B, 4242)) == 0.0


@pytest.mark.parametrize(
    ("share", "kinds"),
    [
        (30.0, ["chat", "bot"]),  # the bot's whole rate: a tenant's bucket would add no limit
        (29.0, ["chat", "tenant", "bot"]),
        (None, ["chat", "tenant", "bot"]),  # the default: a quarter of the bot's rate
    ],
)
def test_the_tenants_bucket_is_left_out_only_when_its_share_is_the_bots_rate(
    share: float | None, kinds: list[str]
) -> None:
    adapter = TelegramAdapter(
        TOKEN, api_base_url=BASE, per_bot_per_second=30, per_tenant_per_second=share
    )
    keys = [b.key for b in adapter.rate_buckets(to_chat(1))]
    bot = f"telegram:{TOKEN.split(':')[0]}"
    named = {"chat": f"{bot}:tenant:{TENANT_A}:chat:1", "tenant": f"{bot}:tenant:{TENANT_A}"}
    assert keys == [named.get(kind, bot) for kind in kinds]


def test_a_tenants_share_above_the_bots_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="per_tenant_per_second"):
        TelegramAdapter(TOKEN, api_base_url=BASE, per_bot_per_second=2, per_tenant_per_second=3)


async def take(adapter: TelegramAdapter, buckets: MemoryBuckets, msg: WorkerMessage) -> float:
    """What the worker asks: a token of each of the message's buckets, all or none."""
    return await buckets.take_tokens(adapter.rate_buckets(msg))


async def send_when_allowed(
    adapter: TelegramAdapter,
    buckets: MemoryBuckets,
    msg: WorkerMessage,
    sent: list[tuple[object, float]],
) -> None:
    """What the worker does, without the delay tiers: ask, wait as long as told, ask again."""
    while wait := await take(adapter, buckets, msg):
        assert wait > 0
        await trio.sleep(wait)
    sent.append((msg.channel_config["chat_id"], trio.current_time()))


async def test_one_chat_gets_one_message_per_second(
    adapter: TelegramAdapter, mock_clock: trio.testing.MockClock
) -> None:
    buckets = MemoryBuckets()
    start = trio.current_time()
    assert await take(adapter, buckets, to_chat(1)) == 0.0
    assert await take(adapter, buckets, to_chat(1)) == pytest.approx(1.0)
    mock_clock.jump(0.25)
    assert await take(adapter, buckets, to_chat(1)) == pytest.approx(0.75)
    mock_clock.jump(0.75)
    assert await take(adapter, buckets, to_chat(1)) == 0.0
    assert trio.current_time() - start == pytest.approx(1.0)


async def test_three_messages_to_one_chat_go_at_0_1_and_2_seconds(
    adapter: TelegramAdapter, mock_clock: trio.testing.MockClock
) -> None:
    buckets = MemoryBuckets()
    start = trio.current_time()
    sent: list[tuple[object, float]] = []
    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(send_when_allowed, adapter, buckets, to_chat(777, n), sent)
    assert [round(at - start, 6) for _, at in sent] == [0.0, 1.0, 2.0]


async def test_different_chats_do_not_wait_for_each_other(
    adapter: TelegramAdapter, mock_clock: trio.testing.MockClock
) -> None:
    buckets = MemoryBuckets()
    start = trio.current_time()
    sent: list[tuple[object, float]] = []
    async with trio.open_nursery() as nursery:
        for chat in (1, 2, "@channel_a", "@channel_b"):
            for n in range(2):
                nursery.start_soon(send_when_allowed, adapter, buckets, to_chat(chat, n), sent)
    by_chat: dict[object, list[float]] = {}
    for chat, at in sent:
        by_chat.setdefault(chat, []).append(round(at - start, 6))
    assert by_chat == {c: [0.0, 1.0] for c in (1, 2, "@channel_a", "@channel_b")}


def test_channel_usernames_share_a_bucket_whatever_their_case() -> None:
    assert chat_key({"chat_id": "@My_Channel"}) == chat_key({"chat_id": "@my_channel"})
    assert chat_key({"chat_id": 5}) == 5
    assert chat_key({"chat_id": "bad"}) is None
    assert chat_key({}) is None


def test_an_unusable_chat_id_is_not_rate_limited(adapter: TelegramAdapter) -> None:
    assert adapter.rate_buckets(to_chat("nope")) == ()


async def test_the_bot_sends_at_most_30_messages_in_any_second(
    mock_clock: trio.testing.MockClock,
) -> None:
    # one tenant whose share is the bot's whole rate
    adapter = TelegramAdapter(
        TOKEN, api_base_url=BASE, per_bot_per_second=30, per_tenant_per_second=30
    )
    buckets = MemoryBuckets()
    start = trio.current_time()
    sent: list[tuple[object, float]] = []
    async with trio.open_nursery() as nursery:
        for chat in range(100):  # 100 different chats: only the bot's limit applies
            nursery.start_soon(send_when_allowed, adapter, buckets, to_chat(chat + 1), sent)
    times = sorted(round(at - start, 6) for _, at in sent)
    assert len(times) == 100
    assert [times.count(t) for t in (0.0, 1.0, 2.0, 3.0)] == [30, 30, 30, 10]
    for t0 in times:
        assert sum(1 for t in times if t0 <= t < t0 + 1.0) <= 30


async def test_the_chat_and_the_bot_are_taken_from_both_or_neither(
    mock_clock: trio.testing.MockClock,
) -> None:
    adapter = TelegramAdapter(
        TOKEN, api_base_url=BASE, per_chat_per_second=0.5, per_bot_per_second=2,
        per_tenant_per_second=2,
    )  # fmt: skip
    buckets = MemoryBuckets()
    assert await take(adapter, buckets, to_chat(1)) == 0.0
    assert await take(adapter, buckets, to_chat(1)) == pytest.approx(2.0)  # one per 2 s per chat
    assert await take(adapter, buckets, to_chat(2)) == 0.0  # the bot's token the chat left
    assert await take(adapter, buckets, to_chat(3)) == pytest.approx(1.0)  # two per s per bot
    mock_clock.jump(1.0)
    # chat 3 was refused above with nothing taken: its own bucket is still full
    assert await take(adapter, buckets, to_chat(3)) == 0.0


# -- each tenant's share of the bot -------------------------------------------------------------


class Sent(NamedTuple):
    tenant: uuid.UUID
    asked: float  # since the start
    at: float  # since the start, when the tokens were taken


async def send_at(
    adapter: TelegramAdapter, buckets: MemoryBuckets, msg: WorkerMessage, asked: float,
    sent: list[Sent], start: float,
) -> None:  # fmt: skip
    """``send_when_allowed`` for a message that arrives ``asked`` seconds after ``start``."""
    await trio.sleep_until(start + asked)
    while wait := await take(adapter, buckets, msg):
        assert wait > 0
        await trio.sleep(wait)
    sent.append(Sent(msg.tenant_id, asked, round(trio.current_time() - start, 6)))


def most_in_a_window(times: list[float], seconds: float) -> int:
    """The most of ``times`` within any window of ``seconds`` (less rounding's micro-second)."""
    return max(sum(1 for t in times if t0 <= t < t0 + seconds - 1e-6) for t0 in times)


async def test_a_tenant_flooding_the_bot_gets_its_share_and_another_gets_tokens_at_once(
    mock_clock: trio.testing.MockClock,
) -> None:
    adapter = TelegramAdapter(TOKEN, api_base_url=BASE)  # 30/s per bot, 7.5/s per tenant
    period = 7 / 7.5  # the tenant's bucket: 7 tokens, each back this long after it was spent
    buckets = MemoryBuckets()
    start = trio.current_time()
    sent: list[Sent] = []
    async with trio.open_nursery() as nursery:
        for chat in range(1, 61):  # tenant A: 60 chats at once, eight times its share
            msg = of_tenant(TENANT_A, chat)
            nursery.start_soon(send_at, adapter, buckets, msg, 0.0, sent, start)
        for asked in (0.0, 1.5, 3.0, 4.5):  # tenant B, during A's flood: 5 of A's chat ids
            for chat in range(1, 6):
                msg = of_tenant(TENANT_B, chat)
                nursery.start_soon(send_at, adapter, buckets, msg, asked, sent, start)
    flood = sorted(s.at for s in sent if s.tenant == TENANT_A)
    assert len(flood) == 60
    # A gets exactly its share: 7 tokens a period, while the bot has 30 a second
    assert [flood.count(round(k * period, 6)) for k in range(9)] == [7] * 8 + [4]
    assert most_in_a_window(flood, period) == 7
    # B's messages, to the same chat ids, went the moment they were asked
    others = [s for s in sent if s.tenant == TENANT_B]
    assert len(others) == 20
    assert all(s.at == s.asked for s in others), others


async def test_tenants_flooding_together_keep_each_share_and_the_bots_limit(
    mock_clock: trio.testing.MockClock,
) -> None:
    adapter = TelegramAdapter(TOKEN, api_base_url=BASE)  # 30/s per bot, 7.5/s per tenant
    buckets = MemoryBuckets()
    start = trio.current_time()
    sent: list[Sent] = []
    tenants = [uuid.UUID(int=100 + n) for n in range(6)]  # 6 shares: 45/s, over the bot's 30
    async with trio.open_nursery() as nursery:
        for tenant in tenants:
            for chat in range(1, 16):
                msg = of_tenant(tenant, chat)
                nursery.start_soon(send_at, adapter, buckets, msg, 0.0, sent, start)
    assert len(sent) == 90
    assert most_in_a_window([s.at for s in sent], 1.0) == 30
    for tenant in tenants:
        assert most_in_a_window([s.at for s in sent if s.tenant == tenant], 7 / 7.5) <= 7
