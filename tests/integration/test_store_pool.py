"""The pooled connections of the store against the real Postgres: giving a connection back costs
no statement, and still never hands on an open transaction."""

from __future__ import annotations

import socket

import asyncpg
import pytest
import trio

from notifier.bridge import aio, open_bridge
from notifier.store.admin import AdminQueries
from notifier.store.listen import listening
from notifier.store.pool import Pooler, create_pool

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


async def test_transaction_control_outside_a_transaction_is_sent_as_is_behind_a_pooler(
    database_url: str,
) -> None:
    """With ``pooler="pgbouncer"`` a bare statement runs in a transaction of its own, with the
    statement timeout as SET LOCAL; a bare COMMIT or ROLLBACK is sent as it is (wrapped, it
    would end the wrapper's transaction and the wrapper's COMMIT would be wrapped again), and so
    is the pool's ROLLBACK on release when asyncpg still holds a transaction the server ended."""
    async with open_bridge():
        raw, pool = await create_pool(
            database_url, max_size=1, connect_timeout_seconds=5, acquire_timeout_seconds=2,
            statement_timeout_seconds=3, pooler="pgbouncer",
        )  # fmt: skip
        sent: list[str] = []

        async def scenario() -> tuple[str, str, bool]:
            conn = await pool.acquire()
            conn.add_query_logger(lambda record: sent.append(record.query))
            try:
                await conn.execute("ROLLBACK")
                await conn.execute("  commit")
                bare = await conn.fetchval("SHOW statement_timeout")
                async with conn.transaction():
                    inside = await conn.fetchval("SHOW statement_timeout")
                tx = conn.transaction()
                await tx.start()
                await conn.execute("ROLLBACK")  # ends it on the server; asyncpg still holds it
            finally:
                await pool.release(conn)
            conn = await pool.acquire()
            try:
                return bare, inside, bool(conn.is_in_transaction())
            finally:
                await pool.release(conn)

        try:
            bare, inside, in_transaction = await aio(scenario)
        finally:
            await aio(raw.close)
    assert (bare, inside, in_transaction) == ("3s", "3s", False)
    begin = "BEGIN; SET LOCAL statement_timeout = 3000;"
    assert sent == [
        "ROLLBACK", "  commit",
        begin, "SHOW statement_timeout", "COMMIT",
        begin, "SHOW statement_timeout", "COMMIT;",
        begin, "ROLLBACK", "ROLLBACK",
    ]  # fmt: skip


async def test_the_ping_sends_its_select_alone_behind_a_pooler(database_url: str) -> None:
    # A BEGIN and COMMIT around it would each be a round trip its timeout does not bound.
    async with open_bridge():
        raw, pool = await create_pool(
            database_url, max_size=1, connect_timeout_seconds=5, acquire_timeout_seconds=2,
            statement_timeout_seconds=3, pooler="pgbouncer",
        )  # fmt: skip
        sent: list[str] = []

        async def listen() -> None:
            async with pool.acquire() as conn:  # the only one (max_size=1)
                conn.add_query_logger(lambda record: sent.append(record.query))

        try:
            await aio(listen)
            await AdminQueries(pool, None).ping(2)
        finally:
            await aio(raw.close)
    assert sent == ["SELECT 1"]


@pytest.mark.parametrize("pooler", ["none", "pgbouncer"])
async def test_a_connection_whose_server_refuses_a_write_is_closed_and_the_next_is_fresh(
    database_url: str, pooler: Pooler
) -> None:
    # A server that refuses writes is no longer the primary (a failover): its connection is
    # closed at once, so that the pool opens the next one where writes are taken.
    async with open_bridge():
        raw, pool = await create_pool(
            database_url, max_size=1, connect_timeout_seconds=5, acquire_timeout_seconds=2,
            statement_timeout_seconds=3, pooler=pooler,
        )  # fmt: skip

        async def scenario() -> tuple[str, bool, str]:
            conn = await pool.acquire()
            first = await conn.fetchval("SELECT pg_backend_pid()")
            try:
                # as a primary fenced with default_transaction_read_only, for this session
                await conn.execute("SET SESSION default_transaction_read_only = on")
                try:
                    await conn.execute("CREATE TABLE refused (x int)")
                    refused = "nothing"
                except asyncpg.ReadOnlySQLTransactionError as exc:
                    refused = type(exc).__name__
            finally:
                await pool.release(conn)
            async with pool.acquire() as fresh:  # the pool's one connection, opened anew
                anew = await fresh.fetchval("SELECT pg_backend_pid()") != first
                return refused, anew, await fresh.fetchval("SHOW default_transaction_read_only")

        try:
            assert await aio(scenario) == ("ReadOnlySQLTransactionError", True, "off")
        finally:
            await aio(raw.close)


async def test_a_host_that_never_answers_does_not_keep_the_next_one_from_serving(
    database_url: str,
) -> None:
    # A first host that takes the TCP connection and then says nothing (a hung server; a dead
    # machine whose packets are dropped is as silent): asyncpg alone would spend the whole
    # connect timeout on it and never try the second, the Postgres that serves.
    silent = socket.socket()
    try:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # never accepted: the kernel completes the handshakes, nothing more
        silent_port = silent.getsockname()[1]
        hosts = f"127.0.0.1:{silent_port},{database_url.split('@', 1)[1].split('/', 1)[0]}"
        url = f"postgresql://postgres@{hosts}/{database_url.rsplit('/', 1)[1]}"
        url += "?target_session_attrs=read-write"
        async with open_bridge():
            with trio.fail_after(3):  # the pool's first connection, then a statement
                raw, pool = await create_pool(
                    url, max_size=2, connect_timeout_seconds=2, acquire_timeout_seconds=1,
                    statement_timeout_seconds=1,
                )  # fmt: skip
            try:
                with trio.fail_after(2):
                    assert await aio(pool.fetchval, "SELECT 1") == 1
            finally:
                await aio(raw.close)
            listened: list[str] = []
            with trio.fail_after(3):
                async with listening(
                    url, "hosts_test", on_notify=listened.append, on_lost=lambda: None
                ):
                    pass
    finally:
        silent.close()
