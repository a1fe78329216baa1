"""The HTTP API (docs/architecture.md §8) against the real service on the real Postgres: bad input
is refused with the documented status and error body and writes nothing, idempotency, channels,
batches, deliveries and the fan-out rule.

Only the ingest role runs: it writes events, deliveries and outbox rows and nothing moves them
afterwards, so every count read after a request is final (no waiting). The ingest role touches
RabbitMQ only in ``/readyz`` (it connects and disconnects), so these tests use the default
vhost instead of a per-test one.

For speed the tests share one database (a fresh one per test costs more than most of these
tests take); each test gets a server and two tenants of its own, and compares row counts
before and after a request, so other tests' rows do not matter.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import trio

from notifier.ingest.tenants import hash_api_key
from notifier.store.rows import Channel
from notifier.store.versions import LATEST
from notifier.testing import fanout_targets
from tests.integration.conftest import (
    AMQP_BASE,
    PG_BASE,
    Running,
    _pg,
    count_rows,
    make_config,
    run_notifier,
    scalar,
    sql,
)

HOOK_URL = "https://hooks.example.com/in"
JSON = {"content-type": "application/json"}
EVENT = {"type": "order.created", "payload": {"n": 1}}
WEBHOOK = {"type": "webhook", "config": {"url": HOOK_URL}}
# A channel's rate limit is one delivery an hour at least.
AT_LEAST_HOURLY = f"Expected `float` >= {1 / 3600!r}"


# -- set-up -------------------------------------------------------------------------------------


@dataclass
class Api:
    """A running ingest server with two tenants. Tenant A has a catch-all webhook channel (so an
    event wrongly accepted would also write deliveries and outbox rows); tenant B has a channel,
    an event and its delivery, for the "another tenant's id" checks."""

    db: str
    running: Running
    a: httpx.AsyncClient
    b: httpx.AsyncClient
    tenant_a: uuid.UUID
    tenant_b: uuid.UUID
    a_channel: dict[str, Any]
    b_channel: dict[str, Any]
    b_event: dict[str, Any]

    @property
    def b_delivery_id(self) -> str:
        return str(self.b_event["deliveries"][0]["id"])

    def client(self, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
        """A client without the tenant's key (``headers`` as given)."""
        return httpx.AsyncClient(base_url=self.running.base_url, headers=headers, timeout=10)

    async def rows(self) -> dict[str, int]:
        return await count_rows(self.db)


@pytest.fixture(scope="module")
def api_db(pg_template: str) -> Iterator[str]:
    name = f"notifier_api_{uuid.uuid4().hex[:12]}"
    _pg(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield f"{PG_BASE}/{name}"
    _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def new_tenants(db: str, count: int) -> list[tuple[uuid.UUID, str]]:
    """Create ``count`` tenants in one statement; return their ids and API keys."""
    tenants = [(uuid.uuid4(), f"nk_test_{uuid.uuid4().hex}") for _ in range(count)]
    await sql(
        db,
        "INSERT INTO tenants (id, name, api_key_hash) "
        "SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[])",
        [t for t, _ in tenants],
        [f"tenant-{t.hex}" for t, _ in tenants],
        [hash_api_key(key) for _, key in tenants],
    )
    return tenants


async def make_channel(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    body = {"type": "webhook", "config": {"url": HOOK_URL}, **fields}
    resp = await client.post("/v1/channels", json=body)
    assert resp.status_code == 201, resp.text
    channel: dict[str, Any] = resp.json()
    return channel


async def post_event(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    body = {"type": "order.created", "payload": {"n": 1}, **fields}
    resp = await client.post("/v1/events", json=body)
    assert resp.status_code == 202, resp.text
    event: dict[str, Any] = resp.json()
    return event


@asynccontextmanager
async def open_api(database_url: str, **overrides: Any) -> AsyncIterator[Api]:
    config = make_config(database_url, f"{AMQP_BASE}/", **overrides)
    (tenant_a, key_a), (tenant_b, key_b) = await new_tenants(database_url, 2)
    async with (
        run_notifier(config, ("ingest",)) as running,
        running.client(key_a) as a,
        running.client(key_b) as b,
    ):
        b_channel = await make_channel(b, name="b-all")
        b_event = await post_event(b)
        assert len(b_event["deliveries"]) == 1
        yield Api(
            db=database_url,
            running=running,
            a=a,
            b=b,
            tenant_a=tenant_a,
            tenant_b=tenant_b,
            a_channel=await make_channel(a, name="a-all"),
            b_channel=b_channel,
            b_event=b_event,
        )


@pytest.fixture
async def api(api_db: str) -> AsyncIterator[Api]:
    async with open_api(api_db) as running:
        yield running


def assert_error(resp: httpx.Response, status: int, code: str, *mentions: str) -> str:
    """The documented error shape, exactly: ``{"error": {"code": ..., "message": ...}}``."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert list(body) == ["error"], body
    assert sorted(body["error"]) == ["code", "message"], body
    assert body["error"]["code"] == code, body
    message = body["error"]["message"]
    assert isinstance(message, str), body
    assert message, body
    for text in mentions:
        assert text in message, (text, message)
    return message


# -- bad input: 400, 401, 404, 405, 413, 415, 422 -----------------------------------------------
#
# Each test runs its cases as subtests against one server (a server per case would make this
# file several times slower); every case checks the status, the error body and the row counts.


async def refused(
    api: Api,
    status: int,
    code: str,
    *mentions: str,
    method: str,
    path: str,
    client: httpx.AsyncClient | None = None,
    **request: Any,
) -> httpx.Response:
    """Send a request (as tenant A unless ``client`` is given; ``request`` are httpx's keyword
    arguments); assert the error answer and that no row of any table was written."""
    before = await api.rows()
    resp = await (client or api.a).request(method, path, **request)
    assert_error(resp, status, code, *mentions)
    assert await api.rows() == before, "a refused request wrote nothing"
    return resp


INVALID_JSON = {
    "brace": b"{",
    "unclosed": b'{"type": "order.created", "payload": {}',  # a valid start for one route only
    "unclosed-batch": b'{"events": [',
    "unclosed-array": b"[1, 2",
    "not-json": b"not json",
    "empty": b"",
    "bad-utf8": b'{"type": "\xff", "payload": {}}',
    "trailing": b'{"type": "order.created", "payload": {}} x',
}


async def test_invalid_json_is_400_and_writes_nothing(api: Api, subtests: pytest.Subtests) -> None:
    channel = f"/v1/channels/{api.a_channel['id']}"
    channel_view = (await api.a.get(channel)).json()
    for name, body in INVALID_JSON.items():
        for method, path in [
            ("POST", "/v1/events"), ("POST", "/v1/events/batch"), ("POST", "/v1/channels"),
            ("PATCH", channel),
        ]:  # fmt: skip
            with subtests.test(body=name, route=f"{method} {path}"):
                await refused(
                    api, 400, "invalid_json", "not valid JSON",
                    method=method, path=path, content=body, headers=JSON,
                )  # fmt: skip
    assert (await api.a.get(channel)).json() == channel_view, "the patches changed nothing"


AUTH_HEADERS = {
    "missing": ({}, "missing bearer API key"),
    "wrong-key": ({"Authorization": "Bearer nk_test_not_a_key"}, "invalid API key"),
    "empty-key": ({"Authorization": "Bearer"}, "missing bearer API key"),
    "basic-scheme": ({"Authorization": "Basic dXNlcjpwYXNz"}, "missing bearer API key"),
    "no-scheme": ({"Authorization": "nk_test_no_scheme"}, "missing bearer API key"),
}


async def test_missing_or_wrong_api_key_is_401_and_writes_nothing(
    api: Api, subtests: pytest.Subtests
) -> None:
    channel = f"/v1/channels/{api.a_channel['id']}"
    routes = [
        ("POST", "/v1/events", EVENT),
        ("POST", "/v1/events/batch", {"events": [EVENT]}),
        ("POST", "/v1/channels", WEBHOOK),
        ("PATCH", channel, {"name": "renamed"}),
        ("DELETE", channel, None),
        ("GET", "/v1/channels", None),
        ("GET", channel, None),
        ("GET", f"/v1/events/{api.b_event['id']}", None),
        ("GET", "/v1/deliveries", None),
        ("GET", f"/v1/deliveries/{api.b_delivery_id}", None),
    ]
    for name, (headers, message) in AUTH_HEADERS.items():
        async with api.client(headers) as anonymous:
            for method, path, body in routes:
                with subtests.test(auth=name, route=f"{method} {path}"):
                    await refused(
                        api, 401, "unauthorized", message,
                        client=anonymous, method=method, path=path, json=body,
                    )  # fmt: skip
    assert (await api.a.get(channel)).json()["name"] == "a-all"
    # The right key next to a wrong one still works (the tenant cache is per key).
    assert (await api.a.get("/v1/channels")).status_code == 200


async def test_two_authorization_headers_are_400_and_write_nothing(
    api: Api, subtests: pytest.Subtests
) -> None:
    """Two Authorization headers are ambiguous, whichever order the valid key comes in."""
    good = api.a.headers["authorization"]
    cases = {
        "valid-then-wrong": [good, "Bearer nk_test_wrong"],
        "wrong-then-valid": ["Bearer nk_test_wrong", good],
        "valid-twice": [good, good],
        "valid-then-empty": [good, ""],
    }
    for name, values in cases.items():
        async with api.client() as anonymous:
            for method, path, body in [
                ("POST", "/v1/events", EVENT),
                ("POST", "/v1/channels", WEBHOOK),
                ("GET", "/v1/channels", None),
            ]:
                with subtests.test(case=name, route=f"{method} {path}"):
                    headers = [("Authorization", value) for value in values]
                    await refused(
                        api, 400, "invalid_authorization", "more than one Authorization header",
                        client=anonymous, method=method, path=path, json=body, headers=headers,
                    )  # fmt: skip


async def test_unknown_route_is_404_and_writes_nothing(api: Api, subtests: pytest.Subtests) -> None:
    for method, path in [
        ("GET", "/v1/nope"),
        ("POST", "/v1/notifications"),
        ("POST", "/v2/events"),
        ("GET", "/v1/channels/not-a-uuid"),
        ("PATCH", "/v1/channels/not-a-uuid"),
        ("GET", "/v1/events/12345"),
        ("GET", "/v1/deliveries/12345"),
        ("GET", "/"),
    ]:
        with subtests.test(route=f"{method} {path}"):
            await refused(api, 404, "not_found", method=method, path=path, json=EVENT)


async def test_another_tenants_id_is_404_like_an_unknown_one(
    api: Api, subtests: pytest.Subtests
) -> None:
    """Tenant A asks for tenant B's channel, event and delivery: 404 exactly as for an id that
    does not exist, and B's rows are untouched."""
    b_channel = f"/v1/channels/{api.b_channel['id']}"
    b_view = (await api.b.get(b_channel)).json()
    for method, path, body in [
        ("GET", b_channel, None),
        ("PATCH", b_channel, {"name": "stolen", "enabled": False}),
        ("DELETE", b_channel, None),
        ("GET", f"/v1/events/{api.b_event['id']}", None),
        ("GET", f"/v1/deliveries/{api.b_delivery_id}", None),
    ]:
        with subtests.test(route=f"{method} {path}"):
            owner = await api.b.get(path)
            assert owner.status_code == 200, "B sees its own object"
            resp = await refused(
                api, 404, "not_found", "not found", method=method, path=path, json=body
            )
            unknown = path.rsplit("/", 1)[0] + f"/{uuid.uuid4()}"
            same = await api.a.request(method, unknown, json=body)
            assert (same.status_code, same.json()) == (404, resp.json()), "no hint it exists"
            assert (await api.b.get(path)).json() == owner.json()
    assert (await api.b.get(b_channel)).json() == b_view


async def test_wrong_method_is_405_and_writes_nothing(api: Api, subtests: pytest.Subtests) -> None:
    event = await post_event(api.a)
    channel = f"/v1/channels/{api.a_channel['id']}"
    for method, path, allowed in [
        ("PUT", "/v1/channels", "POST"),
        ("DELETE", "/v1/channels", "GET"),
        ("POST", channel, "PATCH"),
        ("PUT", channel, "DELETE"),
        ("GET", "/v1/events", "POST"),
        ("PATCH", f"/v1/events/{event['id']}", "GET"),
        ("DELETE", f"/v1/events/{event['id']}", "GET"),
        ("GET", "/v1/events/batch", "POST"),
        ("DELETE", "/v1/deliveries", "GET"),
        ("POST", "/healthz", "GET"),
    ]:
        with subtests.test(route=f"{method} {path}"):
            resp = await refused(
                api, 405, "method_not_allowed", method=method, path=path, json=EVENT
            )
            allow = {m.strip() for m in resp.headers["allow"].split(",")}
            assert allowed in allow
            assert method not in allow
    assert (await api.a.get(f"/v1/events/{event['id']}")).status_code == 200


MAX_BODY = 2048


async def _chunks(data: bytes, size: int = 512) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def padded(path: str, padding: int) -> bytes:
    event = {"type": "order.created", "payload": {"pad": "x" * padding}}
    channel = {"type": "webhook", "config": {"url": HOOK_URL, "headers": {"x-pad": "x" * padding}}}
    data = {"/v1/events": event, "/v1/events/batch": {"events": [event]}, "/v1/channels": channel}
    return json.dumps(data[path]).encode()


async def test_body_over_max_body_bytes_is_413_and_writes_nothing(
    api_db: str, subtests: pytest.Subtests
) -> None:
    async with open_api(api_db, ingest={"max_body_bytes": MAX_BODY}) as api:
        for path in ["/v1/events", "/v1/events/batch", "/v1/channels"]:
            for chunked in [False, True]:  # with a Content-Length, and streamed without one
                with subtests.test(route=path, chunked=chunked):
                    big = padded(path, MAX_BODY)
                    assert len(big) > MAX_BODY
                    await refused(
                        api, 413, "request_entity_too_large", method="POST", path=path,
                        content=_chunks(big) if chunked else big, headers=JSON,
                    )  # fmt: skip
                    # The same request under the limit goes through: only the size was refused.
                    small = await api.a.post(path, content=padded(path, 100), headers=JSON)
                    assert small.status_code in (201, 202), small.text


async def first_answer_to_expect_continue(base_url: str, length: int, auth: str | None) -> bytes:
    """Send the head of ``POST /v1/events`` with ``Expect: 100-continue`` (no body) and return
    the head of the first answer."""
    host, _, port = base_url.removeprefix("http://").rpartition(":")
    lines = [b"POST /v1/events HTTP/1.1", b"Host: notifier", b"Content-Type: application/json",
             b"Content-Length: %d" % length, b"Expect: 100-continue"]  # fmt: skip
    if auth:
        lines.append(b"Authorization: " + auth.encode())
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(b"\r\n".join(lines) + b"\r\n\r\n")
        answer = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in answer:
                chunk = await stream.receive_some(65536)
                assert chunk, answer
                answer += chunk
    return answer.partition(b"\r\n\r\n")[0]


async def test_expect_continue_over_the_size_limit_is_refused_without_100_continue(
    api_db: str, subtests: pytest.Subtests
) -> None:
    """A client asking before it sends a body over the limit gets its refusal (413, or 401
    without a key) without being invited to send it; under the limit it is invited."""
    async with open_api(api_db, ingest={"max_body_bytes": MAX_BODY}) as api:
        auth = api.a.headers["authorization"]
        cases = [(MAX_BODY + 1, auth, 413), (MAX_BODY + 1, None, 401), (10, auth, 100)]
        for length, key, status in cases:
            with subtests.test(length=length, key=bool(key)):
                head = await first_answer_to_expect_continue(api.running.base_url, length, key)
                assert head.startswith(b"HTTP/1.1 %d " % status), head


async def test_wrong_content_type_is_415_and_writes_nothing(
    api: Api, subtests: pytest.Subtests
) -> None:
    channel = f"/v1/channels/{api.a_channel['id']}"
    requests = [
        ("POST", "/v1/events", EVENT),
        ("POST", "/v1/events/batch", {"events": [EVENT]}),
        ("POST", "/v1/channels", WEBHOOK),
        ("PATCH", channel, {"name": "renamed"}),
    ]
    for content_type in [
        None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx", "text/json",
        "multipart/form-data; boundary=x",
    ]:  # fmt: skip
        headers = {"content-type": content_type} if content_type else {}
        for method, path, body in requests:
            with subtests.test(content_type=content_type, route=f"{method} {path}"):
                await refused(
                    api, 415, "unsupported_media_type", "application/json",
                    method=method, path=path, content=json.dumps(body).encode(), headers=headers,
                )  # fmt: skip
    assert (await api.a.get(channel)).json()["name"] == "a-all"
    # The very same bodies as JSON (any case, with parameters) go through.
    ok = {"content-type": "Application/JSON; charset=utf-8"}
    for method, path, body in requests:
        good = await api.a.request(method, path, content=json.dumps(body).encode(), headers=ok)
        assert good.status_code in (200, 201, 202), good.text


# -- 422 ----------------------------------------------------------------------------------------

Case = Callable[[Api], tuple[str, str, Any]]  # -> (method, path, body); bytes are sent as is


def ev(**fields: Any) -> Case:
    """POST /v1/events with ``EVENT`` changed by ``fields`` (``...`` leaves a field out)."""
    body = {k: v for k, v in (EVENT | fields).items() if v is not ...}
    return lambda api: ("POST", "/v1/events", body)


def ch(**fields: Any) -> Case:
    """POST /v1/channels with ``WEBHOOK`` changed by ``fields`` (``...`` leaves a field out)."""
    body = {k: v for k, v in (WEBHOOK | fields).items() if v is not ...}
    return lambda api: ("POST", "/v1/channels", body)


def batch(*events: dict[str, Any]) -> Case:
    return lambda api: ("POST", "/v1/events/batch", {"events": list(events)})


def patch(**fields: Any) -> Case:
    return lambda api: ("PATCH", f"/v1/channels/{api.a_channel['id']}", fields)


def raw(path: str, body: Any) -> Case:
    return lambda api: ("POST", path, body)


VALIDATION_CASES: dict[str, tuple[Case, str]] = {
    # events
    "event-missing-type": (ev(type=...), "type: missing required key"),
    "event-missing-payload": (ev(payload=...), "payload: missing required key"),
    "event-type-not-a-string": (ev(type=123), "type: Expected `str`, got `int`"),
    "event-type-malformed": (ev(type="order..created"), "type: Expected `str` matching"),
    # a pattern matches the whole text: Python's `$` alone would let a final newline through
    "event-type-trailing-newline": (ev(type="probe.created\n"), "type: Expected `str` matching"),
    "event-type-trailing-crlf": (ev(type="probe.created\r\n"), "type: Expected `str` matching"),
    "event-type-tab": (ev(type="probe.created\t"), "type: Expected `str` matching"),
    "event-type-non-ascii": (ev(type="probe.créé"), "type: Expected `str` matching"),
    "event-payload-array": (ev(payload=[1, 2]), "payload: Expected `object`, got `array`"),
    "event-payload-string": (ev(payload="x"), "payload: Expected `object`, got `str`"),
    "event-payload-null": (ev(payload=None), "payload: Expected `object`, got `null`"),
    "event-recipient-not-string": (ev(recipient=7), "recipient: Expected `str"),
    "event-recipient-empty": (ev(recipient=""), "recipient: Expected `str` of length >= 1"),
    "channel-ids-string": (ev(channel_ids="x"), "channel_ids: Expected `array"),
    "channel-ids-not-uuid": (ev(channel_ids=["nope"]), "channel_ids[0]: Invalid UUID"),
    "channel-ids-empty": (ev(channel_ids=[]), "channel_ids: Expected `array` of length >= 1"),
    "event-unknown-channel-id": (
        ev(channel_ids=[str(uuid.UUID(int=1))]),
        f"channel_ids: unknown channel ids: {uuid.UUID(int=1)}",
    ),
    "event-other-tenants-channel-id": (
        lambda api: (
            "POST",
            "/v1/events",
            EVENT | {"channel_ids": [api.a_channel["id"], api.b_channel["id"]]},
        ),
        "channel_ids: unknown channel ids:",
    ),
    "idempotency-key-empty": (ev(idempotency_key=""), "idempotency_key: Expected `str`"),
    "idempotency-key-long": (ev(idempotency_key="k" * 256), "idempotency_key: Expected `str`"),
    "event-unknown-field": (ev(priority="high"), "priority: unknown key"),
    "body-array": (raw("/v1/events", b"[]"), "body: Expected `object`, got `array`"),
    "body-null": (raw("/v1/events", b"null"), "body: Expected `object`, got `null`"),
    "body-string": (raw("/v1/events", b'"x"'), "body: Expected `object`, got `str`"),
    # batches
    "batch-item": (batch(EVENT, {"payload": {}}), "events[1].type: missing required key"),
    "batch-item-payload": (batch(EVENT, EVENT | {"payload": 1}), "events[1].payload: Expected"),
    "batch-empty": (batch(), "events: Expected `array` of length >= 1"),
    "batch-over-limit": (batch(*[EVENT] * 101), "events: at most 100 events per batch"),
    "batch-missing-events": (raw("/v1/events/batch", {}), "events: missing required key"),
    "batch-events-not-array": (raw("/v1/events/batch", {"events": {}}), "events: Expected"),
    # channels
    "url-ftp": (ch(config={"url": "ftp://hooks.example.com/"}), "config.url: scheme"),
    "url-javascript": (ch(config={"url": "javascript:alert(1)"}), "config.url: scheme"),
    "url-no-scheme": (ch(config={"url": "hooks.example.com/in"}), "config.url:"),
    "url-no-host": (ch(config={"url": "http://"}), "config.url:"),
    "url-user-info": (ch(config={"url": "https://u:p@hooks.example.com/"}), "config.url:"),
    "config-missing-url": (ch(config={}), "config.url: missing required key"),
    "config-url-int": (ch(config={"url": 5}), "config.url: Expected `str`, got `int`"),
    "config-extra": (ch(config={"url": HOOK_URL, "x": 1}), "config.x: unknown key"),
    "config-bad-secret": (ch(config={"url": HOOK_URL, "secret": "plain"}), "config.secret:"),
    "config-reserved-header": (
        ch(config={"url": HOOK_URL, "headers": {"Host": "evil.example"}}),
        "config.headers.Host:",
    ),
    # custom headers: token names, visible-ASCII values (the 422 names the header, not the value)
    "config-header-value-non-ascii": (
        ch(config={"url": HOOK_URL, "headers": {"X-Team": "café"}}),
        "config.headers.X-Team: ",
    ),
    "config-header-value-trailing-space": (
        ch(config={"url": HOOK_URL, "headers": {"X-Api-Token": "tok-1 "}}),
        "config.headers.X-Api-Token: the value must be visible ASCII",
    ),
    "config-header-name-tab": (
        ch(config={"url": HOOK_URL, "headers": {"X\tTeam": "x"}}),
        "config.headers.'X\\tTeam': is not a valid header name",
    ),
    "config-header-name-paren": (
        ch(config={"url": HOOK_URL, "headers": {"X(Team": "x"}}),
        "config.headers.'X(Team': ",
    ),
    "config-not-object": (ch(config="x"), "config: Expected `object`, got `str`"),
    "config-missing": (ch(config=...), "config: missing required key"),
    "channel-unknown-type": (ch(type="pigeon"), "type: channel type 'pigeon' is not enabled"),
    "channel-missing-type": (ch(type=...), "type: missing required key"),
    "channel-bad-pattern": (ch(event_types=["order.*.x"]), "event_types[0]: Expected `str`"),
    "channel-no-patterns": (ch(event_types=[]), "event_types: Expected `array` of length"),
    "channel-pattern-trailing-newline": (
        ch(event_types=["probe.*\n"]),
        "event_types[0]: Expected `str` matching",
    ),
    "channel-catch-all-trailing-newline": (
        ch(event_types=["a.b", "*\n"]),
        "event_types[1]: Expected `str` matching",
    ),
    "channel-max-attempts-0": (ch(max_attempts=0), "max_attempts: Expected `int` >= 1"),
    "channel-enabled-string": (ch(enabled="yes"), "enabled: Expected `bool`, got `str`"),
    "channel-rate-0": (ch(rate_limit_per_second=0), f"rate_limit_per_second: {AT_LEAST_HOURLY}"),
    "channel-rate-negative": (
        ch(rate_limit_per_second=-1),
        f"rate_limit_per_second: {AT_LEAST_HOURLY}",
    ),
    # a bucket's period is 1/rate: 1e20 s is past any time Postgres can keep
    "channel-rate-tiny": (
        ch(rate_limit_per_second=1e-20),
        f"rate_limit_per_second: {AT_LEAST_HOURLY}",
    ),
    "channel-rate-string": (
        ch(rate_limit_per_second="5"),
        "rate_limit_per_second: Expected `float | null`",
    ),
    "channel-rate-huge": (
        ch(rate_limit_per_second=1e9),
        "rate_limit_per_second: Expected `float` <= 10000",
    ),
    "channel-unknown-field": (ch(secret="x"), "secret: unknown key"),
    # channel patches
    "patch-url": (patch(config={"url": "file:///etc/passwd"}), "config.url:"),
    "patch-config-missing-url": (patch(config={"headers": {}}), "config.url: missing"),
    "patch-header-value-non-ascii": (
        patch(config={"url": HOOK_URL, "headers": {"X-Team": "café"}}),
        "config.headers.X-Team: ",
    ),
    "patch-header-name-paren": (
        patch(config={"url": HOOK_URL, "headers": {"X(Team": "x"}}),
        "config.headers.'X(Team': ",
    ),
    "patch-name-null": (patch(name=None), "name: Expected `str`, got `null`"),
    "patch-no-patterns": (patch(event_types=[]), "event_types: Expected `array` of length"),
    "patch-pattern-trailing-newline": (
        patch(event_types=["probe.*\n"]),
        "event_types[0]: Expected `str` matching",
    ),
    # bulk replay filters
    "replay-event-type-trailing-newline": (
        raw("/v1/deliveries/retry", {"event_type": "probe.*\n"}),
        "event_type: Expected `str`",
    ),
    "replay-status-trailing-newline": (
        raw("/v1/deliveries/retry", {"status": "DEAD\n"}),
        "status: Expected `str` matching",
    ),
    "patch-type": (patch(type="email"), "type: unknown key"),
    "patch-max-attempts": (patch(max_attempts=101), "max_attempts: Expected `int` <= 100"),
    "patch-rate-0": (patch(rate_limit_per_second=0), f"rate_limit_per_second: {AT_LEAST_HOURLY}"),
    "patch-rate-tiny": (
        patch(rate_limit_per_second=1 / 3601),
        f"rate_limit_per_second: {AT_LEAST_HOURLY}",
    ),
}


async def test_validation_error_is_422_naming_the_field_and_writes_nothing(
    api: Api, subtests: pytest.Subtests
) -> None:
    channel = f"/v1/channels/{api.a_channel['id']}"
    channel_view = (await api.a.get(channel)).json()
    for name, (case, mentions) in VALIDATION_CASES.items():
        with subtests.test(case=name):
            method, path, body = case(api)
            sent = {"content": body, "headers": JSON} if isinstance(body, bytes) else {"json": body}
            await refused(api, 422, "validation_error", mentions, method=method, path=path, **sent)
    assert (await api.a.get(channel)).json() == channel_view, "the patches changed nothing"


async def test_idempotency_key_header_and_body_field_must_agree(
    api: Api, subtests: pytest.Subtests
) -> None:
    for name, headers, body in [
        ("differs", {"Idempotency-Key": "k-1"}, EVENT | {"idempotency_key": "k-2"}),
        ("too-long", {"Idempotency-Key": "k" * 256}, EVENT),
        ("empty", {"Idempotency-Key": ""}, EVENT),
    ]:
        with subtests.test(case=name):
            await refused(
                api, 422, "validation_error", "dempotency",
                method="POST", path="/v1/events", json=body, headers=headers,
            )  # fmt: skip


NUL_CASES: dict[str, Case] = {
    "payload-value": ev(payload={"note": "a\u0000b"}),
    "payload-key": ev(payload={"a\u0000": 1}),
    "event-recipient": ev(recipient="alice\u0000"),
    "idempotency-key": ev(idempotency_key="k\u0000"),
    "batch-last-item": batch(EVENT, EVENT | {"payload": {"x": ["\u0000"]}}),
    "channel-name": ch(name="hook\u0000"),
    "channel-recipient": ch(recipient="\u0000"),
    "patch-name": patch(name="\u0000"),
    "list-recipient": lambda api: ("GET", "/v1/channels?recipient=%00", None),
    "list-type": lambda api: ("GET", "/v1/channels?type=a%00", None),
}


async def test_text_with_a_nul_character_is_422_not_500(
    api: Api, subtests: pytest.Subtests
) -> None:
    """Postgres ``text`` and ``jsonb`` cannot hold U+0000: bad input, not a server error."""
    for name, case in NUL_CASES.items():
        with subtests.test(case=name):
            method, path, body = case(api)
            await refused(api, 422, "validation_error", "NUL", method=method, path=path, json=body)


async def test_bad_query_parameter_is_422(api: Api, subtests: pytest.Subtests) -> None:
    for query, code, mentions in [
        ("limit=0", "invalid_parameter", "limit"),
        ("limit=501", "invalid_parameter", "limit"),
        ("limit=ten", "invalid_parameter", "limit"),
        ("limit=-1", "invalid_parameter", "limit"),
        ("limit=%C2%B2", "invalid_parameter", "limit"),  # '²': a digit to str.isdigit, not int
        ("limit=" + "9" * 5000, "invalid_parameter", "limit"),  # too long for int()
        ("status=LOST", "invalid_parameter", "status"),
        ("status=dead", "invalid_parameter", "status"),
        ("channel_id=abc", "invalid_parameter", "channel_id"),
        ("event_id=abc", "invalid_parameter", "event_id"),
        ("cursor=!!!", "invalid_cursor", "cursor"),
        ("cursor=bm90LWEtY3Vyc29y", "invalid_cursor", "cursor"),  # base64 of "not-a-cursor"
    ]:
        paths = ["/v1/deliveries"]
        if query.startswith(("limit", "cursor")):
            paths.append("/v1/channels")
        for path in paths:
            with subtests.test(route=path, query=query[:40]):
                await refused(api, 422, code, mentions, method="GET", path=f"{path}?{query}")


# -- idempotency --------------------------------------------------------------------------------


def keyed(via: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    """httpx request arguments carrying ``key`` in the body field or the header."""
    if via == "body":
        return {"json": body | {"idempotency_key": key}}
    return {"json": body, "headers": {"Idempotency-Key": key}}


@pytest.mark.parametrize("via", ["body", "header"])
async def test_same_idempotency_key_and_body_returns_the_first_answer(api: Api, via: str) -> None:
    body = {"type": "order.created", "payload": {"n": 1, "items": [1, 2]}, "recipient": None}
    first = await api.a.post("/v1/events", **keyed(via, "order-1", body))
    assert first.status_code == 202, first.text
    assert len(first.json()["deliveries"]) == 1
    after_first = await api.rows()

    other = "header" if via == "body" else "body"
    for args in [keyed(via, "order-1", body), keyed(other, "order-1", body)]:
        again = await api.a.post("/v1/events", **args)
        assert again.status_code == 200, again.text
        assert again.json() == first.json()
    # The payload's key order is not part of the identity of a request.
    reordered = body | {"payload": {"items": [1, 2], "n": 1}}
    again = await api.a.post("/v1/events", **keyed(via, "order-1", reordered))
    assert (again.status_code, again.json()) == (200, first.json())

    assert await api.rows() == after_first
    stored = await sql(
        api.db, "SELECT id FROM events WHERE tenant_id = $1 AND idempotency_key = $2",
        api.tenant_a, "order-1",
    )  # fmt: skip
    assert [str(r["id"]) for r in stored] == [first.json()["id"]]


async def test_idempotency_keys_are_per_tenant(api: Api) -> None:
    first = await api.a.post("/v1/events", json=EVENT | {"idempotency_key": "shared"})
    other = await api.b.post("/v1/events", json=EVENT | {"idempotency_key": "shared"})
    assert (first.status_code, other.status_code) == (202, 202)
    assert first.json()["id"] != other.json()["id"]


@pytest.mark.parametrize("via", ["body", "header"])
async def test_same_idempotency_key_with_another_body_is_409(
    api: Api, via: str, subtests: pytest.Subtests
) -> None:
    first = await api.a.post("/v1/events", **keyed(via, "order-1", EVENT))
    assert first.status_code == 202, first.text
    for name, change in {
        "payload": {"payload": {"n": 2}},
        "payload-extra-key": {"payload": {"n": 1, "m": 1}},
        "type": {"type": "order.updated"},
        "recipient": {"recipient": "alice"},
        "channel-ids": {"channel_ids": [api.a_channel["id"]]},
    }.items():
        with subtests.test(change=name):
            await refused(
                api, 409, "idempotency_conflict", "order-1",
                method="POST", path="/v1/events", **keyed(via, "order-1", EVENT | change),
            )  # fmt: skip
    stored = (await api.a.get(f"/v1/events/{first.json()['id']}")).json()
    assert (stored["type"], stored["payload"], stored["recipient"]) == (
        EVENT["type"], EVENT["payload"], None,
    )  # fmt: skip


# -- channels -----------------------------------------------------------------------------------


async def stored_config(api: Api, channel_id: str) -> dict[str, Any]:
    raw = await scalar(api.db, "SELECT config FROM channels WHERE id = $1", uuid.UUID(channel_id))
    config: dict[str, Any] = json.loads(raw)
    return config


async def test_channel_create_list_read_patch_delete(api: Api) -> None:
    resp = await api.a.post(
        "/v1/channels",
        json={
            "type": "webhook", "name": "orders", "config": {"url": HOOK_URL},
            "recipient": "alice", "event_types": ["order.*"], "max_attempts": 3,
        },
    )  # fmt: skip
    assert resp.status_code == 201, resp.text
    created = resp.json()
    cid = created["id"]
    secret = created["config"]["secret"]
    assert secret.startswith("whsec_"), "a generated secret, returned once"
    assert created["config"]["url"] == HOOK_URL
    assert {k: created[k] for k in ("type", "name", "recipient", "event_types")} == {
        "type": "webhook", "name": "orders", "recipient": "alice", "event_types": ["order.*"],
    }  # fmt: skip
    assert (created["enabled"], created["max_attempts"]) == (True, 3)
    assert (await stored_config(api, cid))["secret"] == secret

    # Read and list: the same channel, never the secret.
    read = (await api.a.get(f"/v1/channels/{cid}")).json()
    assert "secret" not in read["config"]
    assert read == created | {
        "config": {k: v for k, v in created["config"].items() if k != "secret"}
    }
    listed = (await api.a.get("/v1/channels")).json()
    assert [c["id"] for c in listed["items"]] == [api.a_channel["id"], cid]
    assert listed["next_cursor"] is None
    assert all("secret" not in c["config"] for c in listed["items"])
    assert secret not in (await api.a.get("/v1/channels")).text
    # Another tenant neither lists nor reads it.
    assert cid not in {c["id"] for c in (await api.b.get("/v1/channels")).json()["items"]}

    # Patch: only the named fields change; a new config without a secret keeps the secret.
    patched = await api.a.patch(
        f"/v1/channels/{cid}",
        json={"name": "orders-v2", "config": {"url": "https://hooks.example.com/v2"},
              "recipient": None, "enabled": False},
    )  # fmt: skip
    assert patched.status_code == 200, patched.text
    view = patched.json()
    assert (view["name"], view["recipient"], view["enabled"]) == ("orders-v2", None, False)
    assert (view["event_types"], view["max_attempts"]) == (["order.*"], 3)
    assert view["config"]["url"] == "https://hooks.example.com/v2"
    assert "secret" not in view["config"]
    assert secret not in patched.text
    assert view["disabled_reason"] == "disabled through the API"
    assert view["disabled_at"] is not None
    assert (await stored_config(api, cid))["secret"] == secret
    assert (await api.a.get(f"/v1/channels/{cid}")).json() == view

    # Delete: gone for reads, lists, patches and a second delete; its deliveries stay.
    await api.a.patch(f"/v1/channels/{cid}", json={"enabled": True})
    (delivery,) = (await post_event(api.a, channel_ids=[cid]))["deliveries"]
    before = await api.rows()
    deleted = await api.a.delete(f"/v1/channels/{cid}")
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert await api.rows() == before | {"channels": before["channels"] - 1}
    assert_error(await api.a.get(f"/v1/channels/{cid}"), 404, "not_found")
    assert_error(await api.a.delete(f"/v1/channels/{cid}"), 404, "not_found")
    assert_error(await api.a.patch(f"/v1/channels/{cid}", json={"name": "x"}), 404, "not_found")
    assert cid not in {c["id"] for c in (await api.a.get("/v1/channels")).json()["items"]}
    kept = await api.a.get(f"/v1/deliveries/{delivery['id']}")
    assert (kept.status_code, kept.json()["channel_id"]) == (200, cid)
    assert_error(
        await api.a.post("/v1/events", json=EVENT | {"channel_ids": [cid]}), 422, "validation_error"
    )


async def test_a_channels_rate_limit_is_set_at_create_changed_by_patch_and_shown(
    api: Api,
) -> None:
    created = await make_channel(api.a, config={"url": HOOK_URL}, rate_limit_per_second=5)
    assert created["rate_limit_per_second"] == 5.0
    cid = created["id"]
    assert api.a_channel["rate_limit_per_second"] is None  # no limit unless asked
    stored = "SELECT rate_limit_per_second FROM channels WHERE id = $1"
    assert await scalar(api.db, stored, uuid.UUID(cid)) == 5.0
    # a PATCH naming another field keeps it; one naming it changes it; null removes it
    renamed = (await api.a.patch(f"/v1/channels/{cid}", json={"name": "x"})).json()
    assert renamed["rate_limit_per_second"] == 5.0
    slower = await api.a.patch(f"/v1/channels/{cid}", json={"rate_limit_per_second": 0.5})
    assert slower.status_code == 200, slower.text
    assert slower.json()["rate_limit_per_second"] == 0.5
    assert (await api.a.get(f"/v1/channels/{cid}")).json()["rate_limit_per_second"] == 0.5
    unlimited = await api.a.patch(f"/v1/channels/{cid}", json={"rate_limit_per_second": None})
    assert unlimited.json()["rate_limit_per_second"] is None
    assert await scalar(api.db, stored, uuid.UUID(cid)) is None
    listed = (await api.a.get("/v1/channels")).json()["items"]
    assert all("rate_limit_per_second" in c for c in listed)


async def test_channel_secret_given_at_create_is_returned_once_and_kept(api: Api) -> None:
    secret = "whsec_" + "A" * 44  # base64 of 33 bytes
    created = await make_channel(api.a, config={"url": HOOK_URL, "secret": secret})
    assert created["config"]["secret"] == secret
    cid = created["id"]
    assert "secret" not in (await api.a.get(f"/v1/channels/{cid}")).json()["config"]
    # A patch that names a new secret replaces it, and does not echo it either.
    new = "whsec_" + "B" * 44
    resp = await api.a.patch(
        f"/v1/channels/{cid}", json={"config": {"url": HOOK_URL, "secret": new}}
    )
    assert resp.status_code == 200, resp.text
    assert "secret" not in resp.json()["config"]
    assert new not in resp.text, "the new secret is not shown"
    assert secret not in resp.text, "nor the replaced one"
    assert (await stored_config(api, cid))["secret"] == new


async def test_channel_list_filters_and_cursor_pagination(api: Api) -> None:
    made = [api.a_channel["id"]]
    for i in range(5):
        made.append((await make_channel(api.a, name=f"c{i}", recipient=f"r{i % 2}"))["id"])
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        query = "limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = (await api.a.get(f"/v1/channels?{query}")).json()
        assert len(page["items"]) <= 2
        seen += [c["id"] for c in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == made, "each channel exactly once, oldest first"
    by_recipient = (await api.a.get("/v1/channels?recipient=r1")).json()["items"]
    assert [c["name"] for c in by_recipient] == ["c1", "c3"]
    assert len((await api.a.get("/v1/channels?type=webhook")).json()["items"]) == 6
    assert (await api.a.get("/v1/channels?type=email")).json()["items"] == []


# -- batches ------------------------------------------------------------------------------------


async def test_batch_writes_all_events_in_one_transaction(api: Api) -> None:
    second = await make_channel(api.a, event_types=["user.*"])
    before = await api.rows()
    events = [
        {"type": "order.created", "payload": {"i": 0}},
        {"type": "user.signup", "payload": {"i": 1}, "idempotency_key": "signup-1"},
        {"type": "order.paid", "payload": {"i": 2}, "channel_ids": [second["id"]]},
    ]
    resp = await api.a.post("/v1/events/batch", json={"events": events})
    assert resp.status_code == 202, resp.text
    out = resp.json()["events"]
    assert [e["type"] for e in out] == ["order.created", "user.signup", "order.paid"]
    targets = [{d["channel_id"] for d in e["deliveries"]} for e in out]
    a_all, user = api.a_channel["id"], second["id"]
    assert targets == [{a_all}, {a_all, user}, {user}]

    assert await api.rows() == before | {
        "events": before["events"] + 3,
        "deliveries": before["deliveries"] + 4,
        "outbox": before["outbox"] + 4,
    }
    ids = [uuid.UUID(e["id"]) for e in out]
    rows = await sql(api.db, "SELECT id, created_at FROM events WHERE id = ANY($1)", ids)
    assert len(rows) == 3
    assert len({r["created_at"] for r in rows}) == 1, "one transaction: one now()"
    for event in out:
        assert (await api.a.get(f"/v1/events/{event['id']}")).json()["deliveries"] == event[
            "deliveries"
        ]

    # The keyed event again: seen before, so 200 with its first answer and nothing written.
    replay_before = await api.rows()
    again = await api.a.post("/v1/events/batch", json={"events": [events[1]]})
    assert (again.status_code, again.json()["events"]) == (200, [out[1]])
    assert await api.rows() == replay_before
    # Next to a new event: 202; the new one is written, the replay is not written again.
    mixed = await api.a.post("/v1/events/batch", json={"events": [events[1], events[0]]})
    assert mixed.status_code == 202, mixed.text
    assert mixed.json()["events"][0] == out[1]
    assert mixed.json()["events"][1]["id"] not in {e["id"] for e in out}
    assert await api.rows() == replay_before | {
        "events": replay_before["events"] + 1,
        "deliveries": replay_before["deliveries"] + 1,
        "outbox": replay_before["outbox"] + 1,
    }


async def test_batch_with_one_bad_item_writes_nothing(api: Api, subtests: pytest.Subtests) -> None:
    """Two good events and a bad one: nothing of the batch is written, whether the bad item is
    caught by validation, by the channel check or inside the transaction by Postgres."""
    await post_event(api.a, type="x", payload={"first": True}, idempotency_key="taken")
    good = [{"type": "order.created", "payload": {"i": i}} for i in range(2)]
    twin = {"type": "x", "payload": {"twin": 1}, "idempotency_key": "twin"}
    for name, bad, status, code, mentions in [
        ("invalid-item", {"payload": {}}, 422, "validation_error", "events[2].type"),
        ("unknown-channel", {"type": "x", "payload": {}, "channel_ids": [str(uuid.UUID(int=7))]},
         422, "validation_error", "channel_ids"),
        ("unstorable-text", {"type": "x", "payload": {"nul": "\u0000"}}, 422, "validation_error",
         "NUL"),
        ("key-conflict", {"type": "x", "payload": {"other": True}, "idempotency_key": "taken"},
         409, "idempotency_conflict", "taken"),
    ]:  # fmt: skip
        with subtests.test(case=name):
            await refused(
                api, status, code, mentions,
                method="POST", path="/v1/events/batch", json={"events": [*good, bad]},
            )  # fmt: skip
    with subtests.test(case="key-twice-in-one-batch"):
        other_twin = twin | {"payload": {"twin": 2}}
        await refused(
            api, 409, "idempotency_conflict", "twin",
            method="POST", path="/v1/events/batch", json={"events": [twin, *good, other_twin]},
        )  # fmt: skip


# -- events and deliveries ----------------------------------------------------------------------


async def test_get_event_returns_payload_and_current_delivery_statuses(api: Api) -> None:
    second = await make_channel(api.a)
    posted = await post_event(
        api.a, type="order.created", payload={"n": 1, "nested": {"a": [1, "b"]}},
        idempotency_key="e-1",
    )  # fmt: skip
    got = (await api.a.get(f"/v1/events/{posted['id']}")).json()
    assert got == posted | {
        "payload": {"n": 1, "nested": {"a": [1, "b"]}},
        "idempotency_key": "e-1",
        "payload_expunged_at": None,
    }
    assert {d["channel_id"] for d in got["deliveries"]} == {api.a_channel["id"], second["id"]}
    assert all(d["status"] == "PENDING" for d in got["deliveries"])

    # What the workers write shows on the next read.
    done = got["deliveries"][0]["id"]
    await sql(api.db, "UPDATE deliveries SET status = 'DELIVERED' WHERE id = $1", uuid.UUID(done))
    again = (await api.a.get(f"/v1/events/{posted['id']}")).json()
    assert {d["id"]: d["status"] for d in again["deliveries"]} == {
        d["id"]: "DELIVERED" if d["id"] == done else "PENDING" for d in got["deliveries"]
    }


async def test_get_delivery_includes_its_attempts(api: Api) -> None:
    event = await post_event(api.a)
    (summary,) = event["deliveries"]
    did = uuid.UUID(summary["id"])
    fresh = (await api.a.get(f"/v1/deliveries/{did}")).json()
    assert fresh == {
        "id": str(did), "event_id": event["id"], "channel_id": api.a_channel["id"],
        "channel_type": "webhook", "status": "PENDING", "attempt": 0, "max_attempts": 5,
        "last_error": None, "next_attempt_at": None, "delivered_at": None,
        "created_at": event["created_at"], "attempts": [],
    }  # fmt: skip

    # Two attempts, as a worker records them: a retried 503, then a delivery.
    await sql(
        api.db,
        """INSERT INTO delivery_attempts
               (delivery_id, attempt, started_at, duration_ms, outcome, status_code, error,
                response_excerpt, delivery_created_at)
           SELECT $1, a.*, (SELECT created_at FROM deliveries WHERE id = $1)
           FROM (VALUES (1, now() - interval '1 minute', 40, 'retry', 503, 'HTTP 503', NULL),
                        (2, now(), 12, 'delivered', 200, NULL, '{"ok": true}')) AS a""",
        did,
    )
    await sql(
        api.db,
        """UPDATE deliveries SET status = 'DELIVERED', attempt = 2, delivered_at = now(),
               last_error = NULL WHERE id = $1""",
        did,
    )
    detail = (await api.a.get(f"/v1/deliveries/{did}")).json()
    assert (detail["status"], detail["attempt"]) == ("DELIVERED", 2)
    assert detail["delivered_at"] is not None
    attempts = detail["attempts"]
    assert [sorted(a) for a in attempts] == [
        ["attempt", "duration_ms", "error", "outcome", "response_excerpt", "span_id",
         "started_at", "status_code", "trace_id"]
    ] * 2  # fmt: skip
    assert [(a["trace_id"], a["span_id"]) for a in attempts] == [(None, None)] * 2  # untraced
    assert [(a["attempt"], a["outcome"], a["status_code"], a["duration_ms"], a["error"],
             a["response_excerpt"])
            for a in attempts] == [(1, "retry", 503, 40, "HTTP 503", None),
                                   (2, "delivered", 200, 12, None, '{"ok": true}')]  # fmt: skip
    assert attempts[0]["started_at"] < attempts[1]["started_at"]
    # The list shows deliveries without their attempts.
    listed = (await api.a.get(f"/v1/deliveries?event_id={event['id']}")).json()["items"]
    assert listed == [{k: v for k, v in detail.items() if k != "attempts"}]


async def test_delivery_list_cursor_pagination_covers_everything_once(api: Api) -> None:
    for _ in range(2):
        await make_channel(api.a)
    # 3 channels; a batch of 4 events (one created_at for all 12 deliveries, so the id breaks
    # the ties) and 2 single events: 18 deliveries.
    batch_events = [{"type": "order.created", "payload": {"i": i}} for i in range(4)]
    resp = await api.a.post("/v1/events/batch", json={"events": batch_events})
    assert resp.status_code == 202, resp.text
    for _ in range(2):
        await post_event(api.a)
    expected = [
        str(r["id"])
        for r in await sql(
            api.db,
            "SELECT id FROM deliveries WHERE tenant_id = $1 ORDER BY created_at DESC, id DESC",
            api.tenant_a,
        )
    ]
    assert len(expected) == 18

    async def walk(query: str) -> tuple[list[str], int]:
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            url = f"/v1/deliveries?{query}" + (f"&cursor={cursor}" if cursor else "")
            page = (await api.a.get(url)).json()
            assert page["items"], "no empty page before the end"
            seen += [d["id"] for d in page["items"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                return seen, pages

    seen, pages = await walk("limit=5")
    assert len(seen) == len(set(seen)), "pages do not overlap"
    assert seen == expected, "every delivery once, newest first"
    assert pages == 4
    # An exact multiple of the page size ends without an empty page.
    seen, pages = await walk("limit=6")
    assert (seen, pages) == (expected, 3)
    # Filters and pagination together.
    channel = api.a_channel["id"]
    seen, pages = await walk(f"limit=4&channel_id={channel}")
    assert seen == [
        str(r["id"])
        for r in await sql(
            api.db,
            "SELECT id FROM deliveries WHERE channel_id = $1 ORDER BY created_at DESC, id DESC",
            uuid.UUID(channel),
        )
    ]
    assert (len(seen), pages) == (6, 2)


async def test_delivery_list_filters(api: Api) -> None:
    second = await make_channel(api.a)
    e1 = await post_event(api.a)
    e2 = await post_event(api.a)
    ids = {(e["id"], d["channel_id"]): d["id"] for e in (e1, e2) for d in e["deliveries"]}
    assert len(ids) == 4
    dead = ids[(e1["id"], second["id"])]
    delivered = ids[(e2["id"], api.a_channel["id"])]
    await sql(api.db, "UPDATE deliveries SET status = 'DEAD' WHERE id = $1", uuid.UUID(dead))
    await sql(
        api.db, "UPDATE deliveries SET status = 'DELIVERED' WHERE id = $1", uuid.UUID(delivered)
    )

    async def listed(query: str) -> set[str]:
        page = (await api.a.get(f"/v1/deliveries?{query}")).json()
        assert page["next_cursor"] is None
        return {d["id"] for d in page["items"]}

    assert await listed("") == set(ids.values()), "only the tenant's own deliveries"
    assert await listed("status=DEAD") == {dead}
    assert await listed("status=DELIVERED") == {delivered}
    assert await listed("status=PENDING") == set(ids.values()) - {dead, delivered}
    assert await listed("status=RETRYING") == set()
    assert await listed(f"channel_id={second['id']}") == {
        ids[(e1["id"], second["id"])],
        ids[(e2["id"], second["id"])],
    }
    assert await listed(f"event_id={e2['id']}") == {
        ids[(e2["id"], second["id"])],
        ids[(e2["id"], api.a_channel["id"])],
    }
    assert await listed(f"event_id={e1['id']}&status=DEAD&channel_id={second['id']}") == {dead}
    assert await listed(f"event_id={e2['id']}&status=DEAD") == set()
    # Another tenant's channel or event as a filter shows nothing of theirs.
    assert await listed(f"channel_id={api.b_channel['id']}") == set()
    assert await listed(f"event_id={api.b_event['id']}") == set()


# -- fan-out ------------------------------------------------------------------------------------


async def load_channels(db: str, tenants: list[uuid.UUID]) -> list[Channel]:
    rows = await sql(db, "SELECT * FROM channels WHERE tenant_id = ANY($1)", tenants)
    return [
        Channel(**dict(r) | {"config": json.loads(r["config"]), "event_types": r["event_types"]})
        for r in rows
    ]


async def test_fanout_goes_to_exactly_the_matching_channels(
    api: Api, subtests: pytest.Subtests
) -> None:
    """The SQL fan-out, ``notifier.testing.fanout_targets`` and the rule as written in
    docs/architecture.md §3 agree, case by case."""
    names = {"a-all": api.a_channel["id"], "b-all": api.b_channel["id"]}
    for name, fields in {
        "orders": {"event_types": ["order.*"]},
        "order-created": {"event_types": ["order.created"]},
        "ord-prefix": {"event_types": ["ord.*", "order"]},
        "users-or-billing": {"event_types": ["user.signup", "billing.*"]},
        "alice-all": {"recipient": "alice"},
        "bob-orders": {"recipient": "bob", "event_types": ["order.*"]},
        "disabled": {"enabled": False},
        "disabled-alice": {"recipient": "alice", "enabled": False},
    }.items():
        names[name] = (await make_channel(api.a, name=name, **fields))["id"]
    name_of = {v: k for k, v in names.items()}
    channels = await load_channels(api.db, [api.tenant_a, api.tenant_b])
    assert len(channels) == len(names)

    cases: list[tuple[dict[str, Any], set[str]]] = [
        ({"type": "order.created"}, {"a-all", "orders", "order-created"}),
        ({"type": "order.created.v2"}, {"a-all", "orders"}),
        ({"type": "order"}, {"a-all", "ord-prefix"}),
        ({"type": "ord.x"}, {"a-all", "ord-prefix"}),
        ({"type": "orders.created"}, {"a-all"}),
        ({"type": "order_created"}, {"a-all"}),
        ({"type": "user.signup"}, {"a-all", "users-or-billing"}),
        ({"type": "user.signup.late"}, {"a-all"}),
        ({"type": "billing.invoice.paid"}, {"a-all", "users-or-billing"}),
        ({"type": "order.created", "recipient": "alice"}, {"alice-all"}),
        ({"type": "order.created", "recipient": "bob"}, {"bob-orders"}),
        ({"type": "user.signup", "recipient": "bob"}, set()),
        ({"type": "order.created", "recipient": "carol"}, set()),
        ({"type": "x.y", "channel_ids": ["orders", "alice-all"]}, {"orders", "alice-all"}),
        ({"type": "x.y", "channel_ids": ["bob-orders"], "recipient": "zed"}, {"bob-orders"}),
        ({"type": "x.y", "channel_ids": ["disabled", "order-created"]}, {"order-created"}),
        ({"type": "x.y", "channel_ids": ["disabled"]}, set()),
    ]
    for fields, want in cases:
        with subtests.test(**{k: str(v) for k, v in fields.items()}):
            body = {"payload": {}, **fields}
            if "channel_ids" in fields:
                body["channel_ids"] = [names[n] for n in fields["channel_ids"]]
            before = await api.rows()
            event = await post_event(api.a, **body)
            got = {name_of[d["channel_id"]] for d in event["deliveries"]}
            python = fanout_targets(
                channels, tenant_id=api.tenant_a, event_type=fields["type"],
                recipient=fields.get("recipient"),
                channel_ids=[uuid.UUID(i) for i in body["channel_ids"]] if "channel_ids" in body
                else None,
            )  # fmt: skip
            assert got == want, "the SQL fan-out"
            assert {name_of[str(c.id)] for c in python} == want, "fanout_targets"
            # One delivery and one outbox row per target, nothing else (zero is fine).
            assert await api.rows() == before | {
                "events": before["events"] + 1,
                "deliveries": before["deliveries"] + len(want),
                "outbox": before["outbox"] + len(want),
            }
            in_db = await sql(
                api.db,
                "SELECT d.channel_id, o.routing_key FROM deliveries d "
                "JOIN outbox o ON o.delivery_id = d.id WHERE d.event_id = $1",
                uuid.UUID(event["id"]),
            )
            assert sorted(name_of[str(r["channel_id"])] for r in in_db) == sorted(want)
            assert {r["routing_key"] for r in in_db} <= {"webhook"}


# -- health -------------------------------------------------------------------------------------


async def test_healthz_and_readyz_answer_200(api: Api) -> None:
    async with api.client() as anonymous:  # these need no API key
        health = await anonymous.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        ready = await anonymous.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {
            "status": "ready",
            "checks": {"database": "ok", "schema": "ok", "broker": "ok"},
            "schema": {"status": "current", "version": LATEST, "expected": LATEST},
        }
