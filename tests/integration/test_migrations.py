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
