"""Every pattern of the request models matches the whole text: a trailing newline (which
Python's ``$`` lets through), CR, tab, NUL, non-ASCII and the empty text are refused wherever
a pattern is used, through the one decoding path of the HTTP API and AMQP ingest."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from notifier.ingest import jsonguard
from notifier.ingest.amqp_messages import Rejected, parse_message
from notifier.ingest.models import (
    EVENT_TYPE_RE,
    PATTERN_RE,
    ChannelIn,
    ChannelPatch,
    EventIn,
    ReplayIn,
)
from notifier.validation import whole

# Texts that spoil a valid one; each is refused wherever a pattern checks it.
SPOILED = {
    "trailing-lf": "{}\n",
    "trailing-crlf": "{}\r\n",
    "trailing-lf-lf": "{}\n\n",
    "leading-lf": "\n{}",
    "inner-lf": "{}\nx",
    "trailing-cr": "{}\r",
    "tab": "{}\t",
    "trailing-space": "{} ",
    "nul": "{}\x00",
    "vertical-tab": "{}\x0b",
    "form-feed": "{}\x0c",
    "next-line": "{}\x85",
    "line-separator": "{}\u2028",
    "non-ascii-letter": "{}é",
    "fullwidth-dot": "{}\uff0ex",
    "non-ascii-digit": "{}\u0661",  # ARABIC-INDIC DIGIT ONE: a digit to \d, not to [0-9]
}


def spoiled(valid: str) -> list[Any]:
    return [pytest.param(t.format(valid), id=name) for name, t in SPOILED.items()]


def refused(model: type[Any], body: dict[str, Any], field: str) -> None:
    """The body is refused by the HTTP API's and AMQP ingest's decoding, naming ``field``."""
    data = json.dumps(body).encode()
    with pytest.raises(jsonguard.BodyRefused) as info:
        jsonguard.decode(data, model)
    assert (info.value.status, info.value.code) == (422, "validation_error")
    assert info.value.message.startswith(f"{field}: "), info.value.message


@pytest.mark.parametrize("text", ["a", "a.b", "order.created", "A-b_c:d.e1"])
def test_whole_matches_the_whole_text(text: str) -> None:
    assert re.search(EVENT_TYPE_RE, text)
    assert re.search(PATTERN_RE, text)
    assert re.search(whole("x|y"), "x")
    assert not re.search(whole("x|y"), "xy")


@pytest.mark.parametrize("text", spoiled("probe.created"))
def test_an_event_type_is_refused(text: str) -> None:
    refused(EventIn, {"type": text, "payload": {}}, "type")


def test_an_empty_event_type_is_refused() -> None:
    refused(EventIn, {"type": "", "payload": {}}, "type")


@pytest.mark.parametrize("valid", ["probe.*", "*", "probe.created"])
@pytest.mark.parametrize("template", [pytest.param(t, id=n) for n, t in SPOILED.items()])
def test_a_channel_pattern_is_refused_at_create_and_patch(valid: str, template: str) -> None:
    text = template.format(valid)
    create = {"type": "webhook", "config": {}, "event_types": ["a.*", text]}
    refused(ChannelIn, create, "event_types[1]")
    refused(ChannelPatch, {"event_types": [text]}, "event_types[0]")


@pytest.mark.parametrize("text", [*spoiled("probe.*"), ""])
def test_a_replay_event_type_filter_is_refused(text: str) -> None:
    refused(ReplayIn, {"event_type": text}, "event_type")


@pytest.mark.parametrize("text", [*spoiled("DEAD"), *spoiled("DELIVERED"), "", "dead"])
def test_a_replay_status_is_refused(text: str) -> None:
    refused(ReplayIn, {"status": text}, "status")


@pytest.mark.parametrize("text", spoiled("probe.created"))
def test_an_amqp_ingest_message_is_refused(text: str) -> None:
    body = json.dumps({"type": text, "payload": {}}).encode()
    parsed = parse_message(
        body, app_id="app", message_id="m-1", content_type="application/json",
        tenants={"app": "acme"}, max_body_bytes=65536,
    )  # fmt: skip
    assert isinstance(parsed, Rejected)
    assert parsed.code == "validation_error"
    assert parsed.message.startswith("type: ")


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (EventIn, {"type": "probe.created", "payload": {}}),
        (ChannelIn, {"type": "webhook", "config": {}, "event_types": ["probe.*", "*", "a.b"]}),
        (ChannelPatch, {"event_types": ["probe.*"]}),
        (ReplayIn, {"status": "DELIVERED", "event_type": "probe.*"}),
        (ReplayIn, {"status": "DEAD", "event_type": "*"}),
    ],
)
def test_valid_texts_still_pass(model: type[Any], body: dict[str, Any]) -> None:
    jsonguard.decode(json.dumps(body).encode(), model)
