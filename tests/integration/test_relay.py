"""The outbox relay against the real Postgres and RabbitMQ."""

from __future__ import annotations

import functools
import uuid
from typing import Any

import pytest
import trio

from notifier import service
from notifier.bridge import open_bridge
from notifier.broker.amqp import open_connection
from notifier.broker.base import Settle
from notifier.broker.topology import main_queue
from notifier.config import Config
from notifier.lifecycle import Stop
from notifier.store import open_store
from notifier.testing import open_sink
from tests.integration.conftest import (
    create_tenant,
    make_config,
    poll,
    run_notifier,
    scalar,
    sql,
)

ROWS_BEFORE = 600
ROWS_DURING = 600


async def insert_outbox_rows(url: str, count: int) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(count)]
    await sql(
        url,
        "INSERT INTO outbox (delivery_id, routing_key, body) "
        "SELECT d, 'webhook', convert_to('{}', 'UTF8') FROM unnest($1::uuid[]) AS d",
        ids,
    )
    return ids


async def drain_queue(config: Config, queue: str, expected: int) -> list[str]:
    """Consume until ``expected`` messages arrived; return their message ids."""
    seen: list[str] = []
    async with (
        open_connection(config.broker.url, name="test-drain") as conn,
        conn.open_consumer(queue, prefetch=500) as consumer,
    ):
        with trio.fail_after(30):
            while len(seen) < expected:
                message = await consumer.receive.receive()
                assert message.message_id is not None
                seen.append(message.message_id)
                message.settle(Settle.ACK)
        # nothing more arrives: the queue held exactly `expected` messages
        with trio.move_on_after(0.5):
            extra = await consumer.receive.receive()
            seen.append(extra.message_id or "?")
    return seen


async def test_three_relays_publish_each_row_exactly_once(
    database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url, relay={"batch_size": 50})
    ids = await insert_outbox_rows(database_url, ROWS_BEFORE)
    stops = [Stop() for _ in range(3)]

    async def outbox_empty() -> bool:
        return await scalar(database_url, "SELECT count(*) FROM outbox") == 0

    async with open_bridge(), trio.open_nursery() as nursery:
        for stop in stops:
            run = functools.partial(service.run, config, ("relay",), stop=stop)
            await nursery.start(run)
        # more rows while the relays run, in many small transactions
        for _ in range(ROWS_DURING // 50):
            ids += await insert_outbox_rows(database_url, 50)
        with trio.fail_after(60):
            await poll(outbox_empty)
        for stop in stops:
            stop.set()
        seen = await drain_queue(config, main_queue("webhook"), len(ids))
    assert len(seen) == len(ids)
    assert sorted(seen) == sorted(str(i) for i in ids)


async def test_unroutable_row_stays_in_the_outbox_with_its_error(
    database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url)
    await sql(
        database_url,
        "INSERT INTO outbox (delivery_id, routing_key, body) VALUES ($1, 'nowhere', '\\x7b7d')",
        uuid.uuid4(),
    )
    routable = await insert_outbox_rows(database_url, 3)
    async with open_bridge(), open_store(database_url) as store:
        stop = Stop()
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(service.run, config, ("relay",), stop=stop))
            rows: list[Any] = []

            async def only_the_unroutable_row_left() -> bool:
                nonlocal rows
                rows = await sql(
                    database_url, "SELECT routing_key, publish_failures, last_error FROM outbox"
                )
                return len(rows) == 1 and rows[0]["publish_failures"] >= 1

            with trio.fail_after(20):
                await poll(only_the_unroutable_row_left)
            stop.set()
        assert await store.outbox_depth() == 1
    assert rows[0]["routing_key"] == "nowhere"
    assert "returned" in rows[0]["last_error"]
    seen = await drain_queue(config, main_queue("webhook"), len(routable))
    assert sorted(seen) == sorted(str(i) for i in routable)


async def terminate_listen_backends(database_url: str) -> int:
    """Terminate the backends of this test's database that are listening for the outbox
    doorbell (their last statement was the LISTEN); return how many."""
    found = await sql(
        database_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND query = 'LISTEN \"notifier_outbox\"'",
    )
    return len(found)


async def test_losing_the_listen_connection_keeps_the_relay_polling_without_a_restart(
    database_url: str, broker_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    poll_interval = 1.0
    config = make_config(database_url, broker_url, relay={"poll_interval_seconds": poll_interval})
    key = await create_tenant(database_url)

    async def listening() -> bool:
        n = await scalar(
            database_url,
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query = 'LISTEN \"notifier_outbox\"'",
        )
        return bool(n == 1)

    latencies: list[float] = []
    async with open_sink() as sink, run_notifier(config) as running, running.client(key) as api:
        body = {"type": "webhook", "config": {"url": sink.url}, "event_types": ["*"]}
        assert (await api.post("/v1/channels", json=body)).status_code == 201
        for n in range(1, 6):
            with trio.fail_after(10):
                await poll(listening)  # listening (again) before each loss
            assert await terminate_listen_backends(database_url) == 1
            sent = trio.current_time()
            resp = await api.post("/v1/events", json={"type": "probe", "payload": {"n": n}})
            assert resp.status_code == 202, resp.text
            with trio.fail_after(10):
                await sink.wait_for(n)
            latencies.append(sink.received[-1].at - sent)
    # Without the doorbell the relay polls: each event arrives within about one poll interval,
    # however often the LISTEN connection is lost.
    assert max(latencies) < poll_interval + 1.0, latencies
    assert len(sink.received) == 5
    restarts = [r.getMessage() for r in caplog.records if "restarting in" in r.getMessage()]
    assert restarts == []
