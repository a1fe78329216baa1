"""The store's queries for the maintenance loop: the reconciler, retention, outbox hygiene and
the cleanup of idle rate-limit buckets, closed circuits, expired console sessions and forgotten
sign-in failures.
They wait on nobody's request, and on a big database one batch may well take longer than a
request may: their statements have a longer bound of their own."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from notifier.store.base import Conn, Q, transaction
from notifier.store.console_sessions import SIGNIN_FORGET_AFTER_SECONDS
from notifier.store.pool import CLIENT_GRACE_SECONDS, LongStatements, Queries

MAINTENANCE_STATEMENT_TIMEOUT_SECONDS = 60.0


class MaintenanceQueries(Queries):
    """What ``maintenance.maintenance_pass`` runs, a batch per call."""

    @transaction
    async def reconcile(self, *, stuck_after_seconds: float, limit: int) -> list[uuid.UUID]:
        """Enqueue stuck unfinished deliveries again (see ``reconcile`` in queries_maintenance.sql);
        return their ids."""
        async with self._maintenance() as conn:
            rows = await conn.fetch(Q["reconcile"], float(stuck_after_seconds), limit)
        return [r["id"] for r in rows]

    @transaction
    async def delete_expired(self, *, retention_days: int, limit: int) -> int:
        """Delete up to ``limit`` finished events older than ``retention_days``; return how
        many."""
        async with self._maintenance() as conn:
            return len(await conn.fetch(Q["retention"], retention_days, limit))

    @transaction
    async def clean_outbox(self, *, limit: int, refused_after: int) -> tuple[int, int]:
        """Delete outbox rows of finished or deleted deliveries; return how many, and how many
        rows the broker has refused at least ``refused_after`` times."""
        async with self._maintenance() as conn:
            deleted = len(await conn.fetch(Q["outbox_hygiene"], limit))
            refused: int = await conn.fetchval(Q["outbox_refused_count"], refused_after)
        return deleted, refused

    @transaction
    async def clean_rate_buckets(self, *, limit: int) -> int:
        """Delete up to ``limit`` rate-limit buckets that have been full again for a while (a
        new bucket is the same); return how many."""
        async with self._maintenance() as conn:
            return len(await conn.fetch(Q["rate_buckets_cleanup"], limit))

    @transaction
    async def clean_circuits(self, *, limit: int) -> int:
        """Delete up to ``limit`` circuits closed and unchanged for an hour (a missing row is a
        closed circuit); return how many."""
        async with self._maintenance() as conn:
            return len(await conn.fetch(Q["circuits_cleanup"], limit))

    @transaction
    async def clean_console(self, *, limit: int) -> int:
        """Delete up to ``limit`` expired console sessions and up to ``limit`` addresses whose
        failed sign-ins are forgotten (quiet for ``SIGNIN_FORGET_AFTER_SECONDS``); return how
        many rows in all."""
        async with self._maintenance() as conn:
            sessions = await conn.fetch(Q["console_sessions_cleanup"], limit)
            failures = await conn.fetch(
                Q["console_signin_failures_cleanup"], limit, SIGNIN_FORGET_AFTER_SECONDS
            )
        return len(sessions) + len(failures)

    @asynccontextmanager
    async def _maintenance(self) -> AsyncIterator[Conn]:
        """Asyncio-flavoured. A connection in a transaction of its own whose statements may run
        ``MAINTENANCE_STATEMENT_TIMEOUT_SECONDS`` (on the server and on the client)."""
        seconds = MAINTENANCE_STATEMENT_TIMEOUT_SECONDS
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(f"SET LOCAL statement_timeout = {math.ceil(seconds * 1000)}")
            yield LongStatements(conn, seconds + CLIENT_GRACE_SECONDS)
