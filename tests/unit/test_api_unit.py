"""The HTTP API (docs/architecture.md §8) on the in-memory store
(``notifier.testing.api.MemoryApiStore``): routes, statuses, error bodies, idempotency, pagination
and replay, without Postgres. The integration tests (tests/integration/test_api.py) prove the same
answers on the real SQL."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio
import trio.testing
from quart import typing as quart_typing
from trio.testing import MockClock

from notifier.adapters.specs import build_validators
from notifier.config import parse_config
from notifier.ingest.app import create_app
from notifier.ingest.tenants import hash_api_key
from notifier.store.errors import IdempotencyConflict, UnknownChannels
from notifier.store.rows import DestinationCircuit, IngestResult, NewEvent
from notifier.store.versions import LATEST, SchemaState
from notifier.testing import RecordingAdapter
from notifier.testing.api import MemoryApiStore

WEBHOOK = {"type": "webhook", "name": "hook", "config": {"url": "https://hooks.example.com/in"}}
EVENT = {"type": "order.created", "payload": {"n": 1}}


@dataclass
class Answer:
    status: int
    body: Any
    headers: Mapping[str, str]


@dataclass
class Api:
    """The app on a ``MemoryApiStore`` with two tenants, ``a`` and ``b``."""

    store: MemoryApiStore
    client: quart_typing.TestClientProtocol

    async def call(
        self, method: str, path: str, *, key: str | None = "a", json: Any = None,
        data: bytes | None = None, headers: dict[str, str] | None = None,
    ) -> Answer:  # fmt: skip
        """``json`` None sends no body (or ``data``, as it is)."""
        sent = dict(headers or {})
        if key is not None:
            sent["Authorization"] = f"Bearer key-{key}"
        body: dict[str, Any] = {"json": json} if json is not None else {"data": data or b""}
        resp = await self.client.open(path, method=method, headers=sent, **body)
        got = await resp.get_json() if resp.mimetype == "application/json" else None
        return Answer(resp.status_code, got, resp.headers)

    def rows(self) -> tuple[int, int, int, int]:
        s = self.store
        return len(s.channels), len(s.events), len(s.deliveries), len(s.enqueued)

    async def channel(self, key: str = "a", **fields: Any) -> dict[str, Any]:
        answer = await self.call("POST", "/v1/channels", key=key, json={**WEBHOOK, **fields})
        assert answer.status == 201, answer.body
        body: dict[str, Any] = answer.body
        return body

    async def event(self, key: str = "a", **fields: Any) -> dict[str, Any]:
        answer = await self.call("POST", "/v1/events", key=key, json={**EVENT, **fields})
        assert answer.status == 202, answer.body
        body: dict[str, Any] = answer.body
        return body


@pytest.fixture
async def api() -> Api:
    store = MemoryApiStore()
    for name in ("a", "b"):
        await store.create_tenant(name, hash_api_key(f"key-{name}"))
    config = parse_config({"workers": {"webhook": {}}}, env={})
    app = create_app(store, config, {"webhook": RecordingAdapter("webhook")})
    return Api(store, app.test_client())


def error_code(answer: Answer) -> str:
    assert set(answer.body) == {"error"}
    assert set(answer.body["error"]) == {"code", "message"}
    code: str = answer.body["error"]["code"]
    return code


# -- channels -----------------------------------------------------------------------------------


async def test_a_channel_is_created_read_listed_changed_and_deleted(api: Api) -> None:
    created = await api.channel(name="first", event_types=["order.*"])
    path = f"/v1/channels/{created['id']}"
    assert created["name"] == "first"
    assert created["enabled"] is True

    got = await api.call("GET", path)
    assert got.status == 200
    assert got.body["id"] == created["id"]

    listed = await api.call("GET", "/v1/channels")
    assert [c["id"] for c in listed.body["items"]] == [created["id"]]
    assert listed.body["next_cursor"] is None

    patched = await api.call("PATCH", path, json={"name": "renamed", "enabled": False})
    assert patched.status == 200, patched.body
    assert patched.body["name"] == "renamed"
    assert patched.body["enabled"] is False
    assert patched.body["disabled_reason"] == "disabled through the API"
    assert patched.body["event_types"] == ["order.*"]  # not named: kept

    assert (await api.call("DELETE", path)).status == 204
    assert error_code(await api.call("GET", path)) == "not_found"
    assert (await api.call("DELETE", path)).status == 404


async def test_a_channels_health_shows_the_circuit_of_its_destination() -> None:
    store = MemoryApiStore()
    await store.create_tenant("a", hash_api_key("key-a"))
    # the webhook's own validator, which names a config's destination as its adapter does
    config = parse_config({"workers": {"webhook": {"allow_private_networks": True}}}, env={})
    api = Api(store, create_app(store, config, build_validators(config)).test_client())
    first = await api.channel()
    second = await api.channel(config={"url": "https://HOOKS.example.com:443/other"})
    elsewhere = await api.channel(config={"url": "http://[::1]:8080/x"})
    closed = {
        "destination": "https://hooks.example.com:443", "state": "closed",
        "consecutive_failures": 0, "opened_at": None, "next_probe_at": None,
    }  # fmt: skip
    assert first["health"]["circuit"] == closed
    opened = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    api.store.circuits[("webhook", "https://hooks.example.com:443")] = DestinationCircuit(
        state="open", consecutive_failures=7, opened_at=opened,
        next_probe_at=opened + timedelta(seconds=40),
    )  # fmt: skip

    listed = {c["id"]: c for c in (await api.call("GET", "/v1/channels")).body["items"]}

    expected = {
        **closed, "state": "open", "consecutive_failures": 7,
        "opened_at": "2026-01-02T03:04:05Z", "next_probe_at": "2026-01-02T03:04:45Z",
    }  # fmt: skip
    # one destination, one circuit, whatever the path or the host's case
    assert listed[first["id"]]["health"]["circuit"] == expected
    assert listed[second["id"]]["health"]["circuit"] == expected
    assert listed[elsewhere["id"]]["health"]["circuit"] == {
        **closed,
        "destination": "http://[::1]:8080",
    }
    got = await api.call("GET", f"/v1/channels/{first['id']}")
    assert got.body["health"]["circuit"] == expected


async def test_channels_are_listed_a_page_at_a_time(api: Api) -> None:
    ids = [(await api.channel(name=f"c{n}"))["id"] for n in range(5)]
    seen, cursor = [], None
    while True:
        query = "/v1/channels?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = await api.call("GET", query)
        assert page.status == 200
        assert len(page.body["items"]) <= 2
        seen += [c["id"] for c in page.body["items"]]
        cursor = page.body["next_cursor"]
        if cursor is None:
            break
    assert seen == ids


async def test_a_patched_config_keeps_the_stored_secret(api: Api) -> None:
    created = await api.channel(config={"url": "https://a.example/in", "secret": "s3"})
    path = f"/v1/channels/{created['id']}"
    patched = await api.call("PATCH", path, json={"config": {"url": "https://b.example/in"}})
    assert patched.status == 200, patched.body
    stored = api.store.channels[uuid.UUID(created["id"])]
    assert stored.config == {"url": "https://b.example/in", "secret": "s3"}


async def test_bad_channel_bodies_are_refused_and_write_nothing(api: Api) -> None:
    before = api.rows()
    missing = await api.call("POST", "/v1/channels", json={"type": "webhook"})
    assert (missing.status, error_code(missing)) == (422, "validation_error")
    unknown = await api.call("POST", "/v1/channels", json={**WEBHOOK, "type": "pager"})
    assert (unknown.status, error_code(unknown)) == (422, "validation_error")
    assert "not enabled" in unknown.body["error"]["message"]
    json_type = {"Content-Type": "application/json"}
    broken = await api.call("POST", "/v1/channels", headers=json_type, data=b'{"type": ')
    assert broken.status == 400
    untyped = await api.call("POST", "/v1/channels", data=b"{}")
    assert (untyped.status, error_code(untyped)) == (415, "unsupported_media_type")
    assert api.rows() == before


# -- tenants ------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, "nobody"])
async def test_without_a_valid_api_key_the_answer_is_401(api: Api, key: str | None) -> None:
    answer = await api.call("POST", "/v1/events", key=key, json=EVENT)
    assert (answer.status, error_code(answer)) == (401, "unauthorized")
    assert api.rows() == (0, 0, 0, 0)


async def test_another_tenants_rows_are_not_found(api: Api) -> None:
    channel = await api.channel(key="b")
    event = await api.event(key="b")
    (delivery,) = event["deliveries"]
    for method, path in [
        ("GET", f"/v1/channels/{channel['id']}"),
        ("PATCH", f"/v1/channels/{channel['id']}"),
        ("DELETE", f"/v1/channels/{channel['id']}"),
        ("GET", f"/v1/events/{event['id']}"),
        ("GET", f"/v1/deliveries/{delivery['id']}"),
        ("POST", f"/v1/deliveries/{delivery['id']}/retry"),
    ]:
        json = {"name": "x"} if method == "PATCH" else None
        answer = await api.call(method, path, key="a", json=json)
        assert (answer.status, error_code(answer)) == (404, "not_found"), (method, path)
    assert (await api.call("GET", "/v1/channels", key="a")).body["items"] == []
    assert (await api.call("GET", "/v1/deliveries", key="a")).body["items"] == []


# -- events -------------------------------------------------------------------------------------


async def test_an_event_fans_out_and_reads_back_with_its_payload(api: Api) -> None:
    order = await api.channel(event_types=["order.*"])
    await api.channel(event_types=["invoice.*"])
    event = await api.event()
    assert [d["channel_id"] for d in event["deliveries"]] == [order["id"]]
    assert event["deliveries"][0]["status"] == "PENDING"
    got = await api.call("GET", f"/v1/events/{event['id']}")
    assert got.status == 200
    assert got.body["payload"] == {"n": 1}
    assert api.store.enqueued == [uuid.UUID(event["deliveries"][0]["id"])]


async def test_an_idempotency_key_replays_the_event_and_conflicts_for_another_body(
    api: Api,
) -> None:
    await api.channel()
    first = await api.call("POST", "/v1/events", json=EVENT, headers={"Idempotency-Key": "k1"})
    assert first.status == 202
    again = await api.call("POST", "/v1/events", json=EVENT, headers={"Idempotency-Key": "k1"})
    assert again.status == 200
    assert again.body == first.body
    before = api.rows()
    other = {**EVENT, "payload": {"n": 2}}
    conflict = await api.call("POST", "/v1/events", json=other, headers={"Idempotency-Key": "k1"})
    assert (conflict.status, error_code(conflict)) == (409, "idempotency_conflict")
    assert api.rows() == before


async def test_a_batch_is_stored_whole_or_not_at_all(api: Api) -> None:
    await api.channel()
    batch = {"events": [{**EVENT, "idempotency_key": f"b{n}"} for n in range(3)]}
    stored = await api.call("POST", "/v1/events/batch", json=batch)
    assert stored.status == 202
    assert len(stored.body["events"]) == 3
    replayed = await api.call("POST", "/v1/events/batch", json=batch)
    assert replayed.status == 200
    assert replayed.body == stored.body

    before = api.rows()
    clash = {"events": [{**EVENT, "idempotency_key": "new"},
                        {**EVENT, "idempotency_key": "b0", "payload": {"n": 9}}]}  # fmt: skip
    assert (await api.call("POST", "/v1/events/batch", json=clash)).status == 409
    unknown = {"events": [{**EVENT, "channel_ids": [str(uuid.uuid4())]}]}
    answer = await api.call("POST", "/v1/events/batch", json=unknown)
    assert (answer.status, error_code(answer)) == (422, "validation_error")
    assert api.rows() == before


async def test_bad_events_are_refused_and_write_nothing(api: Api) -> None:
    await api.channel()
    for body in [{"type": "a b", "payload": {}}, {"type": "a"}, {**EVENT, "extra": 1}]:
        answer = await api.call("POST", "/v1/events", json=body)
        assert (answer.status, error_code(answer)) == (422, "validation_error"), body
    assert api.rows()[1:] == (0, 0, 0)


async def test_postgres_unavailable_is_a_503_with_retry_after(api: Api) -> None:
    api.store.unavailable = True
    answer = await api.call("GET", "/v1/channels")
    assert (answer.status, error_code(answer)) == (503, "unavailable")
    assert answer.headers["Retry-After"] == "5"


# -- deliveries and replay ----------------------------------------------------------------------


async def test_deliveries_are_listed_newest_first_a_page_at_a_time(api: Api) -> None:
    await api.channel()
    events = [await api.event(payload={"n": n}) for n in range(5)]
    newest_first = [e["deliveries"][0]["id"] for e in reversed(events)]
    seen, cursor = [], None
    while True:
        query = "/v1/deliveries?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = await api.call("GET", query)
        assert page.status == 200, page.body
        seen += [d["id"] for d in page.body["items"]]
        cursor = page.body["next_cursor"]
        if cursor is None:
            break
    assert seen == newest_first
    only = await api.call("GET", f"/v1/deliveries?event_id={events[0]['id']}")
    assert [d["id"] for d in only.body["items"]] == [events[0]["deliveries"][0]["id"]]
    for query in ["status=LOST", "limit=0", "cursor=nonsense"]:
        bad = await api.call("GET", f"/v1/deliveries?{query}")
        assert bad.status == 422, query


async def test_a_finished_delivery_is_replayed_and_an_open_one_is_not(api: Api) -> None:
    await api.channel()
    (delivery,) = (await api.event())["deliveries"]
    path = f"/v1/deliveries/{delivery['id']}/retry"
    still_open = await api.call("POST", path)
    assert (still_open.status, error_code(still_open)) == (409, "not_replayable")

    api.store.settle(uuid.UUID(delivery["id"]), "DEAD", attempt=5, error="HTTP 500")
    replayed = await api.call("POST", path)
    assert replayed.status == 202, replayed.body
    assert replayed.body["status"] == "PENDING"
    # the replay is an entry of its own, numbered after the last attempt, with no error; the
    # budget (5 attempts) is counted from it
    assert (replayed.body["attempt"], replayed.body["max_attempts"]) == (6, 11)
    last = replayed.body["attempts"][-1]
    assert (last["attempt"], last["outcome"], last["error"]) == (6, "replayed", None)
    assert api.store.enqueued.count(uuid.UUID(delivery["id"])) == 2
    with_body = await api.call("POST", path, json={"force": True})
    assert with_body.status == 422


async def test_a_delivery_of_a_disabled_channel_is_not_replayed(api: Api) -> None:
    channel = await api.channel()
    (delivery,) = (await api.event())["deliveries"]
    api.store.settle(uuid.UUID(delivery["id"]), "DEAD")
    await api.call("PATCH", f"/v1/channels/{channel['id']}", json={"enabled": False})
    answer = await api.call("POST", f"/v1/deliveries/{delivery['id']}/retry")
    assert (answer.status, error_code(answer)) == (409, "not_replayable")
    assert "enable it first" in answer.body["error"]["message"]


async def test_an_expunged_payload_is_gone_and_its_deliveries_are_not_replayed(api: Api) -> None:
    channel = await api.channel()
    event = await api.event(payload={"email": "ada@example.com"})
    (delivery,) = event["deliveries"]
    path = f"/v1/events/{event['id']}/payload"
    in_flight = await api.call("DELETE", path)
    assert (in_flight.status, error_code(in_flight)) == (409, "deliveries_in_flight")
    assert (await api.call("GET", f"/v1/events/{event['id']}")).body["payload"] is not None

    api.store.settle(uuid.UUID(delivery["id"]), "DEAD", response_excerpt="thanks, ada")
    expunged = await api.call("DELETE", path)
    assert expunged.status == 200, expunged.body
    assert expunged.body["payload"] is None
    assert expunged.body["payload_expunged_at"] is not None
    assert (await api.call("GET", f"/v1/events/{event['id']}")).body == expunged.body
    assert (await api.call("DELETE", path)).body == expunged.body  # again: the same
    detail = (await api.call("GET", f"/v1/deliveries/{delivery['id']}")).body
    assert (detail["status"], [a["response_excerpt"] for a in detail["attempts"]]) == (
        "DEAD", [None],
    )  # fmt: skip
    assert (await api.call("DELETE", path, key="b")).status == 404
    assert (await api.call("DELETE", f"/v1/events/{uuid.uuid4()}/payload")).status == 404

    one = await api.call("POST", f"/v1/deliveries/{delivery['id']}/retry")
    assert (one.status, error_code(one)) == (409, "not_replayable")
    assert "expunged" in one.body["error"]["message"]
    bulk = await api.call(
        "POST", "/v1/deliveries/retry", json={"status": "DEAD", "channel_id": channel["id"]}
    )
    assert bulk.body == {"queued": 0, "more": False, "next_cursor": None}
    assert api.store.enqueued == [uuid.UUID(delivery["id"])]  # at ingest only


async def test_a_bulk_replay_walks_the_dead_deliveries_with_its_cursor(api: Api) -> None:
    await api.channel()
    ids = [(await api.event(payload={"n": n}))["deliveries"][0]["id"] for n in range(3)]
    for d in ids:
        api.store.settle(uuid.UUID(d), "DEAD")
    first = await api.call("POST", "/v1/deliveries/retry", json={"limit": 2})
    assert first.status == 202, first.body
    assert first.body["queued"] == 2
    assert first.body["more"] is True
    rest = await api.call(
        "POST", "/v1/deliveries/retry", json={"limit": 2, "cursor": first.body["next_cursor"]}
    )
    assert rest.body == {"queued": 1, "more": False, "next_cursor": None}
    statuses = {d: api.store.deliveries[uuid.UUID(d)].delivery.status for d in ids}
    assert set(statuses.values()) == {"PENDING"}
    other_type = await api.call("POST", "/v1/deliveries/retry", json={"event_type": "invoice.*"})
    assert other_type.body["queued"] == 0
    bad = await api.call("POST", "/v1/deliveries/retry", json={"status": "PENDING"})
    assert (bad.status, error_code(bad)) == (422, "validation_error")


# -- group commit of single events --------------------------------------------------------------


class HeldStore(MemoryApiStore):
    """Holds the first ``ingest_each`` once ``hold`` is armed, so that the requests arriving
    meanwhile are stored together in the next one; records the size of each."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: trio.Event | None = None
        self.batches: list[int] = []

    async def ingest_each(
        self, events: Sequence[tuple[uuid.UUID, NewEvent]], max_attempts: Mapping[str, int]
    ) -> list[IngestResult | IdempotencyConflict | UnknownChannels]:
        self.batches.append(len(events))
        if self.hold is not None and len(self.batches) == 1:
            await self.hold.wait()
        return await super().ingest_each(events, max_attempts)


@pytest.fixture
async def held() -> Api:
    store = HeldStore()
    for name in ("a", "b"):
        await store.create_tenant(name, hash_api_key(f"key-{name}"))
    config = parse_config({"workers": {"webhook": {}}}, env={})
    app = create_app(store, config, {"webhook": RecordingAdapter("webhook")})
    return Api(store, app.test_client())


async def concurrent_posts(api: Api, requests: list[dict[str, Any]]) -> list[Answer]:
    """The first request leads a held batch; the others, sent one after the other while it is
    held, are stored together in the next. Their answers, in order.

    The tests that call it run on a ``mock_clock`` that stands still: queued callers give up on
    a batch that has run ``GROUP_COMMIT_PATIENCE_SECONDS`` and store theirs beside it, and on a
    busy machine sending the requests one by one may take longer than that in real time."""
    store = api.store
    assert isinstance(store, HeldStore)
    store.batches.clear()
    store.hold = trio.Event()
    answers: dict[int, Answer] = {}

    async def post(i: int, request: dict[str, Any]) -> None:
        answers[i] = await api.call("POST", "/v1/events", **request)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i, request in enumerate(requests):
                nursery.start_soon(post, i, request)
                await trio.testing.wait_all_tasks_blocked()
            store.hold.set()
    assert store.batches == [1, len(requests) - 1]
    return [answers[i] for i in range(len(requests))]


async def test_requests_stored_together_each_get_their_own_answer(
    held: Api, mock_clock: MockClock
) -> None:
    await held.channel()
    first = await held.call("POST", "/v1/events", json=EVENT | {"idempotency_key": "k1"})
    assert first.status == 202
    before = held.rows()
    unknown = str(uuid.uuid4())
    answers = await concurrent_posts(held, [
        {"json": EVENT | {"payload": {"lead": 1}}},
        {"json": EVENT | {"payload": {"new": 1}}},
        {"json": EVENT, "headers": {"Idempotency-Key": "k1"}},  # a replay
        {"json": EVENT | {"payload": {"n": 2}, "idempotency_key": "k1"}},  # conflicts
        {"json": EVENT | {"channel_ids": [unknown]}},
        {"json": EVENT | {"idempotency_key": "k2"}, "key": "b"},  # another tenant
        {"json": EVENT | {"idempotency_key": "k1"}, "key": "b"},  # its own k1: new
    ])  # fmt: skip
    assert [a.status for a in answers] == [202, 202, 200, 409, 422, 202, 202]
    assert answers[2].body == first.body
    assert error_code(answers[3]) == "idempotency_conflict"
    assert "k1" in answers[3].body["error"]["message"]
    assert answers[4].body["error"]["message"] == f"channel_ids: unknown channel ids: {unknown}"
    assert held.rows()[1] == before[1] + 4  # the lead, the new one and tenant b's two
    ids = {a.body["id"] for a in answers if a.status == 202}
    assert len(ids) == 4


async def test_a_conflicting_request_stored_together_with_others_fails_alone(
    held: Api, mock_clock: MockClock
) -> None:
    await held.channel()
    before = held.rows()
    answers = await concurrent_posts(held, [
        {"json": EVENT | {"payload": {"lead": 1}}},
        {"json": EVENT | {"payload": {"i": 1}}},
        {"json": EVENT | {"idempotency_key": "same"}},
        {"json": EVENT | {"payload": {"other": 1}, "idempotency_key": "same"}},  # conflicts
        {"json": EVENT | {"idempotency_key": "same"}},  # a replay of the first "same"
        {"json": EVENT | {"payload": {"i": 2}}},
    ])  # fmt: skip
    assert [a.status for a in answers] == [202, 202, 202, 409, 200, 202]
    assert answers[4].body == answers[2].body
    assert held.rows()[1] == before[1] + 4


async def test_postgres_unavailable_fails_every_request_stored_together_with_503(
    held: Api, mock_clock: MockClock
) -> None:
    await held.channel()
    store = held.store
    assert isinstance(store, HeldStore)
    store.unavailable = True
    answers = await concurrent_posts(held, [{"json": EVENT | {"payload": {"i": i}}}
                                            for i in range(4)])  # fmt: skip
    assert {(a.status, error_code(a)) for a in answers} == {(503, "unavailable")}
    assert {a.headers["Retry-After"] for a in answers} == {"5"}


# -- readiness and the schema ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("applied", "status", "ready"),
    [
        (range(1, LATEST + 1), "current", True),
        (range(1, LATEST + 2), "ahead", True),  # a newer release migrated it: still served
        (range(1, LATEST), "behind", False),
        ((), "missing", False),
    ],
)
async def test_readyz_reports_the_schema_and_is_503_unless_migrated(
    api: Api, applied: range | tuple[int, ...], status: str, ready: bool
) -> None:
    api.store.schema = SchemaState(frozenset(applied))
    answer = await api.call("GET", "/readyz", key=None)
    assert answer.status == (200 if ready else 503)
    assert answer.body["schema"] == {
        "status": status, "version": max(applied, default=0), "expected": LATEST,
    }  # fmt: skip
    if ready:
        assert answer.body["checks"]["schema"] == "ok"
    else:
        assert "run `notifier migrate`" in answer.body["checks"]["schema"]


@pytest.mark.parametrize(
    ("applied", "unavailable", "ready"),
    [(range(1, LATEST + 1), False, 1.0), (range(1, LATEST), False, 0.0),
     (range(1, LATEST + 1), True, 0.0)],
)  # fmt: skip
async def test_metrics_report_the_readiness_of_readyz(
    api: Api, applied: range, unavailable: bool, ready: float
) -> None:
    api.store.schema = SchemaState(frozenset(applied))
    api.store.unavailable = unavailable
    resp = await api.client.get("/metrics")
    assert resp.status_code == 200
    text = (await resp.get_data()).decode()
    assert f"\nnotifier_ready {ready}\n" in text
    assert f"\nnotifier_database_up {0.0 if unavailable else 1.0}\n" in text


async def test_readyz_without_the_database_has_no_schema(api: Api) -> None:
    api.store.unavailable = True
    answer = await api.call("GET", "/readyz", key=None)
    assert answer.status == 503
    assert answer.body["schema"] is None
    assert answer.body["checks"]["schema"].startswith("unavailable")
