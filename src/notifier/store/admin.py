"""The store's queries for the schema, tenants, health and metrics: ``migrate`` (the CLI) and
``schema_state`` (start-up, ``/readyz``, ``notifier check``), tenants (the CLI manages them, the
API finds them by API key, ingest LISTENs for their changes), ``ping`` (``/readyz``) and the
scrape-time gauges (``/metrics``)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import uuid
from contextlib import AbstractAsyncContextManager

import asyncpg

from notifier.store import listen, versions
from notifier.store.base import Conn, Q, crossing, transaction
from notifier.store.errors import TenantExists
from notifier.store.listen import TenantChanges
from notifier.store.maintenance import partition_days
from notifier.store.pool import Queries
from notifier.store.rows import MetricsSnapshot

# Schema changes may rewrite big tables or wait for another migrate: not bounded like requests.
MIGRATE_TIMEOUT_SECONDS = 3600.0
TENANT_NAME_CONSTRAINT = "tenants_name_key"  # Postgres's name for schema.sql's UNIQUE (name)


@dataclasses.dataclass(frozen=True)
class Tenant:
    """A tenant as ``notifier tenant list`` shows it: never its key (nor the key's hash)."""

    id: uuid.UUID
    name: str
    created_at: datetime.datetime
    enabled: bool


class AdminQueries(Queries):
    """Schema, tenants, health and metrics."""

    @transaction
    async def migrate(self) -> list[versions.Migration]:
        """Apply the missing migrations (``notifier.store.versions``); the ones applied."""
        async with self._pool.acquire() as conn:
            applied = await versions.apply_missing(conn, statement_seconds=MIGRATE_TIMEOUT_SECONDS)
            # The history's partitions of the first days, made again on a database already
            # current (the migration that partitioned the history made them on its day).
            await conn.fetchval(
                Q["partitions_ensure"], *partition_days(), timeout=MIGRATE_TIMEOUT_SECONDS
            )
            return applied

    @crossing
    async def schema_state(self, timeout_seconds: float | None = None) -> versions.SchemaState:
        """The schema versions the database has applied, against the ones this code knows."""
        async with self._pool.acquire(timeout_seconds) as proxy:
            conn: Conn = proxy
            return await versions.read_state(conn, statement_seconds=timeout_seconds)

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
        """The enabled tenant whose API key has this hash."""
        tenant_id: uuid.UUID | None = await self._pool.fetchval(
            Q["tenant_by_key_hash"], api_key_hash
        )
        return tenant_id

    @crossing
    async def list_tenants(self) -> list[Tenant]:
        rows = await self._pool.fetch(Q["tenant_list"])
        return [Tenant(r["id"], r["name"], r["created_at"], r["enabled"]) for r in rows]

    @transaction
    async def rotate_tenant_key(self, name: str, api_key_hash: str) -> bool:
        """Replace the key of the tenant ``name``; False when there is no such tenant."""
        return await self._pool.fetchval(Q["tenant_rotate_key"], name, api_key_hash) is not None

    @transaction
    async def set_tenant_enabled(self, name: str, enabled: bool) -> bool:
        """Enable or disable the tenant ``name``; False when there is no such tenant."""
        return await self._pool.fetchval(Q["tenant_set_enabled"], name, enabled) is not None

    def open_tenant_changes(self) -> AbstractAsyncContextManager[TenantChanges]:
        """Trio-flavoured. The ids of the tenants changed, as they are NOTIFYed
        (``listen.open_tenant_changes``, on the store's DSN for a connection of its own)."""
        return listen.open_tenant_changes(self._listen_dsn)

    @crossing
    async def metrics_snapshot(self, retention_days: int = 0) -> MetricsSnapshot:
        """The scrape-time gauges (outbox depth, open deliveries, the history's days,
        circuits, channels notifier disabled) in one statement; days of history older than
        ``retention_days`` (0: none) are overdue."""
        row = await self._pool.fetchrow(Q["metrics_snapshot"], retention_days)
        assert row is not None
        return MetricsSnapshot(
            outbox_depth=row["outbox_depth"], pending=row["pending"], retrying=row["retrying"],
            history_days_overdue=row["days_overdue"], history_ahead_seconds=row["ahead_seconds"],
            oldest_open_age_seconds=row["oldest_open_age_seconds"],
            circuits=tuple(zip(row["circuit_types"], row["circuit_destinations"],
                               row["circuit_states"], strict=True)),
            auto_disabled=tuple(zip(row["disabled_types"], row["disabled_counts"], strict=True)),
            fifo_lines=tuple(zip(row["fifo_types"], map(str, row["fifo_channels"]),
                                 row["fifo_backlogs"], row["fifo_ages"], strict=True)),
        )  # fmt: skip
