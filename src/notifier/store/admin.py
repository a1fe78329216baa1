"""The store's queries for the schema, tenants, health and metrics: ``migrate`` (the CLI) and
``schema_state`` (start-up, ``/readyz``, ``notifier check``), tenants (the CLI manages them, the
API finds them by API key, ingest LISTENs for their changes), ``ping`` (``/readyz``) and the
scrape-time gauges (``/metrics``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import trio

from notifier.bridge import aio
from notifier.errors import StoreError, StoreUnavailable
from notifier.store import versions
from notifier.store.base import UNAVAILABLE, Conn, Q, crossing, transaction
from notifier.store.errors import TenantExists
from notifier.store.pool import Queries
from notifier.store.rows import MetricsSnapshot

# Schema changes may rewrite big tables or wait for another migrate: not bounded like requests.
MIGRATE_TIMEOUT_SECONDS = 3600.0
TENANT_NAME_CONSTRAINT = "tenants_name_key"  # Postgres's name for schema.sql's UNIQUE (name)
# schema.sql's trigger NOTIFYs the tenant's id here on every UPDATE or DELETE of a tenants row.
TENANTS_CHANNEL = "notifier_tenants"

log = logging.getLogger("notifier.store")


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
            return await versions.apply_missing(conn, statement_seconds=MIGRATE_TIMEOUT_SECONDS)

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

    @asynccontextmanager
    async def open_tenant_changes(self) -> AsyncIterator[TenantChanges]:
        """Trio-flavoured. LISTEN on the tenants' channel on a connection of its own; iterate
        the result for the ids of the tenants changed, until that connection is lost.

        Without a DSN to LISTEN on (behind a transaction pooler with no ``listen_url``) the
        result is not ``listening`` and its iteration never yields nor ends."""
        if self._listen_dsn is None:
            yield TenantChanges(None, listening=False)
            return
        send, receive = trio.open_memory_channel[str](math.inf)
        token = trio.lowlevel.current_trio_token()

        def on_notify(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            token.run_sync_soon(_send, send, str(payload))  # asyncio-flavoured callback

        def on_lost(*_: object) -> None:
            token.run_sync_soon(send.close)

        unreadable = ""
        try:
            conn: asyncpg.Connection = await aio(asyncpg.connect, self._listen_dsn, timeout=10)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"Postgres unavailable: {exc!r}") from exc
        except ValueError as exc:  # asyncpg's ClientConfigurationError is one too
            unreadable = type(exc).__name__
        if unreadable:
            # asyncpg's message quotes a part of the URL, a password perhaps: neither it nor
            # the exception itself goes any further.
            raise StoreError(
                "cannot LISTEN: asyncpg cannot read the URL to LISTEN on (database.listen_url, "
                f"or database.url without it): {unreadable}"
            )
        try:
            try:
                await aio(conn.add_listener, TENANTS_CHANNEL, on_notify)
            except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
                raise StoreUnavailable(f"LISTEN failed: {exc!r}") from exc
            conn.add_termination_listener(on_lost)
            if conn.is_closed():  # lost before the listener was in place: it will not say so
                send.close()
            yield TenantChanges(receive, listening=True)
        finally:
            send.close()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await aio(conn.close, timeout=5)
                except Exception:
                    conn.terminate()

    @crossing
    async def metrics_snapshot(self) -> MetricsSnapshot:
        """The scrape-time gauges (outbox depth, open deliveries) in one statement."""
        row = await self._pool.fetchrow(Q["metrics_snapshot"])
        assert row is not None
        return MetricsSnapshot(
            outbox_depth=row["outbox_depth"], pending=row["pending"], retrying=row["retrying"],
            oldest_open_age_seconds=row["oldest_open_age_seconds"],
        )  # fmt: skip


class TenantChanges:
    """The ids (as sent: text) of the tenants changed, as they are NOTIFYed; the iteration
    ends when the LISTEN connection is lost. Not ``listening``: never yields nor ends."""

    def __init__(self, receive: trio.MemoryReceiveChannel[str] | None, *, listening: bool) -> None:
        self._receive = receive
        self.listening = listening

    async def __aiter__(self) -> AsyncIterator[str]:
        if self._receive is None:
            await trio.sleep_forever()
        else:
            async for payload in self._receive:
                yield payload


def _send(send: trio.MemorySendChannel[str], payload: str) -> None:
    with contextlib.suppress(trio.ClosedResourceError):  # the connection was lost meanwhile
        send.send_nowait(payload)
