"""AMQP ingest against the real RabbitMQ and Postgres: events published to ``events.ingest``
end up stored in batches (and delivered), bad ones in ``events.ingest.dead`` with the reason,
and nothing is acknowledged before it is committed."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import aiormq
import trio
from pamqp.commands import Basic

from notifier.config import Config
from notifier.ingest.amqp_ingest import AmqpIngest, run_amqp_ingest
from notifier.ingest.amqp_messages import ERROR_CODE_HEADER, ERROR_HEADER
from notifier.ingest.events import new_event
from notifier.ingest.models import EventIn
from notifier.lifecycle import Stop
from notifier.store import Store, open_store
from notifier.testing import open_sink
from tests.integration.conftest import (
    count_rows,
    create_tenant,
    make_config,
    poll,
    run_notifier,
    scalar,
    sql,
)

QUEUE, DLQ = "events.ingest", "events.ingest.dead"
APP, OTHER_APP = "billing-app", "shop-app"
TENANTS = {APP: "billing", OTHER_APP: "shop", "ghost-app": "ghost"}  # no tenant "ghost"
LONG_LINGER = 30.0  # with prefetch = the messages sent, a batch closes when it is full


class Message(NamedTuple):
    body: bytes
    app_id: str | None = APP
    message_id: str | None = None
    headers: dict[str, Any] | None = None
    content_type: str | None = None


class Got(NamedTuple):
    body: bytes
    app_id: str | None
    message_id: str | None
    headers: dict[str, Any]
    content_type: str | None


def event(n: int = 1, **fields: Any) -> bytes:
    return json.dumps({"type": "order.created", "payload": {"n": n}, **fields}).encode()


async def publish(url: str, messages: Sequence[Message]) -> None:
    """Publish to the ingest queue, as a producer would (each publish confirmed)."""

    async def run() -> None:
        conn = await aiormq.connect(url)
        try:
            ch = await conn.channel()
            for m in messages:
                await ch.basic_publish(
                    m.body, routing_key=QUEUE, mandatory=True,
                    properties=Basic.Properties(
                        app_id=m.app_id, message_id=m.message_id, headers=m.headers,
                        content_type=m.content_type, delivery_mode=2,
                    ),
                )  # fmt: skip
        finally:
            await conn.close()

    await trio.to_thread.run_sync(asyncio.run, run())


async def take_all(url: str, queue: str) -> list[Got]:
    """Every message in ``queue``, taken off it."""

    async def run() -> list[Got]:
        conn = await aiormq.connect(url)
        try:
            ch = await conn.channel()
            got = []
            while True:
                m = await ch.basic_get(queue, no_ack=True)
                if isinstance(m.delivery, Basic.GetEmpty):
                    return got
                p = m.header.properties
                got.append(
                    Got(m.body, p.app_id, p.message_id, dict(p.headers or {}), p.content_type)
                )
        finally:
            await conn.close()

    return await trio.to_thread.run_sync(asyncio.run, run())


def ingest_config(database_url: str, broker_url: str, **amqp_ingest: Any) -> Config:
    section = {"enabled": True, "tenants": TENANTS, **amqp_ingest}
    return make_config(database_url, broker_url, amqp_ingest=section)


@asynccontextmanager
async def running_ingest(config: Config, store: Store | None = None) -> AsyncIterator[AmqpIngest]:
    """AMQP ingest alone (on a store of its own unless given one); stopped gracefully on exit."""
    stop = Stop()
    async with AsyncExitStack() as stack:
        if store is None:
            store = await stack.enter_async_context(open_store(config.database.url))
        nursery = await stack.enter_async_context(trio.open_nursery())
        ingest: AmqpIngest = await nursery.start(run_amqp_ingest, config, store, stop)
        yield ingest
        stop.set()


async def wait_until(check: Callable[[], bool]) -> None:
    async def checked() -> bool:
        return check()

    await poll(checked)


async def ready(url: str, queue: str) -> int:
    """Messages waiting in ``queue`` (not counting those delivered to a consumer): once every
    consumer has stopped, the messages nobody acknowledged."""

    async def run() -> int:
        conn = await aiormq.connect(url)
        try:
            ch = await conn.channel()
            ok = await ch.queue_declare(queue, passive=True)
            assert ok.message_count is not None
            return ok.message_count
        finally:
            await conn.close()

    return await trio.to_thread.run_sync(asyncio.run, run())


async def add_channel(url: str, tenant: str) -> uuid.UUID:
    channel_id = uuid.uuid4()
    await sql(
        url,
        "INSERT INTO channels (id, tenant_id, type, config) "
        "SELECT $1, id, 'webhook', '{\"url\": \"http://127.0.0.1:9/\"}'::jsonb "
        "FROM tenants WHERE name = $2",
        channel_id, tenant,
    )  # fmt: skip
    return channel_id


async def test_published_events_are_stored_and_delivered_to_the_webhook(
    database_url: str, broker_url: str, vhost: str
) -> None:
    config = ingest_config(database_url, broker_url)
    key = await create_tenant(database_url, "billing")
    async with open_sink() as sink, run_notifier(config) as running, running.client(key) as api:
        ch = await api.post("/v1/channels", json={"type": "webhook", "config": {"url": sink.url}})
        assert ch.status_code == 201, ch.text
        await publish(broker_url, [
            Message(event(1), message_id="m-1"),
            Message(event(2, idempotency_key="k-2"), message_id="m-2"),
            Message(event(3), content_type="application/json"),
        ])  # fmt: skip
        with trio.fail_after(30):
            got = await sink.wait_for(3)
        assert sorted(r.json()["data"]["n"] for r in got) == [1, 2, 3]
        assert {r.json()["type"] for r in got} == {"order.created"}
        with trio.fail_after(10):
            await poll(lambda: _delivered(database_url, 3))
    keys = await sql(database_url, "SELECT idempotency_key FROM events ORDER BY payload->>'n'")
    # the AMQP message_id is the key when the body has none; the body's key wins (and aiormq
    # gives every message it publishes a message_id)
    assert [r[0] for r in keys][:2] == ["m-1", "k-2"]
    assert keys[2][0]
    counts = await count_rows(database_url)
    assert (counts["events"], counts["deliveries"], counts["outbox"]) == (3, 3, 0)
    assert (await ready(broker_url, QUEUE), await ready(broker_url, DLQ)) == (0, 0)


async def _delivered(url: str, count: int) -> bool:
    n = await scalar(url, "SELECT count(*) FROM deliveries WHERE status = 'DELIVERED'")
    return bool(n == count)


async def test_a_burst_of_messages_is_stored_in_one_transaction(
    database_url: str, broker_url: str, vhost: str
) -> None:
    n = 60
    config = ingest_config(database_url, broker_url, prefetch=n, batch_linger_seconds=LONG_LINGER)
    await create_tenant(database_url, "billing")
    await create_tenant(database_url, "shop")
    await add_channel(database_url, "billing")
    await add_channel(database_url, "shop")
    async with running_ingest(config) as ingest:
        # two tenants in the same batch
        await publish(broker_url, [
            Message(event(i), app_id=(APP, OTHER_APP)[i % 2], message_id=f"m-{i}")
            for i in range(n)
        ])  # fmt: skip
        with trio.fail_after(20):
            await wait_until(lambda: ingest.statistics().stored == n)
        stats = ingest.statistics()
    assert await ready(broker_url, QUEUE) == 0  # all acknowledged
    assert (stats.batches, stats.transactions, stats.received) == (1, 1, n)
    assert (stats.dead_lettered, stats.requeued) == (0, 0)
    counts = await count_rows(database_url)
    assert (counts["events"], counts["deliveries"], counts["outbox"]) == (n, n, n)
    per_tenant = await sql(
        database_url,
        "SELECT t.name, count(*) FROM events e JOIN tenants t ON t.id = e.tenant_id "
        "GROUP BY t.name ORDER BY t.name",
    )
    assert [tuple(r) for r in per_tenant] == [("billing", n // 2), ("shop", n // 2)]


async def test_bad_messages_go_to_the_dead_letter_queue_and_the_good_ones_are_stored(
    database_url: str, broker_url: str, vhost: str
) -> None:
    await create_tenant(database_url, "billing")
    await create_tenant(database_url, "shop")
    shops = await add_channel(database_url, "shop")
    async with open_store(database_url) as store:  # a key already used, as over HTTP
        (tenant_id,) = (await store.tenant_ids_by_names(["billing"])).values()
        used = EventIn(type="order.created", payload={"n": 0}, idempotency_key="used")
        await store.ingest(tenant_id, [new_event(used, "used")], {})
    trace = {"x-trace": "t-1"}
    messages = [
        Message(event(1), message_id="good-1"),
        Message(b'{"type": "order.created", "payload": ', message_id="bad-json", headers=trace),
        Message(event(payload=[1]), message_id="invalid"),
        Message(event(), message_id="no-app-id", app_id=None),
        Message(event(), message_id="unmapped", app_id="stranger"),
        Message(event(), message_id="no-tenant", app_id="ghost-app"),
        Message(event(channel_ids=[str(shops)]), message_id="foreign-channel"),
        Message(event(5, idempotency_key="used"), message_id="conflict"),
        Message(event(payload={"s": "a\u0000b"}), message_id="nul"),
        Message(event(2), message_id="good-2", app_id=OTHER_APP),
    ]
    config = ingest_config(
        database_url, broker_url, prefetch=len(messages), batch_linger_seconds=LONG_LINGER
    )
    async with running_ingest(config) as ingest:
        await publish(broker_url, messages)
        with trio.fail_after(20):
            await wait_until(lambda: ingest.statistics().dead_lettered == 8)
        stats = ingest.statistics()
    assert await ready(broker_url, QUEUE) == 0  # all acknowledged, the bad ones too
    assert (stats.batches, stats.transactions, stats.stored) == (1, 1, 2)
    dead = {m.message_id: m for m in await take_all(broker_url, DLQ)}
    assert {k: m.headers[ERROR_CODE_HEADER] for k, m in dead.items()} == {
        "bad-json": "invalid_json",
        "invalid": "validation_error",
        "no-app-id": "unknown_app_id",
        "unmapped": "unknown_app_id",
        "no-tenant": "unknown_tenant",
        "foreign-channel": "validation_error",
        "conflict": "idempotency_conflict",
        "nul": "validation_error",
    }
    reasons = {k: m.headers[ERROR_HEADER] for k, m in dead.items()}
    assert reasons["bad-json"].startswith("body is not valid JSON")
    assert reasons["invalid"] == "payload: Expected `object`, got `array`"
    assert reasons["unmapped"] == "app_id 'stranger' is not mapped to a tenant"
    assert reasons["foreign-channel"] == f"channel_ids: unknown channel ids: {shops}"
    assert "'used'" in reasons["conflict"]
    assert "NUL" in reasons["nul"]
    # the copy is the message as it came, headers and properties included
    bad = dead["bad-json"]
    assert bad.body == messages[1].body
    assert (bad.app_id, bad.headers["x-trace"], bad.content_type) == (APP, "t-1", None)
    stored = await sql(database_url, "SELECT idempotency_key FROM events ORDER BY created_at")
    assert sorted(r[0] for r in stored) == ["good-1", "good-2", "used"]


async def test_a_replay_is_acked_and_writes_nothing(
    database_url: str, broker_url: str, vhost: str
) -> None:
    await create_tenant(database_url, "billing")
    await add_channel(database_url, "billing")
    config = ingest_config(database_url, broker_url, batch_linger_seconds=0)
    same = Message(event(7), message_id="once")
    async with running_ingest(config) as ingest:
        await publish(broker_url, [same])
        with trio.fail_after(20):
            await wait_until(lambda: ingest.statistics().stored == 1)
        before = await count_rows(database_url)
        await publish(broker_url, [same])  # e.g. the producer retried after a lost confirm
        with trio.fail_after(20):
            await wait_until(lambda: ingest.statistics().replays == 1)
        stats = ingest.statistics()
    assert await count_rows(database_url) == before
    assert before["events"] == before["deliveries"] == 1
    assert (stats.stored, stats.replays, stats.dead_lettered) == (1, 1, 0)
    assert (await ready(broker_url, QUEUE), await ready(broker_url, DLQ)) == (0, 0)


async def test_a_redelivery_stored_before_its_schema_changed_is_a_replay(
    database_url: str, broker_url: str, vhost: str
) -> None:
    """An event stored, the process gone before its ack, and the type's schema changed so that
    the event no longer matches: the redelivered message is a replay (acked, nothing written),
    not a schema_violation in the dead-letter queue, while its event is stored."""
    await create_tenant(database_url, "billing")
    config = ingest_config(database_url, broker_url, batch_linger_seconds=0)
    first = Message(event(0), message_id="stored-before")
    async with running_ingest(config) as ingest:
        await publish(broker_url, [first])
        with trio.fail_after(20):
            await wait_until(lambda: ingest.statistics().stored == 1)
    await sql(
        database_url,
        "INSERT INTO event_types (tenant_id, name, schema) SELECT id, 'order.created', "
        """'{"properties": {"n": {"minimum": 1}}}'::jsonb FROM tenants WHERE name = 'billing'""",
    )
    async with running_ingest(config) as ingest:  # a process that reads the new schema
        await publish(broker_url, [first, Message(event(0), message_id="new")])
        with trio.fail_after(20):
            await wait_until(lambda: ingest.statistics().dead_lettered == 1)
        stats = ingest.statistics()
    assert (stats.stored, stats.replays, stats.dead_lettered) == (0, 1, 1)
    assert [m.message_id for m in await take_all(broker_url, DLQ)] == ["new"]
    assert await ready(broker_url, QUEUE) == 0
    stored = await sql(database_url, "SELECT idempotency_key FROM events")
    assert [r[0] for r in stored] == ["stored-before"]


class PgProxy:
    """A TCP proxy in front of Postgres that can be cut: while cut, it drops the connections
    it carries and closes new ones at once, as an unreachable database would look."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._up = True
        self._scopes: set[trio.CancelScope] = set()

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._carry, listeners)

    def cut(self) -> None:
        self._up = False
        for scope in list(self._scopes):
            scope.cancel()

    def restore(self) -> None:
        self._up = True

    async def _carry(self, client: trio.SocketStream) -> None:
        async with client:
            if not self._up:
                return
            with trio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    server = await trio.open_tcp_stream(*self._target)
                    async with server, trio.open_nursery() as nursery:
                        nursery.start_soon(self._pipe, client, server, nursery.cancel_scope)
                        nursery.start_soon(self._pipe, server, client, nursery.cancel_scope)
                finally:
                    self._scopes.discard(scope)

    @staticmethod
    async def _pipe(
        source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope
    ) -> None:
        try:
            async for data in source:
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()


async def test_nothing_is_acked_before_commit_and_postgres_outages_only_delay(
    database_url: str, broker_url: str
) -> None:
    await create_tenant(database_url, "billing")
    real = urlsplit(database_url)
    assert real.hostname is not None
    proxy = PgProxy(real.hostname, real.port or 5432)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(proxy.serve)
        netloc = f"{real.username}@127.0.0.1:{port}" if real.username else f"127.0.0.1:{port}"
        config = ingest_config(
            urlunsplit(real._replace(netloc=netloc)), broker_url, store_retry_seconds=0.1
        )
        async with open_store(config.database.url) as store:
            async with running_ingest(config, store) as ingest:
                proxy.cut()
                await publish(broker_url, [Message(event(1), message_id="during-outage")])
                with trio.fail_after(30):
                    # tried, failed, handed back, tried again ...
                    await wait_until(lambda: ingest.statistics().requeued >= 2)
            # ... and never acknowledged: with the consumer gone, the broker still has it
            assert await ready(broker_url, QUEUE) == 1
            assert await scalar(database_url, "SELECT count(*) FROM events") == 0
            async with running_ingest(config, store) as ingest:
                with trio.fail_after(30):
                    await wait_until(lambda: ingest.statistics().requeued >= 1)
                proxy.restore()  # Postgres is back while the consumer keeps trying
                with trio.fail_after(30):
                    await wait_until(lambda: ingest.statistics().stored == 1)
                stats = ingest.statistics()
        nursery.cancel_scope.cancel()
    assert stats.store_failures >= 1
    assert stats.dead_lettered == 0
    rows = await sql(database_url, "SELECT idempotency_key FROM events")
    assert [r[0] for r in rows] == ["during-outage"]
    assert (await ready(broker_url, QUEUE), await ready(broker_url, DLQ)) == (0, 0)


async def test_a_stop_finishes_the_batch_in_hand(
    database_url: str, broker_url: str, vhost: str
) -> None:
    await create_tenant(database_url, "billing")
    config = ingest_config(database_url, broker_url, prefetch=10, batch_linger_seconds=LONG_LINGER)
    stop = Stop()
    async with open_store(database_url) as store, trio.open_nursery() as nursery:
        ingest: AmqpIngest = await nursery.start(run_amqp_ingest, config, store, stop)
        await publish(broker_url, [Message(event(i), message_id=f"m-{i}") for i in range(3)])
        with trio.fail_after(20):
            await wait_until(lambda: ingest.statistics().received == 3)  # lingering for more
        with trio.fail_after(10):  # far below the linger: the stop ended it
            stop.set()
            await wait_until(lambda: ingest.statistics().stored == 3)
    assert await scalar(database_url, "SELECT count(*) FROM events") == 3
    assert await ready(broker_url, QUEUE) == 0


async def test_the_event_type_catalog_refuses_to_the_dead_letter_queue(
    database_url: str, broker_url: str, vhost: str
) -> None:
    """Billing registered `order.created` (n ≥ 1) and is strict; shop registered nothing."""
    await create_tenant(database_url, "billing")
    await create_tenant(database_url, "shop")
    await sql(
        database_url,
        "INSERT INTO event_types (tenant_id, name, schema) SELECT id, 'order.created', "
        "'{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 1}}}'"
        "::jsonb FROM tenants WHERE name = 'billing'",
    )  # fmt: skip
    await sql(database_url, "UPDATE tenants SET strict_event_types = true WHERE name = 'billing'")
    messages = [
        Message(event(1), message_id="good"),
        Message(event(0), message_id="too-small"),
        Message(json.dumps({"type": "order.lost", "payload": {}}).encode(), message_id="strict"),
        Message(event(0), message_id="shop-unchecked", app_id=OTHER_APP),
    ]
    config = ingest_config(
        database_url, broker_url, prefetch=len(messages), batch_linger_seconds=LONG_LINGER
    )
    async with running_ingest(config) as ingest:
        await publish(broker_url, messages)
        with trio.fail_after(20):
            await wait_until(lambda: ingest.statistics().dead_lettered == 2)
        stats = ingest.statistics()
    assert await ready(broker_url, QUEUE) == 0
    assert (stats.transactions, stats.stored) == (1, 2)
    dead = {m.message_id: m.headers for m in await take_all(broker_url, DLQ)}
    assert {k: (h[ERROR_CODE_HEADER], h[ERROR_HEADER]) for k, h in dead.items()} == {
        "too-small": ("schema_violation", "payload at $.n: 0 is less than the minimum of 1 "
                      "(schema of event type 'order.created')"),
        "strict": ("unregistered_event_type", "type: 'order.lost' is not in the tenant's "
                   "event-type catalog (strict_event_types is on)"),
    }  # fmt: skip
    stored = await sql(database_url, "SELECT idempotency_key FROM events")
    assert sorted(r[0] for r in stored) == ["good", "shop-unchecked"]
