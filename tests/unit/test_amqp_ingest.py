"""AMQP ingest without sockets: what a message means (decoding, validation → the reason), its
dead-letter copy, and how a batch is stored and settled, over an in-memory store and broker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from notifier.broker.amqp_publisher import id_rounds
from notifier.broker.base import Confirm, Incoming, Outgoing, Settle
from notifier.broker.topology import ingest_topology
from notifier.catalog import CATALOG_CACHE_SECONDS, StoredCatalog
from notifier.config import Config, parse_config
from notifier.errors import ConfigError, StoreError, StoreUnavailable, UnstorableText
from notifier.ingest import jsonguard
from notifier.ingest.amqp_ingest import AmqpIngest, Outcome
from notifier.ingest.amqp_messages import (
    ERROR_CODE_HEADER,
    ERROR_HEADER,
    Parsed,
    Rejected,
    dead_letter_copy,
    parse_message,
)
from notifier.ingest.tenants import TenantCache
from notifier.lifecycle import Stop
from notifier.metrics import Metrics
from notifier.store.errors import IdempotencyConflict, UnknownChannels
from notifier.store.rows import Event, IngestResult, NewEvent
from notifier.testing import MemoryBroker

TENANTS = {"billing-app": "billing", "shop-app": "shop", "ghost-app": "ghost"}
TENANT_IDS = {"billing": uuid.UUID(int=1), "shop": uuid.UUID(int=2)}  # "ghost" does not exist
QUEUE, DLQ = "events.ingest", "events.ingest.dead"
PAUSE = 5.0
LINGER = 0.05
KNOWN_CHANNEL = uuid.UUID(int=100)  # billing's
OTHER_CHANNEL = uuid.UUID(int=200)  # shop's


def body(**fields: Any) -> bytes:
    return json.dumps({"type": "order.created", "payload": {"n": 1}, **fields}).encode()


def parse(
    data: bytes,
    *,
    app_id: str | None = "billing-app",
    message_id: str | None = None,
    content_type: str | None = None,
    max_body_bytes: int = 1000,
) -> Parsed | Rejected:
    return parse_message(
        data, app_id=app_id, message_id=message_id, content_type=content_type,
        tenants=TENANTS, max_body_bytes=max_body_bytes,
    )  # fmt: skip


# -- one message: what it is, or why it is refused ---------------------------------------------


@pytest.mark.parametrize(
    ("data", "options", "code", "message"),
    [
        # larger than ingest.max_body_bytes, as the HTTP API's 413
        (b"x" * 1001, {}, "request_entity_too_large", "over ingest.max_body_bytes (1000)"),
        # nobody said who sent it
        (body(), {"app_id": None}, "unknown_app_id", "has no app_id"),
        (body(), {"app_id": ""}, "unknown_app_id", "has no app_id"),
        # a sender [amqp_ingest] tenants does not know
        (body(), {"app_id": "stranger"}, "unknown_app_id", "'stranger' is not mapped"),
        # the sender comes before the body, like the API key before the body over HTTP
        (b"{not json", {"app_id": "stranger"}, "unknown_app_id", "'stranger'"),
        # labelled as something else than JSON
        (body(), {"content_type": "text/plain"}, "unsupported_media_type", "'text/plain'"),
        # not JSON at all, even where typed decoding would stop early
        (b"{not json", {}, "invalid_json", "body is not valid JSON"),
        (b"[1, 2", {}, "invalid_json", "body is not valid JSON"),
        (b"\xff\xfe", {}, "invalid_json", "body is not valid JSON"),
        (b"", {}, "invalid_json", "body is not valid JSON"),
        # JSON that breaks a rule of POST /v1/events, named by its field
        (b"[1, 2]", {}, "validation_error", "body: Expected `object`, got `array`"),
        (b'{"type": "a"}', {}, "validation_error", "payload: missing required key"),
        (body(payload=[1]), {}, "validation_error", "payload: Expected `object`"),
        (body(type="no spaces"), {}, "validation_error", "type:"),
        (body(colour="red"), {}, "validation_error", "colour: unknown key"),
        (body(channel_ids=["nope"]), {}, "validation_error", "channel_ids[0]:"),
        (body(idempotency_key=""), {}, "validation_error", "idempotency_key:"),
        # text Postgres cannot hold, wherever it is
        (body(payload={"a": {"b": ["\x00"]}}), {}, "validation_error", "NUL"),
        (body(payload={"\x00": 1}), {}, "validation_error", "NUL"),
        (body(recipient="a\x00b"), {}, "validation_error", "NUL"),
        (body(idempotency_key="k\x00"), {}, "validation_error", "NUL"),
        (body(), {"message_id": "m\x00"}, "validation_error", "NUL"),
    ],
)
def test_a_message_that_cannot_be_stored_says_why(
    data: bytes, options: dict[str, Any], code: str, message: str
) -> None:
    result = parse(data, **options)
    assert isinstance(result, Rejected), result
    assert result.code == code
    assert message in result.message


@pytest.mark.parametrize(
    ("fields", "message_id", "key"),
    [
        ({}, None, None),  # no key at all: every delivery is a new event
        ({}, "", None),  # an empty message_id is none
        ({}, "msg-1", "msg-1"),  # the AMQP message_id: a message delivered twice is a replay
        ({"idempotency_key": "k-1"}, None, "k-1"),
        ({"idempotency_key": "k-1"}, "msg-1", "k-1"),  # the body's key wins
    ],
)
def test_the_idempotency_key_is_the_bodys_else_the_message_id(
    fields: dict[str, Any], message_id: str | None, key: str | None
) -> None:
    result = parse(body(**fields), message_id=message_id)
    assert isinstance(result, Parsed), result
    assert result.tenant == "billing"
    assert result.event.idempotency_key == key


def test_a_valid_message_becomes_the_event_the_http_api_would_store() -> None:
    channel = str(KNOWN_CHANNEL)
    data = body(recipient="u-1", channel_ids=[channel], payload={"b": 2, "a": [1, "\\u0000"]})
    result = parse(data, app_id="shop-app", content_type="application/json; charset=utf-8")
    assert isinstance(result, Parsed), result
    assert result.tenant == "shop"
    event = result.event
    assert (event.type, event.recipient, event.channel_ids) == (
        "order.created", "u-1", [KNOWN_CHANNEL],
    )  # fmt: skip
    # an escaped backslash followed by "u0000" is six ordinary characters, not a NUL
    assert msgspec.json.decode(event.payload) == {"b": 2, "a": [1, "\\u0000"]}
    # the request hash ignores key order, as over HTTP
    again = parse(body(channel_ids=[channel], recipient="u-1",
                       payload={"a": [1, "\\u0000"], "b": 2}), app_id="shop-app")  # fmt: skip
    assert isinstance(again, Parsed)
    assert again.event.request_hash == event.request_hash


@pytest.mark.parametrize("depth", [100, 5000])
def test_a_deeply_nested_payload_is_refused_by_the_http_apis_rules(depth: int) -> None:
    deep = '{"type": "t", "payload": {"a": ' + "[" * depth + '"x"' + "]" * depth + "}}"
    result = parse(deep.encode(), max_body_bytes=100_000)
    assert result == Rejected("validation_error", f"body: {jsonguard.DEPTH_MESSAGE}")


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ('{"a": "\\u0000"}', "payload.a: " + jsonguard.NUL_MESSAGE),
        ('{"a": 1, "a": 2}', 'payload.a: duplicate key "a"'),
        ('{"a": "\\ud800"}', "payload.a: " + jsonguard.SURROGATE_MESSAGE),
    ],
)
def test_json_traps_are_refused_as_over_http(payload: str, problem: str) -> None:
    result = parse(('{"type": "t", "payload": ' + payload + "}").encode())
    assert result == Rejected("validation_error", problem)


class SettleLog:
    """Records each settlement (once per delivery tag) with the trio time it happened at."""

    def __init__(self) -> None:
        self.settled: dict[int, Settle] = {}
        self.at: dict[int, float] = {}

    def settle(self, delivery_tag: int, how: Settle) -> None:
        assert delivery_tag not in self.settled, f"message {delivery_tag} settled twice"
        self.settled[delivery_tag] = how
        self.at[delivery_tag] = trio.current_time()


class Messages:
    """Builds incoming messages with growing delivery tags, all settling into ``log``."""

    def __init__(self) -> None:
        self.log = SettleLog()
        self._tag = 0

    def __call__(
        self,
        data: bytes,
        *,
        app_id: str | None = "billing-app",
        message_id: str | None = None,
        headers: dict[str, Any] | None = None,
        properties: dict[str, Any] | None = None,
    ) -> Incoming:
        self._tag += 1
        return Incoming(
            data, message_id, self._tag, False, self.log, app_id=app_id, headers=headers,
            properties=properties,
        )  # fmt: skip


def test_the_dead_letter_copy_is_the_message_with_the_reason() -> None:
    stamp = datetime(2026, 1, 2, tzinfo=UTC)
    message = Messages()(
        b"{bad", message_id="m-1", app_id="billing-app", headers={"x-trace": "t-1"},
        properties={"correlation_id": "c-1", "timestamp": stamp, "type": "order"},
    )  # fmt: skip
    copy = dead_letter_copy(
        message, Rejected("invalid_json", "body is not valid JSON"), exchange=DLQ,
        routing_key=QUEUE,
    )  # fmt: skip
    assert (copy.exchange, copy.routing_key, copy.body, copy.message_id) == (
        DLQ, QUEUE, b"{bad", "m-1",
    )  # fmt: skip
    assert copy.headers == {
        "x-trace": "t-1",
        ERROR_HEADER: "body is not valid JSON",
        ERROR_CODE_HEADER: "invalid_json",
    }
    assert copy.properties == {
        "content_type": None,  # it had none: the copy gets none either
        "correlation_id": "c-1",
        "timestamp": stamp,
        "type": "order",
        "app_id": "billing-app",
    }


# -- a batch: one transaction, then settlements ------------------------------------------------


class FakeStore:
    """``ingest_each`` and ``tenant_ids_by_names`` in memory, with Postgres' rules: a key
    reused with another body is a conflict, the same body a replay; named channels must be the
    tenant's. ``down`` makes Postgres unreachable; an event of type ``poison`` fails the whole
    transaction as a text Postgres cannot hold would, one of type ``cursed`` with some other
    database error."""

    def __init__(self) -> None:
        self.down = False
        self.lookups: list[list[str]] = []
        self.transactions: list[list[NewEvent]] = []  # committed
        self._channels = {
            (TENANT_IDS["billing"], KNOWN_CHANNEL),
            (TENANT_IDS["shop"], OTHER_CHANNEL),
        }
        self._keys: dict[tuple[uuid.UUID, str], tuple[str, Event]] = {}
        self.catalogs: dict[uuid.UUID, StoredCatalog] = {}  # event-type catalogs by tenant
        self.catalog_lookups = 0

    async def event_catalog(self, tenant_id: uuid.UUID) -> StoredCatalog:
        await trio.lowlevel.checkpoint()
        if self.down:
            raise StoreUnavailable("Postgres unavailable")
        self.catalog_lookups += 1
        return self.catalogs.get(tenant_id, StoredCatalog(False, {}))

    async def stored_idempotency_keys(self, tenant_id: uuid.UUID, keys: list[str]) -> set[str]:
        await trio.lowlevel.checkpoint()
        if self.down:
            raise StoreUnavailable("Postgres unavailable")
        return {k for k in keys if (tenant_id, k) in self._keys}

    @property
    def stored(self) -> list[NewEvent]:
        return [e for t in self.transactions for e in t]

    async def tenant_ids_by_names(self, names: Sequence[str]) -> dict[str, uuid.UUID]:
        await trio.lowlevel.checkpoint()
        if self.down:
            raise StoreUnavailable("Postgres unavailable")
        self.lookups.append(list(names))
        return {n: TENANT_IDS[n] for n in names if n in TENANT_IDS}

    async def ingest_each(
        self, events: Sequence[tuple[uuid.UUID, NewEvent]], max_attempts: Any
    ) -> list[Outcome]:
        await trio.lowlevel.checkpoint()
        if self.down:
            raise StoreUnavailable("Postgres unavailable")
        if any(e.type == "poison" for _, e in events):
            raise UnstorableText("Postgres cannot store this text")
        if any(e.type == "cursed" for _, e in events):
            raise StoreError("Postgres error: something unexpected")
        keys = dict(self._keys)
        outcomes: list[Outcome] = []
        written = []
        for tenant_id, e in events:
            if missing := [c for c in e.channel_ids or () if (tenant_id, c) not in self._channels]:
                outcomes.append(UnknownChannels(missing))
                continue
            key = e.idempotency_key
            if key is not None and (tenant_id, key) in keys:
                request_hash, earlier = keys[(tenant_id, key)]
                if request_hash == e.request_hash:
                    outcomes.append(IngestResult(event=earlier, created=False))
                else:
                    outcomes.append(IdempotencyConflict(key))
                continue
            event = Event(
                id=e.id, type=e.type, recipient=e.recipient, payload={}, idempotency_key=key,
                created_at=datetime.now(UTC), deliveries=[],
            )  # fmt: skip
            if key is not None:
                keys[(tenant_id, key)] = (e.request_hash, event)
            written.append(e)
            outcomes.append(IngestResult(event=event, created=True))
        self._keys = keys
        self.transactions.append(written)
        return outcomes


def make_config(**amqp_ingest: Any) -> Config:
    section = {"enabled": True, "tenants": TENANTS, "store_retry_seconds": PAUSE,
               "batch_linger_seconds": LINGER, **amqp_ingest}  # fmt: skip
    return parse_config({"amqp_ingest": section, "workers": {"webhook": {}}}, env={})


class RoundsBroker(MemoryBroker):
    """Notes the message ids of each ``publish_batch`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds: list[list[str]] = []

    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        self.rounds.append([m.message_id for m in messages])
        return await super().publish_batch(messages)


class Setup:
    def __init__(self, *, broker: RoundsBroker | None = None, **amqp_ingest: Any) -> None:
        self.store = FakeStore()
        self.broker = broker or RoundsBroker()
        self.broker.declare(ingest_topology(QUEUE, DLQ, "quorum"))
        self.stop = Stop()
        self.metrics = Metrics()
        self.ingest = AmqpIngest(
            make_config(**amqp_ingest), self.store, self.broker, self.stop, self.metrics
        )
        self.message = Messages()

    @property
    def settled(self) -> dict[int, Settle]:
        return self.message.log.settled

    def dead(self) -> dict[str, tuple[str, str]]:
        """message_id → (error code, error) of what reached the dead-letter queue."""
        return {
            m.message_id: (m.headers[ERROR_CODE_HEADER], m.headers[ERROR_HEADER])
            for m in self.broker.queues[DLQ]
            if m.headers
        }


async def test_one_transaction_for_the_good_and_the_dead_letter_queue_for_the_bad(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup()
    batch = [
        s.message(body(), message_id="good-1"),
        s.message(body(), message_id="good-2", app_id="shop-app"),  # another tenant, same TX
        s.message(b"{", message_id="bad-json"),
        s.message(body(), message_id="no-tenant", app_id="ghost-app"),
        s.message(body(channel_ids=[str(OTHER_CHANNEL)]), message_id="foreign-channel"),
        s.message(body(idempotency_key="k"), message_id="first"),
        s.message(body(idempotency_key="k", payload={"n": 2}), message_id="conflict"),
        s.message(body(idempotency_key="k"), message_id="replay"),
    ]
    await s.ingest.handle(batch)
    assert len(s.store.transactions) == 1
    assert [e.idempotency_key for e in s.store.stored] == ["good-1", "good-2", "k"]
    assert s.dead() == {
        "bad-json": ("invalid_json", "body is not valid JSON: Input data was truncated"),
        "no-tenant": ("unknown_tenant",
                      "tenant 'ghost' (app_id 'ghost-app') does not exist or is disabled"),
        "foreign-channel": ("validation_error",
                            f"channel_ids: unknown channel ids: {OTHER_CHANNEL}"),
        "conflict": ("idempotency_conflict",
                     "idempotency key 'k' was already used with a different request"),
    }  # fmt: skip
    assert s.settled == {m.delivery_tag: Settle.ACK for m in batch}
    stats = s.ingest.statistics()
    assert (stats.batches, stats.transactions, stats.stored, stats.replays) == (1, 1, 3, 1)
    assert (stats.dead_lettered, stats.requeued) == (4, 0)
    ingested = s.metrics.registry.get_sample_value(
        "notifier_events_ingested_total", {"source": "amqp"}
    )
    assert ingested == 3  # new events only: the replay and the refused are not counted


ORDER_SCHEMA = {
    "type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "minimum": 1}},
}  # fmt: skip


async def test_the_event_type_catalog_dead_letters_what_it_refuses(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup()
    s.store.catalogs[TENANT_IDS["billing"]] = StoredCatalog(True, {"order.created": ORDER_SCHEMA})
    batch = [
        s.message(body(), message_id="good"),
        s.message(body(payload={"n": 0}), message_id="too-small"),
        s.message(body(type="order.unknown"), message_id="unregistered"),
        s.message(body(type="order.unknown"), message_id="other-tenant", app_id="shop-app"),
    ]
    await s.ingest.handle(batch)
    assert [e.idempotency_key for e in s.store.stored] == ["good", "other-tenant"]
    assert s.dead() == {
        "too-small": ("schema_violation", "payload at $.n: 0 is less than the minimum of 1 "
                      "(schema of event type 'order.created')"),
        "unregistered": ("unregistered_event_type", "type: 'order.unknown' is not in the "
                         "tenant's event-type catalog (strict_event_types is on)"),
    }  # fmt: skip
    assert s.settled == {m.delivery_tag: Settle.ACK for m in batch}
    # Read once per tenant, then from the cache until a change forgets it (or 30 s pass).
    await s.ingest.handle([s.message(body(), message_id="again")])
    assert s.store.catalog_lookups == 2


async def test_a_redelivered_message_stored_before_its_schema_changed_is_a_replay(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Stored, then the process stopped before the ack; meanwhile the type's schema changed so
    that the event no longer matches. The redelivery is acked as the replay it is, not
    dead-lettered as a schema violation (its event is stored); a new message is refused."""
    s = Setup()
    tenant = TENANT_IDS["billing"]
    await s.ingest.handle([s.message(body(payload={"n": 0}), message_id="stored")])
    assert [e.idempotency_key for e in s.store.stored] == ["stored"]
    s.store.catalogs[tenant] = StoredCatalog(False, {"order.created": ORDER_SCHEMA})
    await trio.sleep(CATALOG_CACHE_SECONDS)  # the cached catalog expired: the new one applies
    again = s.message(body(payload={"n": 0}), message_id="stored")
    new = s.message(body(payload={"n": 0}), message_id="new")
    await s.ingest.handle([again, new])
    assert s.settled[again.delivery_tag] == Settle.ACK
    assert s.settled[new.delivery_tag] == Settle.ACK
    assert s.dead() == {
        "new": ("schema_violation", "payload at $.n: 0 is less than the minimum of 1 "
                "(schema of event type 'order.created')"),
    }  # fmt: skip
    assert [e.idempotency_key for e in s.store.stored] == ["stored"]
    assert s.ingest.statistics().replays == 1


async def test_postgres_unreachable_holds_the_batch_then_requeues_it(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup()
    s.store.down = True
    good, bad = s.message(body()), s.message(b"nope", message_id="bad")
    await s.ingest.handle([good, bad])
    assert s.settled == {good.delivery_tag: Settle.REQUEUE, bad.delivery_tag: Settle.ACK}
    assert s.message.log.at[good.delivery_tag] == PAUSE  # held, not spun through the queue
    assert s.message.log.at[bad.delivery_tag] == 0  # refused for good, whatever Postgres does
    assert list(s.dead()) == ["bad"]
    assert s.store.stored == []
    assert s.ingest.statistics().requeued == 1


async def test_a_stop_request_ends_the_pause(mock_clock: trio.testing.MockClock) -> None:
    s = Setup()
    s.store.down = True
    message = s.message(body())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(s.ingest.handle, [message])
        await trio.sleep(1)
        s.stop.set()
    assert s.settled == {message.delivery_tag: Settle.REQUEUE}
    assert s.message.log.at[message.delivery_tag] == 1


async def test_an_event_that_fails_the_transaction_is_found_one_by_one(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup()
    batch = [s.message(body(type=t), message_id=t) for t in ("a", "poison", "b", "c")]
    await s.ingest.handle(batch)
    assert [e.type for e in s.store.stored] == ["a", "b", "c"]
    assert len(s.store.transactions) == 3  # the batch failed, then one each
    (code, reason) = s.dead()["poison"]
    assert code == "validation_error"
    assert "NUL" in reason
    assert set(s.settled.values()) == {Settle.ACK}


async def test_an_event_failing_for_another_reason_goes_back_to_the_queue_alone(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup()
    batch = [s.message(body(type=t), message_id=t) for t in ("a", "cursed", "b")]
    await s.ingest.handle(batch)
    assert [e.type for e in s.store.stored] == ["a", "b"]
    assert s.dead() == {}  # a database error is not the message's fault: never dead-lettered
    assert [s.settled[m.delivery_tag] for m in batch] == [Settle.ACK, Settle.REQUEUE, Settle.ACK]
    assert [s.message.log.at[m.delivery_tag] for m in batch] == [0, PAUSE, 0]
    assert s.ingest.statistics().store_failures == 1


async def test_a_dead_letter_copy_not_confirmed_returns_the_message_to_the_queue(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup()
    s.broker.nack_next = 1
    refused, good = s.message(b"{", message_id="bad"), s.message(body())
    await s.ingest.handle([refused, good])
    assert s.settled == {refused.delivery_tag: Settle.REQUEUE, good.delivery_tag: Settle.ACK}
    assert s.message.log.at[good.delivery_tag] == 0  # acked at once, after the commit
    assert s.message.log.at[refused.delivery_tag] == PAUSE


async def test_the_dead_letter_queue_gone_returns_the_message_to_the_queue(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup()
    s.broker.bindings.clear()  # the publish comes back unroutable
    refused = s.message(b"{")
    await s.ingest.handle([refused])
    assert s.settled == {refused.delivery_tag: Settle.REQUEUE}


async def test_tenant_ids_are_cached_but_unknown_names_are_asked_again(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup()
    await s.ingest.handle([s.message(body()), s.message(body(), app_id="ghost-app")])
    await s.ingest.handle([s.message(body()), s.message(body(), app_id="ghost-app")])
    assert s.store.lookups == [["billing", "ghost"], ["ghost"]]


async def test_the_tenant_cache_expires(mock_clock: trio.testing.MockClock) -> None:
    store = FakeStore()
    cache = TenantCache(store.tenant_ids_by_names, ttl_seconds=30)
    assert await cache.resolve(["billing"]) == {"billing": TENANT_IDS["billing"]}
    await trio.sleep(29)
    await cache.resolve(["billing"])
    await trio.sleep(2)
    await cache.resolve(["billing"])
    assert store.lookups == [["billing"], ["billing"]]


async def test_a_batch_is_what_arrives_within_the_linger_up_to_prefetch(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup(prefetch=3)
    send, receive = trio.open_memory_channel[Incoming](10)
    for n in range(5):
        send.send_nowait(s.message(body(), message_id=f"m-{n}"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(s.ingest.run, receive)
        await trio.sleep(LINGER * 2)
        assert [len(t) for t in s.store.transactions] == [3, 2]
        assert [s.message.log.at[tag] for tag in (3, 4)] == [0, LINGER]  # full; lingered
        send.send_nowait(s.message(body(), message_id="m-5"))
        await trio.sleep(LINGER / 2)
        s.stop.set()  # ends the linger: the batch in hand is stored
    assert [len(t) for t in s.store.transactions] == [3, 2, 1]
    assert s.message.log.at[6] == trio.current_time() == LINGER * 2.5
    assert set(s.settled.values()) == {Settle.ACK}
    assert s.ingest.statistics().received == 6


async def test_copies_with_the_same_message_id_are_never_in_flight_together(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup(broker=RoundsBroker())
    ids = ["a", "b", "a", None, "a", None, "b"]
    batch = [s.message(b"{", message_id=i) for i in ids]
    await s.ingest.handle(batch)
    # the ingest publishes the copies as one batch: the publisher keeps copies of one id apart
    assert s.broker.rounds == [["a", "b", "a", "", "a", "", "b"]]
    copies = [Outgoing("dlq", "q", b"", m.message_id or "") for m in batch]
    rounds = [[copies[i].message_id for i in indexes] for indexes in id_rounds(copies)]
    # a returned copy is matched to its publish by message_id (aiormq), so a repeated id waits
    # for the next round; messages without one get a unique id from the client
    assert rounds == [["a", "b", "", ""], ["a", "b"], ["a"]]
    assert s.settled == {m.delivery_tag: Settle.ACK for m in batch}


def test_the_ingest_queues() -> None:
    topology = ingest_topology(QUEUE, DLQ, "quorum")
    assert topology.exchanges == (DLQ,)
    main, dead = topology.queues
    # publishers use the default exchange; a message the broker gives up on lands in the DLQ
    assert (main.name, main.exchange, main.routing_key) == (QUEUE, "", QUEUE)
    assert main.arguments["x-queue-type"] == "quorum"
    assert main.arguments["x-dead-letter-exchange"] == DLQ
    assert "x-delivery-limit" not in main.arguments  # requeues while Postgres is down are fine
    assert (dead.name, dead.exchange, dead.routing_key) == (DLQ, DLQ, QUEUE)
    classic = ingest_topology(QUEUE, DLQ, "classic").queues[0].arguments
    assert classic == {
        "x-queue-type": "classic",
        "x-dead-letter-exchange": DLQ,
        "x-dead-letter-routing-key": QUEUE,
    }


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ({"enabled": True}, "amqp_ingest.tenants: must map at least one app_id when enabled"),
        ({"queue": ""}, "amqp_ingest.queue: must be 1 to 255 bytes"),
        ({"queue": "amq.events"}, "amqp_ingest.queue: names starting with 'amq.' are reserved"),
        ({"dead_letter_queue": "x" * 256}, "amqp_ingest.dead_letter_queue: must be 1 to 255"),
        ({"dead_letter_queue": "events.ingest"}, "amqp_ingest.dead_letter_queue: must differ"),
        ({"prefetch": 70_000}, "amqp_ingest.prefetch: must be at most 65535"),
        ({"prefetch": 0}, "amqp_ingest.prefetch: Expected `int` >= 1"),
        ({"tenants": {"app": ""}}, "amqp_ingest.tenants.app: tenant name must not be empty"),
        ({"tenants": {"": "billing"}}, "amqp_ingest.tenants: app_id '' must be 1 to 255 bytes"),
        ({"batch_linger_seconds": -1}, "amqp_ingest.batch_linger_seconds: Expected `float` >="),
        ({"store_retry_seconds": 0}, "amqp_ingest.store_retry_seconds: Expected `float` >"),
        ({"linger": 1}, "amqp_ingest.linger: unknown key"),
    ],
)
def test_the_config_is_checked(section: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"amqp_ingest": section}, env={})
    assert str(caught.value).startswith(error), str(caught.value)


def test_the_dead_letter_queue_defaults_to_the_queue_dot_dead() -> None:
    assert make_config(queue="in").amqp_ingest.dead_letter_queue_name == "in.dead"
    assert make_config(dead_letter_queue="bad").amqp_ingest.dead_letter_queue_name == "bad"


async def test_an_event_keeps_a_valid_traceparent_header_and_ignores_a_bad_one(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = Setup()
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    batch = [
        s.message(body(), message_id="traced", headers={"traceparent": good}),
        s.message(body(), message_id="bytes", headers={"traceparent": good.encode()}),
        s.message(body(), message_id="hostile", headers={"traceparent": "00-" + "z" * 52}),
        s.message(body(), message_id="plain"),
    ]
    await s.ingest.handle(batch)
    assert [(e.idempotency_key, e.traceparent) for e in s.store.stored] == [
        ("traced", good), ("bytes", good), ("hostile", None), ("plain", None),
    ]  # fmt: skip
    assert s.settled == {m.delivery_tag: Settle.ACK for m in batch}
