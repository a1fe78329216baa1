"""The scratch world of one benchmark run: its own Postgres database and RabbitMQ vhost (unique
names, dropped at the end), a tenant and a webhook channel with a secret, and backlogs of
deliveries made directly in Postgres and published straight to the delivery queue.

The harness talks to both from one asyncio loop with one long-lived connection each; it never
polls Postgres faster than every half second."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiormq
import asyncpg
from pamqp.commands import Basic

import notifier
from notifier.adapters.webhook.signing import generate_secret
from notifier.broker.topology import EXCHANGE, build_topology, main_queue
from notifier.config import RetryConfig
from notifier.ingest.tenants import hash_api_key
from notifier.messages import decode_message

PG = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432")
AMQP = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
QUEUE = main_queue("webhook")
# Read from notifier's package rather than imported from notifier.store, which would install
# trio-asyncio's event loop policy: the harness runs on plain asyncio.
SCHEMA_PATH = Path(notifier.__file__).parent / "store" / "schema.sql"
PAYLOAD_NOTE = 900  # characters of filler: with the other fields, a payload of about 1 KB


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


class Scratch:
    def __init__(self) -> None:
        self.name = f"notifier_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.db_url = f"{PG}/{self.name}"
        self.amqp_url = f"{AMQP}/{self.name}"
        self.key = f"nk_bench_{uuid.uuid4().hex}"
        self.tenant = uuid.uuid4()
        self.channel_id = uuid.uuid4()
        self.loop = asyncio.Runner()
        self._conn: asyncpg.Connection | None = None
        self._amqp: aiormq.abc.AbstractConnection | None = None
        self._ch: aiormq.abc.AbstractChannel | None = None
        self.created = False
        self.broker = True  # a RabbitMQ vhost of its own (create)
        # Postgres's clock when the database was made: every event the stages make is younger,
        # and the queries below look at those alone (a history is older, bench/history.py)
        self.since: Any = None

    # -- life cycle --

    def create(self, sink_url: str, *, broker: bool = True) -> None:
        """The database with schema.sql, the tenant and its channel; and, with ``broker``, the
        vhost with notifier's topology (a database for Postgres alone: ``broker=False``)."""

        async def admin(sql: str) -> None:
            conn = await asyncpg.connect(f"{PG}/postgres")
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        self.loop.run(admin(f'CREATE DATABASE "{self.name}"'))
        self.created = True
        self.broker = broker
        if broker:
            rabbitmqctl("add_vhost", self.name)
            rabbitmqctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")
        self._conn = self.loop.run(asyncpg.connect(self.db_url))
        self.since = self.value("SELECT now()")
        self.execute(SCHEMA_PATH.read_text())
        # schema.sql is the whole current schema: record every migration as applied, as
        # `notifier migrate` would have (`notifier run` refuses a database without them)
        self.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for path in sorted((SCHEMA_PATH.parent / "migrations").glob("*.sql")):
            version, _, name = path.stem.partition("_")
            self.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", int(version), name
            )
        self.execute(
            "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, 'bench', $2)",
            self.tenant, hash_api_key(self.key),
        )  # fmt: skip
        # A channel as the API would store it (WebhookChannels.prepare_config): URL, secret,
        # no extra headers; every delivery is signed.
        config = {"url": sink_url, "secret": generate_secret(), "headers": {}}
        self.execute(
            "INSERT INTO channels (id, tenant_id, type, name, config) "
            "VALUES ($1, $2, 'webhook', 'sink', $3::jsonb)",
            self.channel_id, self.tenant, _json(config),
        )  # fmt: skip
        if broker:
            self.loop.run(self._open_amqp())

    async def _open_amqp(self) -> None:
        self._amqp = await aiormq.connect(self.amqp_url)
        self._ch = await self._amqp.channel(publisher_confirms=True)
        # the topology notifier declares (same arguments, or RabbitMQ would refuse it)
        topology = build_topology(["webhook"], RetryConfig().tiers_seconds, "quorum")
        for exchange in topology.exchanges:
            await self._ch.exchange_declare(exchange, exchange_type="direct", durable=True)
        for q in topology.queues:
            await self._ch.queue_declare(q.name, durable=True, arguments=q.arguments)
            await self._ch.queue_bind(q.name, q.exchange, routing_key=q.routing_key)

    def drop(self) -> None:
        async def close() -> None:
            # a connection interrupted mid-statement (Ctrl-C) may not close cleanly: the
            # database is dropped all the same
            try:
                if self._amqp is not None:
                    await self._amqp.close()
            except Exception:
                pass
            if self._conn is not None:
                try:
                    await asyncio.wait_for(self._conn.close(), 5)
                except Exception:
                    self._conn.terminate()
            conn = await asyncpg.connect(f"{PG}/postgres")
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            finally:
                await conn.close()

        try:
            if self.created:
                self.loop.run(close())
                if self.broker:
                    rabbitmqctl("delete_vhost", self.name)
        finally:
            self.loop.close()

    # -- Postgres --

    def execute(self, sql: str, *args: Any) -> None:
        assert self._conn is not None
        self.loop.run(self._conn.execute(sql, *args))

    def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        assert self._conn is not None
        return list(self.loop.run(self._conn.fetch(sql, *args)))

    def value(self, sql: str, *args: Any) -> Any:
        assert self._conn is not None
        return self.loop.run(self._conn.fetchval(sql, *args))

    def backend_pids(self) -> list[int]:
        """Postgres backends connected to the scratch database now."""
        rows = self.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", self.name)
        return [r["pid"] for r in rows]

    def make_backlog(self, event_type: str, count: int) -> list[bytes]:
        """``count`` events of ``event_type`` with one PENDING webhook delivery each, made in
        Postgres as ingest would; the worker messages of their first attempts (what the relay
        would publish)."""
        self.execute(
            "INSERT INTO events (id, tenant_id, type, payload) "
            "SELECT gen_random_uuid(), $1, $2, jsonb_build_object("
            "  'order_id', format('ord_%s', lpad(g::text, 8, '0')), 'amount_cents', 129900,"
            "  'currency', 'EUR', 'items', 3, 'note', repeat('x', $4)) "
            "FROM generate_series(1, $3) AS g",
            self.tenant, event_type, count, PAYLOAD_NOTE,
        )  # fmt: skip
        self.execute(
            "INSERT INTO deliveries (id, event_id, channel_id, tenant_id, channel_type, "
            "max_attempts, created_at) SELECT gen_random_uuid(), e.id, $1, e.tenant_id, "
            "'webhook', 5, e.created_at FROM events e WHERE e.type = $2 AND e.created_at >= $3",
            self.channel_id, event_type, self.since,
        )  # fmt: skip
        rows = self.fetch(
            "SELECT notifier_worker_message(d, e, c.config, 1) AS body FROM deliveries d "
            "JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at "
            "JOIN channels c ON c.id = d.channel_id "
            "WHERE e.type = $1 AND e.created_at >= $2 AND d.created_at >= $2",
            event_type, self.since,
        )  # fmt: skip
        return [bytes(r["body"]) for r in rows]

    def delivered(self, event_type: str) -> tuple[int, int]:
        """(deliveries DELIVERED, attempt rows) of the events of ``event_type``. Every table is
        read from ``since`` on alone (each has its creation time: with a history in the
        database, the partitions of the days before are not read)."""
        row = self.fetch(
            "SELECT count(*) FILTER (WHERE d.status = 'DELIVERED') AS delivered, "
            "(SELECT count(*) FROM delivery_attempts a JOIN deliveries d2 ON d2.id = "
            "a.delivery_id AND d2.created_at = a.delivery_created_at JOIN events e2 ON "
            "e2.id = d2.event_id AND e2.created_at = d2.created_at WHERE e2.type = $1 "
            "AND e2.created_at >= $2 AND d2.created_at >= $2 AND a.delivery_created_at >= $2) "
            "AS attempts "
            "FROM deliveries d JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at "
            "WHERE e.type = $1 AND e.created_at >= $2 AND d.created_at >= $2",
            event_type, self.since,
        )[0]  # fmt: skip
        return int(row["delivered"]), int(row["attempts"])

    def created_at(self, event_type: str) -> dict[str, float]:
        """delivery id → its event's creation time (epoch seconds), for one event type."""
        rows = self.fetch(
            "SELECT d.id::text AS id, extract(epoch FROM e.created_at)::float8 AS at "
            "FROM deliveries d JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at "
            "WHERE e.type = $1 AND e.created_at >= $2 AND d.created_at >= $2",
            event_type, self.since,
        )  # fmt: skip
        return {r["id"]: r["at"] for r in rows}

    def in_transaction(self, sql: str, *args: Any, statement_timeout_ms: int,
                       lock_timeout_ms: int | None = None) -> list[asyncpg.Record]:  # fmt: skip
        """``sql`` in a transaction of its own with ``SET LOCAL statement_timeout`` (and
        ``lock_timeout`` when given), as the maintenance role runs its statements: its rows."""

        async def run() -> list[asyncpg.Record]:
            assert self._conn is not None
            async with self._conn.transaction():
                await self._conn.execute(
                    f"SET LOCAL statement_timeout = {int(statement_timeout_ms)}"
                )
                if lock_timeout_ms is not None:
                    await self._conn.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
                return list(await self._conn.fetch(sql, *args))

        return self.loop.run(run())

    # -- RabbitMQ --

    def publish(self, bodies: Sequence[bytes], window: int = 1000) -> None:
        """Publish worker messages to the delivery exchange as the relay does (persistent,
        message id = delivery id), awaiting the broker's confirms a window at a time."""

        async def run() -> None:
            assert self._ch is not None
            for i in range(0, len(bodies), window):
                await asyncio.gather(*(self._publish_one(body) for body in bodies[i : i + window]))

        self.loop.run(run())

    async def _publish_one(self, body: bytes) -> None:
        assert self._ch is not None
        props = Basic.Properties(
            delivery_mode=2, content_type="application/json",
            message_id=str(decode_message(body).delivery_id),
        )  # fmt: skip
        await self._ch.basic_publish(
            body, exchange=EXCHANGE, routing_key="webhook", properties=props
        )

    def queue_depth(self, name: str = QUEUE) -> int:
        async def run() -> int:
            assert self._ch is not None
            ok = await self._ch.queue_declare(name, passive=True)
            return int(ok.message_count or 0)

        return self.loop.run(run())

    def purge(self, name: str = QUEUE) -> None:
        async def run() -> None:
            assert self._ch is not None
            await self._ch.queue_purge(name)

        self.loop.run(run())


def _json(value: Any) -> str:
    import json

    return json.dumps(value)
