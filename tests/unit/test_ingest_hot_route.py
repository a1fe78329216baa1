"""The lean ingest routes (``notifier.ingest.api.hot``) answer as the quart app does: each case
is sent, as the server hands it over (an ASGI scope, the body in ``http.request`` messages), to
the app with the lean routes in front and to the quart app alone, each on a store of its own,
and the two answers must be the same — status, headers in order, and body (ids and times, which
differ between the two stores, masked)."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from hypercorn.typing import ASGIReceiveEvent, ASGISendEvent, HTTPScope

from notifier.config import parse_config
from notifier.ingest.api.hot import IngestRoutes, ingest_routes
from notifier.ingest.app import create_app
from notifier.ingest.tenants import hash_api_key
from notifier.metrics import Metrics
from notifier.store.rows import NewEvent
from notifier.testing import RecordingAdapter
from notifier.testing.api import MemoryApiStore

MAX_BODY = 16384
EVENT = {"type": "order.created", "payload": {"n": 1}}
KEY_A = "Bearer key-a"
App = Callable[[Any, Any, Any], Awaitable[None]]


@dataclass
class Request:
    method: str = "POST"
    path: str = "/v1/events"
    headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: Sequence[bytes] = (b"",)  # the body, as the messages bring it
    disconnect: bool = False  # the client goes away once the chunks are sent


def post(
    path: str = "/v1/events",
    body: Any = EVENT,
    *,
    auth: str | None = KEY_A,
    content_type: str | None = "application/json",
    extra: Sequence[tuple[str, str]] = (),
) -> Request:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = [("content-length", str(len(data)))]
    if auth is not None:
        headers.append(("authorization", auth))
    if content_type is not None:
        headers.append(("content-type", content_type))
    return Request("POST", path, [*headers, *extra], [data])


@dataclass
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class FailingStore(MemoryApiStore):
    """A store whose ingest fails unexpectedly (a bug): answered 500 without detail."""

    async def ingest_each(self, events: Any, max_attempts: Any) -> list[Any]:
        raise RuntimeError("a bug")

    async def ingest(self, tenant_id: uuid.UUID, events: Sequence[NewEvent], m: Any) -> Any:
        raise RuntimeError("a bug")


async def make_app(
    *, hot: bool, ingest: dict[str, Any] | None = None, store: MemoryApiStore | None = None
) -> tuple[App, MemoryApiStore]:
    store = store or MemoryApiStore()
    for name in ("a", "b"):
        await store.create_tenant(name, hash_api_key(f"key-{name}"))
    config = parse_config(
        {"ingest": {"max_body_bytes": MAX_BODY, **(ingest or {})}, "workers": {"webhook": {}}},
        env={},
    )
    app = create_app(store, config, {"webhook": RecordingAdapter("webhook")})
    front = ingest_routes(app)
    assert isinstance(front, IngestRoutes)
    return (front if hot else app), store


async def exchange(app: App, request: Request) -> Answer | None:
    """``request`` through ``app`` as the server hands it over; None when nothing is answered."""
    scope: HTTPScope = {
        "type": "http", "asgi": {"spec_version": "2.1", "version": "3.0"},
        "http_version": "1.1", "method": request.method, "scheme": "http",
        "path": request.path, "raw_path": request.path.encode(), "query_string": b"",
        "root_path": "", "client": ("203.0.113.7", 40000), "server": ("127.0.0.1", 8000),
        "headers": [(n.encode(), v.encode()) for n, v in request.headers], "extensions": {},
    }  # fmt: skip
    messages: list[ASGIReceiveEvent] = [
        {
            "type": "http.request",
            "body": c,
            "more_body": request.disconnect or i < len(request.chunks) - 1,
        }
        for i, c in enumerate(request.chunks)
    ]
    if request.disconnect:
        messages.append({"type": "http.disconnect"})
    sent: list[ASGISendEvent] = []

    async def receive() -> ASGIReceiveEvent:
        if messages:
            return messages.pop(0)
        await trio.sleep_forever()  # the connection stays open: no more messages
        raise AssertionError("unreachable")

    async def send(message: ASGISendEvent) -> None:
        sent.append(message)

    with trio.fail_after(5):
        await app(scope, receive, send)
    if not sent:
        return None
    start, *bodies = sent
    assert start["type"] == "http.response.start"
    body = b"".join(m["body"] for m in bodies if m["type"] == "http.response.body")
    return Answer(start["status"], list(start["headers"]), body)


_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def comparable(answer: Answer | None) -> Any:
    if answer is None:
        return None
    lengths = [v for n, v in answer.headers if n == b"content-length"]
    assert lengths == [str(len(answer.body)).encode()]  # each answer's own length is right
    body = _TIME.sub(b"<time>", _UUID.sub(b"<id>", answer.body))
    headers = [(n, v) for n, v in answer.headers if n != b"content-length"]
    return answer.status, headers, json.loads(body) if body else body


async def both(
    requests: Sequence[Request], **options: Any
) -> tuple[list[Answer | None], list[Answer | None]]:
    """Each of ``requests`` in turn, to the lean routes and to quart; both answer lists."""
    answers: list[list[Answer | None]] = []
    for hot in (True, False):
        app, _ = await make_app(hot=hot, **options)
        answers.append([await exchange(app, r) for r in requests])
    lean, quart = answers
    assert [comparable(a) for a in lean] == [comparable(a) for a in quart]
    return lean, quart


def status(answer: Answer | None) -> int:
    assert answer is not None
    return answer.status


def has_header(answer: Answer | None, name: bytes, value: bytes) -> bool:
    assert answer is not None
    return (name, value) in answer.headers


CASES: dict[str, tuple[list[Request], list[int]]] = {
    "an event": ([post()], [202]),
    "a batch": ([post("/v1/events/batch", {"events": [EVENT, EVENT]})], [202]),
    "no content type": ([post(content_type=None)], [415]),
    "text": ([post(content_type="text/plain")], [415]),
    "JSON with parameters": ([post(content_type="Application/JSON; charset=utf-8")], [202]),
    "two authorization headers": ([post(extra=[("authorization", KEY_A)])], [400]),
    "no key": ([post(auth=None)], [401]),
    "another scheme": ([post(auth="Basic key-a")], [401]),
    "an unknown key": ([post(auth="Bearer nope")], [401]),
    "a body over the limit": ([post(body={**EVENT, "payload": {"x": "y" * MAX_BODY}})], [413]),
    "a chunked body growing over the limit": (
        [
            Request(
                headers=[("authorization", KEY_A), ("content-type", "application/json")],
                chunks=[b'{"type": "a", "payload": {"x": "', b"y" * MAX_BODY, b'"}}'],
            )
        ],
        [413],
    ),
    "an over-long body with no key": (
        [post(body={**EVENT, "payload": {"x": "y" * MAX_BODY}}, auth=None)],
        [401],
    ),
    "a body in chunks": (
        [
            Request(
                headers=[("authorization", KEY_A), ("content-type", "application/json")],
                chunks=[b'{"type": "a",', b' "payload": {}}'],
            )
        ],
        [202],
    ),
    "not JSON": ([post(body=b"{nope")], [400]),
    "a payload that is no object": ([post(body={"type": "a", "payload": [1]})], [422]),
    "a duplicate key": ([post(body=b'{"type": "a", "type": "b", "payload": {}}')], [422]),
    "an integer written 3.0": (
        [post(body={**EVENT, "idempotency_key": "k", "payload": {"n": 3.0}})],
        [202],
    ),
    "a NUL in the type": ([post(body={"type": "a\u0000", "payload": {}})], [422]),
    "an unknown channel": ([post(body={**EVENT, "channel_ids": [str(uuid.uuid4())]})], [422]),
    "too many events in a batch": ([post("/v1/events/batch", {"events": [EVENT] * 101})], [422]),
    "an empty batch body": ([post("/v1/events/batch", {})], [422]),
    "a bad Idempotency-Key": ([post(extra=[("idempotency-key", " x")])], [422]),
    "an Idempotency-Key over 255": ([post(extra=[("idempotency-key", "k" * 256)])], [422]),
    "keys in body and header that differ": (
        [post(body={**EVENT, "idempotency_key": "a"}, extra=[("idempotency-key", "b")])],
        [422],
    ),
    "the same key and body again": (
        [post(extra=[("idempotency-key", "k1")]), post(extra=[("idempotency-key", "k1")])],
        [202, 200],
    ),
    "the same key in the body and in the header": (
        [post(body={**EVENT, "idempotency_key": "k1"}), post(extra=[("idempotency-key", "k1")])],
        [202, 200],
    ),
    "the same key with another body": (
        [
            post(extra=[("idempotency-key", "k1")]),
            post(body={**EVENT, "payload": {"n": 2}}, extra=[("idempotency-key", "k1")]),
        ],
        [202, 409],
    ),
    "a batch replayed": (
        [post("/v1/events/batch", {"events": [{**EVENT, "idempotency_key": "b1"}]})] * 2,
        [202, 200],
    ),
    "a batch in conflict": (
        [
            post("/v1/events/batch", {"events": [{**EVENT, "idempotency_key": "b1"}]}),
            post(
                "/v1/events/batch",
                {"events": [{"type": "x", "payload": {}, "idempotency_key": "b1"}]},
            ),
        ],
        [202, 409],
    ),
    "GET on the batch route": (
        [Request("GET", "/v1/events/batch", [("authorization", KEY_A)])],
        [405],
    ),
    "HEAD on the event route": (
        [Request("HEAD", "/v1/events", [("authorization", KEY_A)])],
        [405],
    ),
    "a path with a trailing slash": ([post("/v1/events/")], [404]),
}


@pytest.mark.parametrize("case", CASES)
async def test_the_lean_routes_answer_as_quart(case: str) -> None:
    requests, statuses = CASES[case]
    lean, _ = await both(requests)
    assert [status(a) for a in lean] == statuses


async def test_a_body_over_the_limit_closes_the_connection_and_others_do_not() -> None:
    too_large = post(body={**EVENT, "payload": {"x": "y" * MAX_BODY}})
    lean, _ = await both([too_large, post(), post(auth=None), post(body=b"{nope")])
    assert has_header(lean[0], b"connection", b"close")
    assert not any(has_header(a, b"connection", b"close") for a in lean[1:])
    # without a key, the body over the limit is not read either: the 401 closes the connection
    lean, _ = await both([post(body={**EVENT, "payload": {"x": "y" * MAX_BODY}}, auth=None)])
    assert has_header(lean[0], b"connection", b"close")


async def test_a_client_that_leaves_mid_body_is_not_answered() -> None:
    gone = Request(headers=[("authorization", KEY_A), ("content-type", "application/json")],
                   chunks=[b'{"type": "a", ', b'"payl'], disconnect=True)  # fmt: skip
    for hot in (True, False):
        app, store = await make_app(hot=hot)
        assert await exchange(app, gone) is None
        assert store.events == {}


async def test_the_limit_of_unauthorized_requests_answers_429_alike() -> None:
    options = {"unauthorized_per_address_per_second": 0.001, "unauthorized_burst": 2}
    lean, _ = await both([post(), post(auth="Bearer x1"), post(auth=None), post(auth="Bearer x2"),
                          post()], ingest=options)  # fmt: skip
    # the valid key, cached, takes no token: it is not refused with the others
    assert [status(a) for a in lean] == [202, 401, 401, 429, 202]
    assert has_header(lean[3], b"retry-after", b"1000")


async def test_the_rate_limit_answers_429_alike() -> None:
    options = {"rate_limit_per_second": 0.001, "rate_limit_burst": 100}
    batch = post("/v1/events/batch", {"events": [EVENT] * 100})
    lean, _ = await both([batch, post(), batch], ingest=options)
    assert [status(a) for a in lean] == [202, 429, 429]
    assert has_header(lean[1], b"retry-after", b"1000")


async def test_the_store_unavailable_answers_503_alike() -> None:
    for path in ("/v1/events", "/v1/events/batch"):
        body = EVENT if path == "/v1/events" else {"events": [EVENT]}
        answers = []
        for hot in (True, False):
            app, store = await make_app(hot=hot)
            await exchange(app, post(path, body))  # the key is cached
            store.unavailable = True
            answers.append(await exchange(app, post(path, body)))
        assert comparable(answers[0]) == comparable(answers[1])
        assert status(answers[0]) == 503
        assert has_header(answers[0], b"retry-after", b"5")


async def test_an_unexpected_failure_answers_500_alike_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for path in ("/v1/events", "/v1/events/batch"):
        body = EVENT if path == "/v1/events" else {"events": [EVENT]}
        answers = []
        for hot in (True, False):
            caplog.clear()
            app, _ = await make_app(hot=hot, store=FailingStore())
            with caplog.at_level(logging.ERROR, logger="notifier.ingest"):
                answers.append(await exchange(app, post(path, body)))
            logged = [r.getMessage() for r in caplog.records if r.name == "notifier.ingest"]
            assert logged == ["request failed"]
        assert comparable(answers[0]) == comparable(answers[1])
        assert status(answers[0]) == 500


async def test_other_scopes_go_on_to_quart() -> None:
    app, _ = await make_app(hot=True)
    health = await exchange(app, Request("GET", "/healthz"))
    assert status(health) == 200


async def test_each_answer_is_timed_by_route_and_status() -> None:
    store = MemoryApiStore()
    await store.create_tenant("a", hash_api_key("key-a"))
    config = parse_config({"workers": {"webhook": {}}}, env={})
    metrics = Metrics()
    app = ingest_routes(
        create_app(store, config, {"webhook": RecordingAdapter("webhook")}, metrics=metrics)
    )
    for request in (post(), post(), post(auth=None), post("/v1/events/batch", {"events": [EVENT]})):
        await exchange(app, request)

    def count(route: str, status: str) -> float | None:
        return metrics.registry.get_sample_value(
            "notifier_ingest_request_duration_seconds_count", {"route": route, "status": status}
        )

    assert count("/v1/events", "202") == 2
    assert count("/v1/events", "401") == 1
    assert count("/v1/events/batch", "202") == 1
    # other routes go to quart untimed
    await exchange(app, Request("GET", "/healthz"))
    assert count("/healthz", "200") is None
