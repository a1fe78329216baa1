"""The store's bounds against the real Postgres: a statement Postgres does not finish in time,
a pool with no free connection, and a migration, which is not bound like requests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import trio

from notifier.bridge import aio
from notifier.errors import StoreUnavailable
from notifier.store import Store, open_store
from notifier.store.maintenance import PARTITION_LOCK_TIMEOUT_MS
from notifier.store.versions import MIGRATE_LOCK
from tests.integration.conftest import poll, scalar

pytestmark = pytest.mark.integration

STATEMENT_TIMEOUT_SECONDS = 0.3
ACQUIRE_TIMEOUT_SECONDS = 0.3
SLACK_SECONDS = 0.4  # a loaded machine


@asynccontextmanager
async def bounded_store(database_url: str, *, max_size: int = 2) -> AsyncIterator[Store]:
    async with open_store(
        database_url, max_size=max_size, acquire_timeout_seconds=ACQUIRE_TIMEOUT_SECONDS,
        statement_timeout_seconds=STATEMENT_TIMEOUT_SECONDS,
    ) as store:  # fmt: skip
        yield store


@asynccontextmanager
async def other_session(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of its own on the store's bridge (the store must be open)."""
    conn: asyncpg.Connection = await aio(asyncpg.connect, database_url)
    try:
        yield conn
    finally:
        with trio.CancelScope(shield=True):
            await aio(conn.close)


async def test_a_statement_postgres_does_not_finish_in_time_is_unavailable(
    database_url: str,
) -> None:
    async with bounded_store(database_url) as store, other_session(database_url) as other:
        # Another transaction holds the name: the insert waits on it, as behind any lock.
        await aio(other.execute, "BEGIN")
        await aio(
            other.execute, "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, 'held', 'x')",
            uuid.uuid4(),
        )  # fmt: skip
        started = trio.current_time()
        with trio.fail_after(5), pytest.raises(StoreUnavailable, match="QueryCanceledError"):
            await store.create_tenant("held", "y")
        waited = trio.current_time() - started
        assert STATEMENT_TIMEOUT_SECONDS <= waited < STATEMENT_TIMEOUT_SECONDS + SLACK_SECONDS
        await aio(other.execute, "ROLLBACK")
        with trio.fail_after(5):
            await store.create_tenant("held", "y")  # the store goes on
    assert await scalar(database_url, "SELECT count(*) FROM tenants WHERE name = 'held'") == 1


async def test_waiting_for_a_connection_is_bounded(database_url: str) -> None:
    async with bounded_store(database_url, max_size=1) as store:
        async with store.claim_outbox(10):  # holds the pool's only connection
            started = trio.current_time()
            with trio.fail_after(5), pytest.raises(StoreUnavailable):
                await store.outbox_depth()
            waited = trio.current_time() - started
            assert ACQUIRE_TIMEOUT_SECONDS <= waited < ACQUIRE_TIMEOUT_SECONDS + SLACK_SECONDS
        with trio.fail_after(5):
            assert await store.outbox_depth() == 0


async def test_ping_answers_within_its_own_bound(database_url: str) -> None:
    async with bounded_store(database_url, max_size=1) as store:
        with trio.fail_after(5):
            await store.ping(0.1)
        async with store.claim_outbox(10):
            started = trio.current_time()
            with trio.fail_after(5), pytest.raises(StoreUnavailable):
                await store.ping(0.1)
            assert trio.current_time() - started < 0.1 + SLACK_SECONDS


async def test_a_migration_waits_past_the_statement_timeout(database_url: str) -> None:
    async def migrate_waiting() -> bool:
        waiting = await scalar(
            database_url,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        )
        return bool(waiting)

    async with bounded_store(database_url) as store, other_session(database_url) as other:
        await aio(other.execute, "SELECT pg_advisory_lock($1)", MIGRATE_LOCK)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.migrate)
            with trio.fail_after(10):
                await poll(migrate_waiting)
            # The lock is held for longer than a statement may run: migrate goes on waiting.
            await trio.sleep(2 * STATEMENT_TIMEOUT_SECONDS)
            await aio(other.execute, "SELECT pg_advisory_unlock($1)", MIGRATE_LOCK)
            nursery.cancel_scope.deadline = trio.current_time() + 30
        assert not nursery.cancel_scope.cancelled_caught


MAINTENANCE = {
    "reconcile": ("deliveries", lambda s: s.reconcile(stuck_after_seconds=600, limit=10)),
    "idempotency keys": ("event_keys", lambda s: s.clean_event_keys(retention_days=30, limit=10)),
    "outbox hygiene": ("outbox", lambda s: s.clean_outbox(limit=10, refused_after=5)),
    "rate buckets": ("rate_buckets", lambda s: s.clean_rate_buckets(limit=10)),
    "circuits": ("circuits", lambda s: s.clean_circuits(limit=10)),
    "console": ("console_sessions", lambda s: s.clean_console(limit=10)),
}


@pytest.mark.parametrize("name", list(MAINTENANCE))
async def test_a_maintenance_statement_waits_past_the_statement_timeout(
    database_url: str, name: str
) -> None:
    table, call = MAINTENANCE[name]

    async def maintenance_waiting() -> bool:
        waiting = await scalar(
            database_url,
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            "WHERE c.relname = $1 AND NOT l.granted",
            table,
        )
        return bool(waiting)

    async with bounded_store(database_url) as store, other_session(database_url) as other:
        await aio(other.execute, "BEGIN")
        await aio(other.execute, f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, store)
            with trio.fail_after(10):
                await poll(maintenance_waiting)
            # The lock is held for longer than a request's statement may run: a maintenance
            # statement has its own, longer bound and goes on waiting.
            await trio.sleep(2 * STATEMENT_TIMEOUT_SECONDS)
            await aio(other.execute, "ROLLBACK")
            nursery.cancel_scope.deadline = trio.current_time() + 30
        assert not nursery.cancel_scope.cancelled_caught


async def test_a_day_of_history_whose_tables_are_busy_is_left_for_the_next_pass(
    database_url: str,
) -> None:
    day = datetime.now(UTC).date() - timedelta(days=40)
    suffix = day.strftime("_p%Y%m%d")
    await scalar(database_url, "SELECT notifier_partitions_ensure($1::date, $1::date)", day)
    async with bounded_store(database_url) as store, other_session(database_url) as other:
        # A long transaction reads the history (say an operator's query): dropping a day must
        # not queue every ingest and worker statement behind it for long.
        await aio(other.execute, "BEGIN")
        await aio(other.execute, "SELECT count(*) FROM deliveries")
        started = trio.current_time()
        with trio.fail_after(10):
            dropped, kept = await store.drop_expired_days(retention_days=30)
        waited = trio.current_time() - started
        assert (dropped, kept) == ([], [suffix])
        assert waited < PARTITION_LOCK_TIMEOUT_MS / 1000 + SLACK_SECONDS
        await aio(other.execute, "ROLLBACK")
        with trio.fail_after(10):
            assert await store.drop_expired_days(retention_days=30) == ([suffix], [])
    assert await scalar(database_url, "SELECT to_regclass($1)::text", f"events{suffix}") is None
