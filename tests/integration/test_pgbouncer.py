"""The store and the whole pipeline through a real PgBouncer in transaction pooling mode
(``database.pooler = "pgbouncer"``): statements work although consecutive transactions run on
different server connections, the statement timeout holds on the server, no setting of ours
stays on a server connection, migrate works, and the relay either LISTENs on
``database.listen_url`` or polls."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import trio

from notifier.bridge import aio, open_bridge
from notifier.store import open_store
from notifier.store.errors import TenantExists
from notifier.testing import open_sink
from tests.integration.conftest import PG_ADMIN, create_tenant, make_config, run_notifier, sql
from tests.integration.test_cli import notifier
from tests.pgbouncer import PgBouncer, pgbouncer_instance

pytestmark = pytest.mark.integration


@pytest.fixture
async def pgbouncer() -> AsyncIterator[PgBouncer]:
    # Two server connections for every client: consecutive transactions of one client do
    # land on different ones.
    with pgbouncer_instance(pool_size=2) as bouncer:
        await bouncer.start()
        yield bouncer


def _database(url: str) -> str:
    return url.rsplit("/", 1)[1]


async def _second_server_connection_in_use(url: str, first: Any) -> Any:
    """Asyncio-flavoured. Run ``first`` (a client statement), then hold the server connection
    it used in another client's open transaction, then run ``first`` again: it has to run on
    the second server connection."""
    other = await asyncpg.connect(url, statement_cache_size=0)
    try:
        await first()
        await other.execute("BEGIN")  # PgBouncer hands out the idle server connection
        await other.execute("SELECT 1")
        return await first()
    finally:
        await other.close()


async def test_asyncpg_defaults_break_under_transaction_pooling(
    pgbouncer: PgBouncer, database_url: str
) -> None:
    # The control: a statement prepared (and cached) on one server connection is unknown on
    # the next one — what `pooler = "pgbouncer"` exists for.
    url = pgbouncer.url(_database(database_url))

    async def scenario() -> None:
        conn = await asyncpg.connect(url)
        try:
            await _second_server_connection_in_use(url, lambda: conn.fetchval("SELECT $1::int", 1))
        finally:
            await conn.close()

    async with open_bridge():
        with pytest.raises(asyncpg.InvalidSQLStatementNameError):
            await aio(scenario)


async def test_the_store_runs_through_transaction_pooling_and_leaves_no_session_state(
    pgbouncer: PgBouncer, database_url: str
) -> None:
    url = pgbouncer.url(_database(database_url))
    async with open_store(
        url, max_size=4, pooler="pgbouncer", statement_timeout_seconds=0.5
    ) as store:
        await store.migrate()  # one transaction, a transaction-level lock: fine through it
        tenant = await store.create_tenant("through-pgbouncer", "hash-1")
        pool = store._pool

        async def statements() -> tuple[Any, tuple[str, str]]:
            found = await _second_server_connection_in_use(
                url,
                lambda: pool.fetchval(
                    "SELECT id FROM tenants WHERE name = $1", "through-pgbouncer"
                ),
            )
            async with pool.acquire() as conn, conn.transaction():
                in_transaction = await conn.fetchval("SHOW statement_timeout")
            alone = await pool.fetchval("SHOW statement_timeout")
            return found, (in_transaction, alone)

        found, shown = await aio(statements)
        assert found == tenant
        assert shown == ("500ms", "500ms")
        assert await store.tenant_by_key_hash("hash-1") == tenant
        # a statement that fails in the transaction of its own is rolled back, and the
        # connection serves the next call
        with pytest.raises(TenantExists):
            await store.create_tenant("through-pgbouncer", "hash-2")
        assert await store.tenant_by_key_hash("hash-1") == tenant
        # the server cancels a statement that runs too long (the client would wait 1.0 s)
        with pytest.raises(asyncpg.QueryCanceledError):
            await aio(pool.fetchval, "SELECT pg_sleep(3)")

        async def plain_client() -> list[str]:
            # every server connection (both), as a client that sets nothing sees them
            conns = [await asyncpg.connect(url, statement_cache_size=0) for _ in range(2)]
            try:
                for conn in conns:
                    await conn.execute("BEGIN")
                return [await conn.fetchval("SHOW statement_timeout") for conn in conns]
            finally:
                for conn in conns:
                    await conn.close()

        assert await aio(plain_client) == ["0", "0"]


async def test_many_concurrent_store_calls_share_two_server_connections(
    pgbouncer: PgBouncer, database_url: str
) -> None:
    url = pgbouncer.url(_database(database_url))
    async with open_store(url, max_size=10, pooler="pgbouncer") as store:
        tenants = [await store.create_tenant(f"t{i}", f"key-{i}") for i in range(5)]
        found: list[Any] = []

        async def look_up(i: int) -> None:
            for _ in range(20):
                found.append((i, await store.tenant_by_key_hash(f"key-{i % 5}")))

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(look_up, i)
    assert len(found) == 400
    assert all(tenant == tenants[i % 5] for i, tenant in found)


@pytest.mark.parametrize("listen", [True, False], ids=["listen_url", "polling"])
async def test_events_are_delivered_through_pgbouncer(
    pgbouncer: PgBouncer,
    database_url: str,
    broker_url: str,
    listen: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="notifier.store")
    database: dict[str, Any] = {
        "url": pgbouncer.url(_database(database_url)),
        "pooler": "pgbouncer",
    }
    if listen:
        # a poll interval far longer than the wait below: only the doorbell can be in time
        database["listen_url"] = database_url
        relay = {"poll_interval_seconds": 60}
    else:
        relay = {"poll_interval_seconds": 0.3}
    config = make_config(database_url, broker_url, database=database, relay=relay)
    key = await create_tenant(database_url)
    async with open_sink() as sink, run_notifier(config) as running, running.client(key) as api:
        ch = await api.post("/v1/channels", json={"type": "webhook", "config": {"url": sink.url}})
        assert ch.status_code == 201, ch.text
        ids = []
        for n in range(10):
            resp = await api.post("/v1/events", json={"type": "t", "payload": {"n": n}})
            assert resp.status_code == 202, resp.text
            ids.append(resp.json()["deliveries"][0]["id"])
        with trio.fail_after(20):
            got = await sink.wait_for(10)
        assert sorted(r.headers["webhook-id"] for r in got) == sorted(ids)
    polling = "no LISTEN through a transaction pooler" in caplog.text
    assert polling is not listen


async def test_migrate_and_tenant_create_from_the_cli_through_pgbouncer(
    pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    name = f"notifier_pgb_cli_{uuid.uuid4().hex[:8]}"
    await sql(PG_ADMIN, f'CREATE DATABASE "{name}"')  # empty: migrate creates everything
    try:
        path = tmp_path / "notifier.toml"
        path.write_text(f'[database]\nurl = "{pgbouncer.url(name)}"\npooler = "pgbouncer"\n')
        for args in (["migrate"], ["migrate"], ["tenant", "create", "cli-through-pgbouncer"]):
            done = await trio.to_thread.run_sync(
                functools.partial(notifier, *args, "--config", str(path))
            )
            assert done.returncode == 0, done.stderr
        base = PG_ADMIN.rsplit("/", 1)[0]
        (row,) = await sql(f"{base}/{name}", "SELECT count(*) AS n FROM tenants")
        assert row["n"] == 1
    finally:
        await sql(PG_ADMIN, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
