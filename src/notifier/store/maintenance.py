"""The store's queries for the maintenance loop: the reconciler, the history's partitions and
their retention, outbox hygiene and
the cleanup of idle rate-limit buckets, closed circuits, expired console sessions and forgotten
sign-in failures.
They wait on nobody's request, and on a big database one batch may well take longer than a
request may: their statements have a longer bound of their own."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime, timedelta

import asyncpg

from notifier.store.base import Conn, Q, transaction
from notifier.store.console_sessions import SIGNIN_FORGET_AFTER_SECONDS
from notifier.store.pool import CLIENT_GRACE_SECONDS, LongStatements, Queries
from notifier.store.portal import PORTAL_LINKS_KEPT_DAYS

log = logging.getLogger("notifier.maintenance")

MAINTENANCE_STATEMENT_TIMEOUT_SECONDS = 60.0
# Making or dropping a partition takes a lock on its table that every statement on the table
# waits behind: it waits this long for the lock at most (and tries again on the next pass).
PARTITION_LOCK_TIMEOUT_MS = 500
# The history's partitions are made this many days ahead of today (by every maintenance pass and
# `notifier migrate`): a maintenance role down for less than that leaves ingest nothing to miss.
PARTITION_DAYS_AHEAD = 7


def partition_days(days_ahead: int = PARTITION_DAYS_AHEAD) -> tuple[date, date]:
    """Today (UTC) and the day ``days_ahead`` after it: the days whose history partitions
    ``partitions_ensure`` makes."""
    today = datetime.now(UTC).date()
    return today, today + timedelta(days=days_ahead)


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
    async def ensure_partitions(self, *, days_ahead: int) -> int:
        """Make the history's partitions of today (UTC) and the ``days_ahead`` days after it
        that are not there yet; return how many tables it made."""
        async with self._maintenance(lock_timeout_ms=PARTITION_LOCK_TIMEOUT_MS) as conn:
            made: int = await conn.fetchval(Q["partitions_ensure"], *partition_days(days_ahead))
        return made

    async def drop_expired_days(self, *, retention_days: int) -> tuple[list[str], list[str]]:
        """Trio-flavoured. Drop each day of history that ended more than ``retention_days`` ago
        and has no unfinished delivery, each in a transaction of its own; return the days
        dropped and those kept (their partitions' suffixes, oldest first). A day is kept for an
        unfinished delivery, or when its lock was not had within ``PARTITION_LOCK_TIMEOUT_MS``
        (the next pass tries again)."""
        dropped: list[str] = []
        kept: list[str] = []
        for suffix in await self._due_days(retention_days):
            (dropped if await self._drop_day(suffix) else kept).append(suffix)
        return dropped, kept

    @transaction
    async def _due_days(self, retention_days: int) -> list[str]:
        async with self._maintenance() as conn:
            return [r["suffix"] for r in await conn.fetch(Q["partitions_due"], retention_days)]

    @transaction
    async def _drop_day(self, suffix: str) -> bool:
        try:
            async with self._maintenance(lock_timeout_ms=PARTITION_LOCK_TIMEOUT_MS) as conn:
                dropped: bool = await conn.fetchval(Q["partition_drop"], suffix)
        except asyncpg.LockNotAvailableError:
            log.info("retention: history%s busy, left for the next pass", suffix)
            return False
        return dropped

    @transaction
    async def clean_event_keys(self, *, retention_days: int, limit: int) -> int:
        """Delete up to ``limit`` idempotency keys whose events are gone with their day; return
        how many."""
        async with self._maintenance() as conn:
            return len(await conn.fetch(Q["event_keys_cleanup"], retention_days, limit))

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
        failed sign-ins are forgotten (quiet for ``SIGNIN_FORGET_AFTER_SECONDS``), and as many
        ended portal sessions and portal links ended ``PORTAL_LINKS_KEPT_DAYS`` ago; return how
        many rows in all."""
        async with self._maintenance() as conn:
            sessions = await conn.fetch(Q["console_sessions_cleanup"], limit)
            failures = await conn.fetch(
                Q["console_signin_failures_cleanup"], limit, SIGNIN_FORGET_AFTER_SECONDS
            )
            portal = await conn.fetch(Q["portal_sessions_cleanup"], limit)
            links = await conn.fetch(Q["portal_links_cleanup"], limit, PORTAL_LINKS_KEPT_DAYS)
        return len(sessions) + len(failures) + len(portal) + len(links)

    @asynccontextmanager
    async def _maintenance(self, *, lock_timeout_ms: int | None = None) -> AsyncIterator[Conn]:
        """Asyncio-flavoured. A connection in a transaction of its own whose statements may run
        ``MAINTENANCE_STATEMENT_TIMEOUT_SECONDS`` (on the server and on the client), and wait
        ``lock_timeout_ms`` at most for a lock when given."""
        seconds = MAINTENANCE_STATEMENT_TIMEOUT_SECONDS
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(f"SET LOCAL statement_timeout = {math.ceil(seconds * 1000)}")
            if lock_timeout_ms is not None:
                await conn.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
            yield LongStatements(conn, seconds + CLIENT_GRACE_SECONDS)
