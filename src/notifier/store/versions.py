"""Schema versions: the migrations in ``migrations/`` (``NNNN_<what>.sql``, shipped inside the
package), applying the missing ones, and what a database has.

A database records each migration applied in ``schema_migrations``. ``apply_missing`` applies
every missing one in ONE transaction under a transaction-level advisory lock: a failed migrate
leaves the database as it was (Postgres's DDL is transactional), two migrates at once wait for
each other, and it works through PgBouncer in transaction pooling mode, which keeps no session
(so no session-level lock) from one transaction to the next. A migration therefore must not
need to run outside a transaction (``CREATE INDEX CONCURRENTLY``, ``ALTER TYPE … ADD VALUE``
before Postgres 12).

0001 is the schema of the releases before versions were recorded, idempotent as it was: on a
database that one of them migrated, applying it changes nothing and records it.

asyncio-flavoured (asyncpg connections): the store's ``migrate`` and ``schema_state`` call it
across the bridge, the test fixtures straight.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import asyncpg

from notifier.errors import NotifierError

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
MIGRATE_LOCK = 0x6E6F7469  # advisory lock key for migrate ("noti")
_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)"""


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migrations of ``directory`` in version order; versions must run 1, 2, … with no
    gap, and every ``.sql`` file there must be named ``NNNN_<what>.sql``."""
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.fullmatch(path.name)
        if match is None:
            raise ValueError(f"{path}: a migration is named NNNN_<what>.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(
            f"{directory}: migration versions must be 1, 2, … without gaps: {versions}"
        )
    return found


MIGRATIONS = load_migrations()
LATEST = MIGRATIONS[-1].version


class SchemaNotCurrent(NotifierError):
    """The database's schema is missing or older than this code's: run ``notifier migrate``."""


Status = Literal["current", "missing", "behind", "ahead"]


@dataclasses.dataclass(frozen=True)
class SchemaState:
    """The versions a database has applied, against those this code knows (1…``latest``)."""

    applied: frozenset[int]
    latest: int = LATEST

    @property
    def version(self) -> int:
        return max(self.applied, default=0)

    @property
    def status(self) -> Status:
        if not self.applied:
            return "missing"
        if self.version > self.latest:
            return "ahead"
        if set(range(1, self.latest + 1)) - self.applied:
            return "behind"
        return "current"

    def describe(self) -> str:
        """One line for an operator (no secrets: versions only)."""
        if self.status == "current":
            return f"schema version {self.version} (current)"
        if self.status == "missing":
            return (
                f"the database has no schema version (this code needs {self.latest}): "
                "run `notifier migrate`"
            )
        if self.status == "behind":
            missing = sorted(set(range(1, self.latest + 1)) - self.applied)
            return (
                f"schema version {self.version} is older than this code's {self.latest} "
                f"(missing {', '.join(map(str, missing))}): run `notifier migrate`"
            )
        return (
            f"schema version {self.version} is newer than this code's {self.latest}: "
            "a newer release migrated this database"
        )


async def read_state(conn: Any, *, statement_seconds: float | None = None) -> SchemaState:
    """The schema state of the database behind ``conn`` (one statement; a database without
    ``schema_migrations`` has none)."""
    try:
        rows = await conn.fetch("SELECT version FROM schema_migrations", timeout=statement_seconds)
    except asyncpg.UndefinedTableError:
        return SchemaState(frozenset())
    return SchemaState(frozenset(r["version"] for r in rows))


async def apply_missing(
    conn: Any,
    migrations: Sequence[Migration] = MIGRATIONS,
    *,
    statement_seconds: float | None = None,
) -> list[Migration]:
    """Apply the migrations the database behind ``conn`` lacks, in order, in one transaction
    under the advisory lock; the ones applied."""
    applied: list[Migration] = []
    async with conn.transaction():
        await conn.execute("SET LOCAL statement_timeout = 0")
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1)", MIGRATE_LOCK, timeout=statement_seconds
        )
        await conn.execute(CREATE_TABLE, timeout=statement_seconds)
        have = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for m in migrations:
            if m.version in have:
                continue
            await conn.execute(m.sql, timeout=statement_seconds)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name
            )
            applied.append(m)
    return applied


def names(migrations: Iterable[Migration]) -> str:
    return ", ".join(f"{m.version:04d}_{m.name}" for m in migrations) or "none"
