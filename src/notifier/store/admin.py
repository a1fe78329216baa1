"""The store's queries for the schema, tenants, health and metrics: ``migrate`` (the CLI and
start-up), tenants (the CLI creates them, the API finds them by API key), ``ping`` (``/readyz``)
and the scrape-time gauges (``/metrics``)."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from notifier.store.base import SCHEMA_PATH, Conn, Q, crossing, transaction
from notifier.store.errors import TenantExists
from notifier.store.pool import Queries
from notifier.store.rows import MetricsSnapshot

MIGRATE_LOCK = 0x6E6F7469  # advisory lock key for migrate ("noti")
# Schema changes may rewrite big tables or wait for another migrate: not bounded like requests.
MIGRATE_TIMEOUT_SECONDS = 3600.0
TENANT_NAME_CONSTRAINT = "tenants_name_key"  # Postgres's name for schema.sql's UNIQUE (name)


class AdminQueries(Queries):
    """Schema, tenants, health and metrics."""

    @transaction
    async def migrate(self) -> None:
        sql = SCHEMA_PATH.read_text(encoding="utf-8")
        wait = MIGRATE_TIMEOUT_SECONDS
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL statement_timeout = 0")
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATE_LOCK, timeout=wait)
            await conn.execute(sql, timeout=wait)

    @crossing
    async def ping(self, timeout_seconds: float) -> None:
        """Whether Postgres answers ``SELECT 1`` within ``timeout_seconds`` (taking a connection
        included); ``StoreUnavailable`` when it does not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        async with self._pool.acquire(timeout_seconds) as proxy:
            conn: Conn = proxy  # the store's own connection behind asyncpg's proxy: takes `bare`
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError("no connection in time")
            # Bare: behind a transaction pooler, a BEGIN and a COMMIT around it would each be
            # another round trip that ``left`` does not bound.
            await conn.fetchval("SELECT 1", timeout=left, bare=True)

    @transaction
    async def create_tenant(self, name: str, api_key_hash: str) -> uuid.UUID:
        """The new tenant's id; ``TenantExists`` if the name is taken."""
        try:
            row = await self._pool.fetchrow(Q["tenant_create"], uuid.uuid4(), name, api_key_hash)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != TENANT_NAME_CONSTRAINT:
                raise
            raise TenantExists(name) from exc
        assert row is not None
        tenant_id: uuid.UUID = row["id"]
        return tenant_id

    @crossing
    async def tenant_by_key_hash(self, api_key_hash: str) -> uuid.UUID | None:
        tenant_id: uuid.UUID | None = await self._pool.fetchval(
            Q["tenant_by_key_hash"], api_key_hash
        )
        return tenant_id

    @crossing
    async def metrics_snapshot(self) -> MetricsSnapshot:
        """The scrape-time gauges (outbox depth, open deliveries) in one statement."""
        row = await self._pool.fetchrow(Q["metrics_snapshot"])
        assert row is not None
        return MetricsSnapshot(
            outbox_depth=row["outbox_depth"], pending=row["pending"], retrying=row["retrying"],
            oldest_open_age_seconds=row["oldest_open_age_seconds"],
        )  # fmt: skip
