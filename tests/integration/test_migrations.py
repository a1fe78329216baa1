"""Schema versions against a real Postgres: the migrations make what schema.sql describes, a
database of the releases before versions were recorded is taken to the current one, and the
state a database is in is told apart (missing, behind, current, ahead)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
import trio

from notifier.store.versions import (
    LATEST,
    MIGRATIONS,
    Migration,
    SchemaState,
    apply_missing,
    load_migrations,
    read_state,
)
from tests.integration.conftest import PG_BASE, _pg

ROOT = Path(__file__).resolve().parents[2]


def _empty_db() -> Iterator[str]:
    name = f"notifier_mig_{uuid.uuid4().hex[:12]}"
    _pg(f'CREATE DATABASE "{name}"')
    yield f"{PG_BASE}/{name}"
    _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_db() -> Iterator[str]:
    yield from _empty_db()


@pytest.fixture
def other_empty_db() -> Iterator[str]:
    yield from _empty_db()


def run_on(url: str, *steps: str) -> None:
    """Run SQL texts on ``url``, each as one simple-protocol script."""

    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            for sql in steps:
                await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def migrate(url: str, migrations: Sequence[Migration] = MIGRATIONS) -> list[str]:
    async def run() -> list[str]:
        conn = await asyncpg.connect(url)
        try:
            return [m.name for m in await apply_missing(conn, migrations)]
        finally:
            await conn.close()

    return asyncio.run(run())


def state(url: str) -> SchemaState:
    async def run() -> SchemaState:
        conn = await asyncpg.connect(url)
        try:
            return await read_state(conn)
        finally:
            await conn.close()

    return asyncio.run(run())


def schema_dump(url: str) -> str:
    """``pg_dump --schema-only`` of ``url``, without the schema_migrations table (its CREATE,
    its primary key) and without comments and blank lines."""
    out = subprocess.run(
        ["pg_dump", "--schema-only", "--no-owner", "--no-privileges", url],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    blocks = [b for b in re.split(r"\n(?=-- Name: )", out) if "schema_migrations" not in b]
    lines = [
        line for line in "\n".join(blocks).splitlines()
        # \restrict/\unrestrict: a random key of each dump (pg_dump's guard against psql
        # meta-commands in object names)
        if line.strip() and not line.startswith(("--", "\\restrict", "\\unrestrict"))
    ]  # fmt: skip
    return "\n".join(lines)


def test_the_migrations_make_what_schema_sql_describes(empty_db: str, other_empty_db: str) -> None:
    assert migrate(empty_db) == [m.name for m in MIGRATIONS]
    run_on(other_empty_db, (ROOT / "schema.sql").read_text())
    migrated, fresh = schema_dump(empty_db), schema_dump(other_empty_db)
    assert "CREATE TABLE public.tenants" in migrated
    assert "schema_migrations" not in migrated
    assert migrated == fresh


def test_a_database_of_an_earlier_release_is_recognised_and_migrated(empty_db: str) -> None:
    # What `notifier migrate` made before versions were recorded: 0001's statements, no table
    # of versions, and data in it.
    run_on(
        empty_db,
        MIGRATIONS[0].sql,
        "INSERT INTO tenants (id, name, api_key_hash) VALUES (gen_random_uuid(), 'old', 'h')",
    )
    assert state(empty_db).status == "missing"
    assert migrate(empty_db) == [m.name for m in MIGRATIONS]
    after = state(empty_db)
    assert (after.status, after.version) == ("current", LATEST)
    assert migrate(empty_db) == []  # nothing left to apply

    async def tenant() -> list[object]:
        conn = await asyncpg.connect(empty_db)
        try:
            return list(await conn.fetchrow("SELECT name, enabled FROM tenants"))
        finally:
            await conn.close()

    assert asyncio.run(tenant()) == ["old", True]


def test_states_missing_behind_current_and_ahead(empty_db: str) -> None:
    assert state(empty_db) == SchemaState(frozenset())
    migrate(empty_db, MIGRATIONS[:1])
    behind = state(empty_db)
    assert (behind.status, behind.version) == ("behind", 1)
    assert "run `notifier migrate`" in behind.describe()
    migrate(empty_db)
    assert state(empty_db).status == "current"
    run_on(empty_db, f"INSERT INTO schema_migrations VALUES ({LATEST + 1}, 'from_the_future')")
    ahead = state(empty_db)
    assert (ahead.status, ahead.version) == ("ahead", LATEST + 1)


def test_a_failing_migration_leaves_the_database_as_it_was(empty_db: str, tmp_path: Path) -> None:
    for m in MIGRATIONS:
        (tmp_path / f"{m.version:04d}_{m.name}.sql").write_text(m.sql)
    (tmp_path / f"{LATEST + 1:04d}_broken.sql").write_text(
        "ALTER TABLE tenants ADD COLUMN note text;\nSELECT no_such_function();"
    )
    with pytest.raises(asyncpg.UndefinedFunctionError):
        migrate(empty_db, load_migrations(tmp_path))
    # One transaction: not even the migrations before the broken one were kept.
    assert state(empty_db).status == "missing"


async def test_two_migrates_at_once_apply_each_migration_once(empty_db: str) -> None:
    results: list[list[str]] = []

    async def one() -> None:
        results.append(await trio.to_thread.run_sync(migrate, empty_db))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)
    assert sorted(results, key=len) == [[], [m.name for m in MIGRATIONS]]
    assert (await trio.to_thread.run_sync(state, empty_db)).status == "current"


def test_migration_files_are_numbered_without_gaps(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0003_c.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="without gaps"):
        load_migrations(tmp_path)
    (tmp_path / "0003_c.sql").unlink()
    (tmp_path / "2_b.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="NNNN_"):
        load_migrations(tmp_path)
    assert os.path.isdir(ROOT / "src/notifier/store/migrations")


def test_the_history_of_a_database_with_rows_is_partitioned_and_keeps_them(empty_db: str) -> None:
    # A database as migrations 0001-0007 left it, with history in it: an old finished delivery,
    # a recent one still retrying, their attempts, an idempotency key.
    migrate(empty_db, MIGRATIONS[:7])
    tenant, channel = uuid.uuid4(), uuid.uuid4()
    e_old, e_new, d_old, d_new = (uuid.uuid4() for _ in range(4))

    async def setup() -> None:
        conn = await asyncpg.connect(empty_db)
        try:
            await conn.execute(
                "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, 'old', 'h')", tenant
            )
            await conn.executemany(
                "INSERT INTO events (id, tenant_id, type, payload, idempotency_key, created_at) "
                "VALUES ($1, $2, 'order.created', '{\"n\": 1}', $3, now() - $4 * interval '1 day')",
                [(e_old, tenant, "k-old", 40), (e_new, tenant, None, 1)],
            )
            await conn.executemany(
                "INSERT INTO deliveries (id, event_id, channel_id, tenant_id, channel_type, "
                "max_attempts, status, created_at) SELECT $1, id, $2, tenant_id, 'webhook', 5, "
                "$3, created_at FROM events WHERE id = $4",
                [(d_old, channel, "DELIVERED", e_old), (d_new, channel, "RETRYING", e_new)],
            )
            await conn.execute(
                "INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, "
                "outcome, status_code) VALUES ($1, 1, now(), 3, 'delivered', 200), "
                "($2, 1, now(), 3, 'retry', 503)", d_old, d_new,
            )  # fmt: skip
        finally:
            await conn.close()

    asyncio.run(setup())
    assert migrate(empty_db) == [m.name for m in MIGRATIONS[7:]]
    assert state(empty_db).status == "current"

    async def check() -> None:
        conn = await asyncpg.connect(empty_db)
        try:
            kinds = await conn.fetch(
                "SELECT relname::text, relkind::text FROM pg_class WHERE relname = ANY($1)",
                ["events", "deliveries", "delivery_attempts", "events_legacy"],
            )
            assert dict(kinds) == {"events": "p", "deliveries": "p", "delivery_attempts": "p",
                                   "events_legacy": "r"}  # fmt: skip
            # The rows are where they were, read through the partitioned tables.
            assert [r[0] for r in await conn.fetch("SELECT id FROM events ORDER BY created_at")] \
                == [e_old, e_new]  # fmt: skip
            assert await conn.fetchval("SELECT count(*) FROM events_legacy") == 2
            assert await conn.fetchval("SELECT count(*) FROM deliveries_legacy") == 2
            assert await conn.fetchval("SELECT count(*) FROM delivery_attempts") == 2
            # The key still holds.
            assert await conn.fetchval(
                "SELECT event_id FROM event_keys "
                "WHERE tenant_id = $1 AND idempotency_key = 'k-old'", tenant,
            ) == e_old  # fmt: skip
            with pytest.raises(asyncpg.UniqueViolationError):
                await conn.execute(
                    "INSERT INTO event_keys VALUES ($1, 'k-old', gen_random_uuid(), now())", tenant
                )
            # The old delivery's next attempt joins the legacy partition; ids go on.
            old_max = await conn.fetchval("SELECT max(id) FROM delivery_attempts")
            await conn.execute(
                "INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, "
                "outcome, delivery_created_at) SELECT id, 2, now(), 3, 'delivered', created_at "
                "FROM deliveries WHERE id = $1", d_new,
            )  # fmt: skip
            assert await conn.fetchval(
                "SELECT tableoid::regclass::text FROM delivery_attempts WHERE id > $1", old_max
            ) == "delivery_attempts_legacy"  # fmt: skip
            # A new event goes into today's partition.
            await conn.execute(
                "INSERT INTO events (id, tenant_id, type, payload) "
                "VALUES (gen_random_uuid(), $1, 'x', '{}')", tenant,
            )  # fmt: skip
            today = datetime.now(UTC).strftime("events_p%Y%m%d")
            assert await conn.fetchval(
                "SELECT tableoid::regclass::text FROM events WHERE type = 'x'"
            ) == today  # fmt: skip
            # Retention keeps the legacy partition while a delivery of it is unfinished, then
            # drops it whole.
            assert await conn.fetchval("SELECT notifier_partition_drop('_legacy')") is False
            await conn.execute("UPDATE deliveries SET status = 'DELIVERED' WHERE id = $1", d_new)
            assert await conn.fetchval("SELECT notifier_partition_drop('_legacy')") is True
            assert await conn.fetchval("SELECT to_regclass('events_legacy')") is None
            assert await conn.fetchval("SELECT count(*) FROM events") == 1
            assert await conn.fetchval("SELECT count(*) FROM delivery_attempts") == 0
        finally:
            await conn.close()

    asyncio.run(check())
