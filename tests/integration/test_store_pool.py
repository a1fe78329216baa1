"""The pooled connections of the store against the real Postgres: giving a connection back costs
no statement, and still never hands on an open transaction."""

from __future__ import annotations

import pytest

from notifier.bridge import aio, open_bridge
from notifier.store.pool import create_pool

pytestmark = pytest.mark.integration


async def test_giving_a_connection_back_sends_nothing_unless_a_transaction_is_open(
    database_url: str,
) -> None:
    async with open_bridge():
        raw, pool = await create_pool(
            database_url, max_size=1, connect_timeout_seconds=5, acquire_timeout_seconds=2,
            statement_timeout_seconds=3,
        )  # fmt: skip
        sent: list[str] = []

        async def scenario() -> bool:
            conn = await pool.acquire()
            conn.add_query_logger(lambda record: sent.append(record.query))
            await conn.fetchval("SELECT 1")
            await pool.release(conn)  # nothing to undo: no statement
            conn = await pool.acquire()  # the same connection (max_size=1)
            await conn.execute("BEGIN")
            await pool.release(conn)  # left in a transaction: rolled back
            conn = await pool.acquire()
            try:
                return bool(conn.is_in_transaction())
            finally:
                await pool.release(conn)

        try:
            in_transaction = await aio(scenario)
        finally:
            await aio(raw.close)
    assert sent == ["SELECT 1", "BEGIN", "ROLLBACK"]
    assert not in_transaction
