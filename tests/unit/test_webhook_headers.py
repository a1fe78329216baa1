"""A webhook channel's custom headers: one rule (RFC 9110 token names, visible-ASCII values)
at create, at PATCH and before each delivery, and no header value or secret in an error.

Deliveries run against a dialer passed to the adapter's constructor (its connection seam): it
records what is dialed, and its connections fail with an error that quotes the request bytes,
as an HTTP library's error may.
"""

from __future__ import annotations

from typing import Any

import h11
import httpx
import pytest
import trio

from notifier.adapters.base import InvalidChannelConfig
from notifier.adapters.webhook import (
    WebhookAdapter,
    WebhookAdapterCrash,
    WebhookChannels,
    header_field,
    header_problem,
    request_secrets,
    transport_error,
)
from notifier.errors import PermanentError, RetriableError
from notifier.testing import worker_message

URL = "https://example.com/hook"
PUBLIC_URL = "http://93.184.216.34/hook"  # a literal public address: nothing to resolve
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TOKEN = "sk_test_4eC39HqLyjWDarjtT1zdp7dc"

INVALID_NAMES = {
    "empty": "",
    "space": "X Team",
    "tab": "X\tTeam",
    "colon": "X:Team",
    "open-paren": "X(Team",
    "close-paren": "X)Team",
    "comma": "X,Team",
    "slash": "X/Team",
    "at": "X@Team",
    "brackets": "X[Team]",
    "braces": "X{Team}",
    "quote": 'X"Team',
    "equals": "X=Team",
    "question-mark": "X?Team",
    "semicolon": "X;Team",
    "backslash": "X\\Team",
    "cr-lf": "X\r\nTeam",
    "trailing-lf": "X-Team\n",
    "nul": "X\x00Team",
    "del": "X\x7fTeam",
    "non-ascii": "X-Équipe",
    "fullwidth": "\uff38-Team",
    "line-separator": "X\u2028Team",
}
INVALID_VALUES = {
    "non-ascii": "café",
    "latin-1": "caf\xe9",
    "emoji": "team-\U0001f600",
    "no-break-space": "a\xa0b",
    "trailing-space": f"{TOKEN} ",
    "leading-space": f" {TOKEN}",
    "trailing-tab": f"{TOKEN}\t",
    "leading-tab": f"\t{TOKEN}",
    "only-space": " ",
    "trailing-lf": f"{TOKEN}\n",
    "cr-lf-injection": "a\r\nX-Evil: 1",
    "lf": "a\nb",
    "cr": "a\rb",
    "nul": "a\x00b",
    "soh": "a\x01b",
    "escape": "a\x1bb",
    "del": "a\x7fb",
    "next-line": "a\x85b",
    "line-separator": "a\u2028b",
}
VALID = [
    ("X-Team", "billing"),
    ("x", "y"),
    ("!#$%&'*+-.^_`|~09AZaz", "v"),  # every tchar
    ("Authorization", f"Bearer {TOKEN}"),
    ("X-Empty", ""),
    ("X-Spaced", "a b\tc  d"),  # inner spaces and tabs
    ("X-Visible", "".join(chr(c) for c in range(0x21, 0x7F))),  # every visible character
]


def create(adapter: WebhookChannels, headers: dict[str, str]) -> dict[str, Any]:
    return adapter.prepare_config({"url": URL, "headers": headers})


def patch(adapter: WebhookChannels, headers: dict[str, str]) -> dict[str, Any]:
    previous = create(adapter, {})
    return adapter.prepare_config_update(
        {"url": URL, "secret": previous["secret"], "headers": headers}, previous
    )


@pytest.fixture
def adapter() -> WebhookChannels:
    return WebhookChannels(timeout_seconds=5, allow_private_networks=False)


@pytest.mark.parametrize("prepare", [create, patch])
@pytest.mark.parametrize("name", INVALID_NAMES.values(), ids=INVALID_NAMES.keys())
def test_a_name_that_is_not_a_token_is_refused(
    adapter: WebhookChannels, prepare: Any, name: str
) -> None:
    with pytest.raises(InvalidChannelConfig) as info:
        prepare(adapter, {"X-Fine": "ok", name: TOKEN})
    assert info.value.field == header_field(name)
    assert "not a valid header name" in info.value.message
    assert TOKEN not in str(info.value)
    assert str(info.value).isprintable()  # a control character in the name is shown escaped


@pytest.mark.parametrize("prepare", [create, patch])
@pytest.mark.parametrize("value", INVALID_VALUES.values(), ids=INVALID_VALUES.keys())
def test_a_value_that_cannot_be_sent_as_it_is_is_refused(
    adapter: WebhookChannels, prepare: Any, value: str
) -> None:
    with pytest.raises(InvalidChannelConfig) as info:
        prepare(adapter, {"X-Fine": "ok", "X-Api-Token": value})
    assert info.value.field == "config.headers.X-Api-Token"
    assert "visible ASCII" in info.value.message
    assert TOKEN not in str(info.value)  # the value is never quoted
    assert value.strip() == "" or value not in str(info.value)


def test_a_token_name_is_shown_as_it_is_and_any_other_escaped() -> None:
    assert header_field("X-Team") == "config.headers.X-Team"
    assert header_field("X\tTeam") == "config.headers.'X\\tTeam'"
    assert header_field("") == "config.headers.''"
    assert header_field("X-Équipe") == "config.headers.'X-\\xc9quipe'"


@pytest.mark.parametrize(("name", "value"), VALID)
def test_what_the_rule_accepts_every_http_stack_on_the_way_sends(
    adapter: WebhookChannels, name: str, value: str
) -> None:
    assert header_problem(name, value) is None
    assert create(adapter, {name: value})["headers"] == {name: value}
    assert patch(adapter, {name: value})["headers"] == {name: value}
    request = httpx.Request("POST", URL, headers={name: value})  # encodes as ASCII
    h11.Request(method="POST", target="/", headers=request.headers.raw)  # with its Host


@pytest.mark.parametrize(
    "name", ["Host", "content-length", "Content-Type", "webhook-signature", "Connection"]
)
def test_reserved_names_stay_refused(name: str) -> None:
    assert header_problem(name, "x") == "may not be set by a channel"


# -- at delivery --------------------------------------------------------------------------------


class QuotingStream(trio.abc.Stream):
    """A connection whose writes fail with an error quoting the bytes written."""

    def __init__(self, error: type[Exception]) -> None:
        self._error = error

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        raise self._error(f"could not send {bytes(data)!r}")

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        return b""

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class QuotingDialer:
    """Dials nothing real: records the address and hands out a ``QuotingStream``."""

    def __init__(self, error: type[Exception] = OSError) -> None:
        self.dialed: list[tuple[str, int]] = []
        self._error = error

    async def __call__(self, host: str, port: int) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        self.dialed.append((host, port))
        return QuotingStream(self._error)


async def deliver(backend: QuotingDialer, headers: dict[str, str]) -> BaseException:
    adapter = WebhookAdapter(timeout_seconds=5, allow_private_networks=False, dialer=backend)
    message = worker_message(
        channel_config={"url": PUBLIC_URL, "secret": SECRET, "headers": headers}
    )
    try:
        with pytest.raises(Exception) as info:  # noqa: PT011 (each test checks the kind)
            await adapter.deliver(message)
    finally:
        await adapter.aclose()
    return info.value


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Api-Token", f"{TOKEN} "),  # stored before the rule: h11 refused it on every attempt
        ("X-Team", f"café-{TOKEN}"),  # ... httpx failed to encode it: a handler panic
        ("X(Team", TOKEN),
        ("X\tTeam", TOKEN),
        ("Host", TOKEN),
    ],
    ids=["trailing-space", "non-ascii", "paren-in-name", "tab-in-name", "reserved"],
)
async def test_a_stored_header_that_cannot_be_sent_kills_the_delivery_naming_it(
    name: str, value: str
) -> None:
    backend = QuotingDialer()
    error = await deliver(backend, {"X-Fine": "ok", name: value})
    assert isinstance(error, PermanentError)
    assert str(error).startswith(f"{header_field(name)}: ")
    assert TOKEN not in str(error)
    assert backend.dialed == []  # no attempt was made


@pytest.mark.parametrize("error", [OSError, ValueError])
async def test_an_error_quoting_the_request_loses_header_values_and_the_signature(
    error: type[Exception],
) -> None:
    backend = QuotingDialer(error)
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Team": "billing-team"}
    raised = await deliver(backend, headers)
    kind = RetriableError if error is OSError else WebhookAdapterCrash
    assert isinstance(raised, kind)
    text = str(raised)
    assert "could not send b'POST /hook HTTP/1.1" in text  # the error itself is kept
    assert "webhook-signature: [redacted]" in text
    for secret in [TOKEN, "billing-team", SECRET.removeprefix("whsec_"), "v1,"]:
        assert secret not in text
    assert raised.__cause__ is None
    assert raised.__context__ is None  # nothing chains back to the unscrubbed error
    assert backend.dialed == [("93.184.216.34", 80)]


def test_transport_error_scrubs_every_quoted_form() -> None:
    quoted = request_secrets({"X-Api-Token": f"{TOKEN} ", "X-Short": "abc"}, [SECRET])
    text = (
        f"Illegal header value b'{TOKEN} ' / {TOKEN} / {SECRET} / "
        f"{SECRET.removeprefix('whsec_')} / {'café-' + TOKEN!r} / abc"
    )
    mapped = transport_error(h11.LocalProtocolError(text), quoted)
    assert isinstance(mapped, WebhookAdapterCrash)
    assert TOKEN not in str(mapped)
    assert SECRET.removeprefix("whsec_") not in str(mapped)
    assert str(mapped).endswith(" / abc")  # shorter forms would match all over the text
    timed_out = transport_error(httpx.ReadTimeout(f"read {TOKEN}"), quoted)
    assert isinstance(timed_out, RetriableError)
    assert str(timed_out) == "timed out: ReadTimeout"


@pytest.mark.parametrize(
    ("exc", "unreachable"),
    [
        # the receiver could not be reached, or did not answer: counts towards its circuit
        (httpx.ConnectError("[Errno 111] Connection refused"), True),
        (httpx.ConnectTimeout("timed out"), True),
        (httpx.ReadTimeout("timed out"), True),
        (httpx.ReadError("connection reset by peer"), True),
        (OSError("network unreachable"), True),
        # it answered, if badly: not a circuit failure
        (httpx.RemoteProtocolError("illegal status line"), False),
    ],
)
def test_a_transport_error_says_whether_the_receiver_was_unreachable(
    exc: Exception, unreachable: bool
) -> None:
    mapped = transport_error(exc, ())
    assert isinstance(mapped, RetriableError)
    assert mapped.unreachable is unreachable
