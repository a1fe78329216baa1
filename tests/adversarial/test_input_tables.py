"""Header and pattern tables over the real HTTP API: every control character, every separator a
header name may not hold, non-ASCII and newlines, in webhook header names and values and in
every text a pattern checks (event types, channel subscriptions at create and PATCH, bulk
replay filters), and two ``Authorization`` headers.

Each request is answered with a 4xx and the documented JSON error body, never a 500; nothing is
written (row counts and the channel unchanged); and no ERROR line is logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from notifier.config import Config
from tests.integration.conftest import count_rows, create_tenant, run_notifier

pytestmark = pytest.mark.integration

HOOK_URL = "https://hooks.example.com/in"
JSON = {"content-type": "application/json"}

CONTROL = {f"U+{c:04X}": chr(c) for c in [*range(0x20), 0x7F]}
NON_ASCII = {
    "e-acute": "é",
    "no-break-space": "\xa0",
    "next-line": "\x85",
    "line-separator": "\u2028",
    "byte-order-mark": "\ufeff",
    "ideographic-full-stop": "\u3002",
    "fullwidth-full-stop": "\uff0e",
    "fullwidth-digit": "\uff11",
    "emoji": "\U0001f600",
    "lone-surrogate": "\ud800",
}
# Characters a header name may not hold besides those: RFC 9110 delimiters and space.
SEPARATORS = {f"{c!r}": c for c in ' "(),/:;<=>?@[\\]{}'}
NEWLINES = {"lf": "\n", "crlf": "\r\n", "cr": "\r", "lf-lf": "\n\n"}
SPOILERS = {**CONTROL, **NON_ASCII}


@dataclass
class Service:
    db: str
    api: httpx.AsyncClient
    channel_id: str


@asynccontextmanager
async def open_service(config: Config, database_url: str) -> AsyncIterator[Service]:
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        resp = await api.post(
            "/v1/channels", json={"type": "webhook", "config": {"url": HOOK_URL}, "name": "a"}
        )
        assert resp.status_code == 201, resp.text
        yield Service(database_url, api, resp.json()["id"])


def webhook(headers: dict[str, str]) -> dict[str, Any]:
    return {"url": HOOK_URL, "headers": headers}


# Each kind of input: where a spoiled text goes -> (method, path, body).
Request = tuple[str, str, dict[str, Any]]
KINDS: dict[str, Callable[[Service, str], Request]] = {
    "header-name": lambda s, t: (
        "POST", "/v1/channels", {"type": "webhook", "config": webhook({f"X-A{t}b": "v"})}
    ),
    "header-name-alone": lambda s, t: (
        "POST", "/v1/channels", {"type": "webhook", "config": webhook({t: "v"})}
    ),
    "header-value": lambda s, t: (
        "POST", "/v1/channels", {"type": "webhook", "config": webhook({"X-A": f"v{t}w"})}
    ),
    "header-value-trailing": lambda s, t: (
        "POST", "/v1/channels", {"type": "webhook", "config": webhook({"X-A": f"tok{t}"})}
    ),
    "patch-header-name": lambda s, t: (
        "PATCH", f"/v1/channels/{s.channel_id}", {"config": webhook({f"X-A{t}": "v"})}
    ),
    "patch-header-value": lambda s, t: (
        "PATCH", f"/v1/channels/{s.channel_id}", {"config": webhook({"X-A": f"v{t}"})}
    ),
    "event-type": lambda s, t: ("POST", "/v1/events", {"type": f"probe.created{t}", "payload": {}}),
    "event-type-inside": lambda s, t: (
        "POST", "/v1/events", {"type": f"probe{t}.created", "payload": {}}
    ),
    "batch-event-type": lambda s, t: (
        "POST", "/v1/events/batch", {"events": [{"type": f"probe.created{t}", "payload": {}}]}
    ),
    "channel-pattern": lambda s, t: (
        "POST", "/v1/channels",
        {"type": "webhook", "config": webhook({}), "event_types": [f"probe.*{t}"]},
    ),
    "channel-catch-all": lambda s, t: (
        "POST", "/v1/channels",
        {"type": "webhook", "config": webhook({}), "event_types": [f"*{t}"]},
    ),
    "patch-pattern": lambda s, t: (
        "PATCH", f"/v1/channels/{s.channel_id}", {"event_types": [f"probe.*{t}"]}
    ),
    "replay-event-type": lambda s, t: (
        "POST", "/v1/deliveries/retry", {"event_type": f"probe.*{t}"}
    ),
    "replay-status": lambda s, t: ("POST", "/v1/deliveries/retry", {"status": f"DEAD{t}"}),
}  # fmt: skip
# Which characters each kind is tried with (a header name also refuses the separators).
TEXTS = {
    kind: {**SPOILERS, **NEWLINES, **(SEPARATORS if "header-name" in kind else {})}
    for kind in KINDS
}
# A value may hold a space or a tab between visible characters: only their edges are refused.
TEXTS["header-value"] = {k: v for k, v in TEXTS["header-value"].items() if v not in " \t"}
TEXTS["header-value-trailing"] |= {"space": " ", "tab": "\t"}
TEXTS["patch-header-value"] |= {"space": " ", "tab": "\t"}


def problem(resp: httpx.Response) -> str | None:
    """What is wrong with a refusal, or None: a 4xx with exactly the documented error body."""
    if not 400 <= resp.status_code < 500:
        return f"status {resp.status_code}"
    if resp.headers.get("content-type") != "application/json":
        return f"content-type {resp.headers.get('content-type')}"
    body = resp.json()
    error = body.get("error") if isinstance(body, dict) else None
    if (
        list(body) != ["error"]
        or not isinstance(error, dict)
        or sorted(error) != ["code", "message"]
    ):
        return f"body {body}"
    if not (isinstance(error["code"], str) and isinstance(error["message"], str)):
        return f"body {body}"
    return None


@pytest.mark.parametrize("kind", KINDS)
async def test_hostile_texts_are_refused_with_a_json_4xx_and_write_nothing(
    kind: str, config: Config, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with open_service(config, database_url) as service:
        channel = (await service.api.get(f"/v1/channels/{service.channel_id}")).json()
        rows = await count_rows(database_url)
        failures = []
        for name, text in TEXTS[kind].items():
            method, path, body = KINDS[kind](service, text)
            # json.dumps escapes non-ASCII (a lone surrogate too, which UTF-8 cannot carry)
            resp = await service.api.request(method, path, content=json.dumps(body), headers=JSON)
            if (wrong := problem(resp)) is not None:
                failures.append((name, wrong, resp.text[:200]))
        assert failures == []
        assert await count_rows(database_url) == rows, "nothing was written"
        assert (await service.api.get(f"/v1/channels/{service.channel_id}")).json() == channel
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


async def test_two_authorization_headers_are_a_json_400(
    config: Config, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with open_service(config, database_url) as service:
        good = service.api.headers["authorization"]
        rows = await count_rows(database_url)
        failures = []
        for values in [[good, "Bearer nk_x"], ["Bearer nk_x", good], [good, good]]:
            for method, path, body in [
                ("POST", "/v1/events", {"type": "probe.created", "payload": {}}),
                ("GET", "/v1/channels", None),
            ]:
                headers = [("Authorization", v) for v in values]
                async with httpx.AsyncClient(base_url=str(service.api.base_url)) as bare:
                    resp = await bare.request(method, path, json=body, headers=headers)
                if resp.status_code != 400 or problem(resp) is not None:
                    failures.append((values, method, path, resp.status_code, resp.text[:200]))
        assert failures == []
        assert await count_rows(database_url) == rows
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
