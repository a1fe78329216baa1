"""The store: the query classes of every role composed into one ``Store`` over one bounded
asyncpg pool on the bridge loop, and ``open_store`` to open it.

Each role's queries live in a module of their own (``admin``, ``channels``, ``event_types``,
``events``, ``expunge``, ``deliveries``, ``attempts``, ``outbox``, ``maintenance``,
``ratelimits``, ``circuits``, ``console``, ``console_sessions``, ``alerts``); what they share
(the named SQL, the one bridge crossing, the error mapping) in ``base``, the bounded pool in
``pool``; its errors in ``errors``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from notifier.bridge import aio, open_bridge
from notifier.store.admin import AdminQueries
from notifier.store.alerts import AlertQueries
from notifier.store.attempts import AttemptQueries
from notifier.store.channels import ChannelQueries
from notifier.store.circuits import CircuitQueries
from notifier.store.console import ConsoleQueries
from notifier.store.console_sessions import ConsoleSessionQueries
from notifier.store.deliveries import DeliveryQueries
from notifier.store.event_types import EventTypeQueries
from notifier.store.events import EventQueries
from notifier.store.expunge import ExpungeQueries
from notifier.store.maintenance import MaintenanceQueries
from notifier.store.outbox import OutboxQueries
from notifier.store.pool import Pooler, create_pool
from notifier.store.portal import PortalQueries
from notifier.store.ratelimits import RateLimitQueries


class Store(
    AdminQueries,
    ChannelQueries,
    EventTypeQueries,
    EventQueries,
    ExpungeQueries,
    DeliveryQueries,
    AttemptQueries,
    OutboxQueries,
    MaintenanceQueries,
    RateLimitQueries,
    CircuitQueries,
    ConsoleQueries,
    ConsoleSessionQueries,
    PortalQueries,
    AlertQueries,
):
    """Trio-flavoured access to Postgres, for every role. Create with ``open_store``."""


@asynccontextmanager
async def open_store(
    dsn: str,
    *,
    max_size: int = 20,
    connect_timeout_seconds: float = 5.0,
    acquire_timeout_seconds: float = 1.0,
    statement_timeout_seconds: float = 3.0,
    pooler: Pooler = "none",
    listen_dsn: str = "",
) -> AsyncIterator[Store]:
    """Trio-flavoured. Open the bridge (if needed) and a pool; close it on exit.

    A store call waits at most ``acquire_timeout_seconds`` for a connection, and each statement
    runs at most ``statement_timeout_seconds`` (see ``notifier.store.pool``). ``pooler`` says
    what ``dsn`` reaches (``"pgbouncer"``: PgBouncer in transaction pooling mode). The outbox
    doorbell LISTENs on ``listen_dsn``, else on ``dsn`` — but never through a transaction
    pooler, where a LISTEN would be lost with the transaction: there, without ``listen_dsn``,
    the relay only polls."""
    listen = listen_dsn or (dsn if pooler == "none" else None)
    async with open_bridge():
        pool, bounded = await create_pool(
            dsn, max_size=max_size, connect_timeout_seconds=connect_timeout_seconds,
            acquire_timeout_seconds=acquire_timeout_seconds,
            statement_timeout_seconds=statement_timeout_seconds, pooler=pooler,
        )  # fmt: skip
        try:
            yield Store(bounded, listen)
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(10) as closing:
                    await aio(pool.close)
                if closing.cancelled_caught:
                    pool.terminate()
