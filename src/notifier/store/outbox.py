"""The store's queries for the relay: claim due outbox rows (locked for one pass, deleted or
pushed back when the broker has answered), and the doorbell that says new rows are there."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import trio

from notifier.bridge import aio
from notifier.hint import Doorbell
from notifier.store.base import Conn, Q, crossing
from notifier.store.listen import listening
from notifier.store.pool import Pool, Queries
from notifier.store.rows import OutboxRow

log = logging.getLogger("notifier.store")

DOORBELL_CHANNEL = "notifier_outbox"
_OUTBOX_COLUMNS = ("id", "delivery_id", "routing_key", "body", "created_at", "traceparent")


class OutboxQueries(Queries):
    """What the relay (``relay.relay.OutboxStore``) uses."""

    @asynccontextmanager
    async def claim_outbox(self, limit: int) -> AsyncIterator[OutboxClaim]:
        """Trio-flavoured. Lock up to ``limit`` due outbox rows for the length of the block.

        Rows stay locked (other relays skip them) until the block ends; the changes made through
        the claim commit when it ends normally and roll back when it raises or is cancelled.
        """
        conn = await self._acquire()
        claim = OutboxClaim(conn)
        try:
            await claim._begin(limit)
            yield claim
            await claim._commit()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await claim._close(self._pool)

    @crossing
    async def _acquire(self) -> Conn:
        return await self._pool.acquire()

    @crossing
    async def outbox_depth(self) -> int:
        depth: int = await self._pool.fetchval(Q["outbox_depth"])
        return depth

    @asynccontextmanager
    async def open_doorbell(self) -> AsyncIterator[Doorbell]:
        """Trio-flavoured. LISTEN on the outbox channel on a connection of its own; the bell
        says when that connection is lost (the relay then listens again with a new one).

        Without a DSN to LISTEN on (behind a transaction pooler with no ``listen_url``) the
        bell never rings and is never lost: the relay polls."""
        bell = Doorbell()
        if self._listen_dsn is None:
            log.info(
                "no LISTEN through a transaction pooler and no database.listen_url: the relay "
                "polls the outbox every relay.poll_interval_seconds"
            )
            yield bell
            return
        async with listening(
            self._listen_dsn, DOORBELL_CHANNEL, on_notify=lambda _: bell.ring(), on_lost=bell.lost
        ):
            yield bell


class OutboxClaim:
    """Rows claimed by one relay pass. Trio-flavoured methods; one crossing each."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._tx: Any = None
        self.rows: list[OutboxRow] = []

    @crossing
    async def _begin(self, limit: int) -> None:
        self._tx = self._conn.transaction()
        await self._tx.start()
        records = await self._conn.fetch(Q["outbox_claim"], limit)
        self.rows = [OutboxRow(*(r[k] for k in _OUTBOX_COLUMNS)) for r in records]

    @crossing
    async def finish(self, sent: Sequence[int], refused: Mapping[int, str]) -> None:
        """Delete the rows the broker confirmed; push back the ones it refused."""
        if sent:
            await self._conn.execute(Q["outbox_delete"], list(sent))
        if refused:
            await self._conn.execute(Q["outbox_refused"], list(refused), list(refused.values()))

    @crossing
    async def _commit(self) -> None:
        await self._tx.commit()
        self._tx = None

    async def _close(self, pool: Pool) -> None:
        """Trio-flavoured; roll back anything unfinished and give the connection back."""

        async def close() -> None:
            try:
                if self._tx is not None:
                    await self._tx.rollback()
            except asyncpg.InterfaceError:
                # The connection is closed already (a statement timed out): Postgres rolls the
                # transaction back itself, and the pool has the connection back.
                pass
            except Exception:
                # A broken connection: the pool discards it on release.
                log.warning("outbox claim: rollback failed", exc_info=True)
            finally:
                await pool.release(self._conn)

        try:
            await aio(close)
        except Exception:
            log.warning("outbox claim: releasing the connection failed", exc_info=True)
