"""The asyncpg pool the store runs on, with every wait bounded, and the base of the store's
query classes.

Nothing waits on Postgres for ever: taking a pooled connection is bounded by the acquire
timeout, and every statement by the statement timeout — on the server (Postgres cancels it, and
the connection stays usable) and, a moment later, on the client (for when the server cannot
answer at all, e.g. a stalled network path: the connection is closed). Either way the caller gets
``StoreUnavailable`` within a few seconds.

Behind PgBouncer in transaction pooling mode (``pooler="pgbouncer"``) a client's consecutive
transactions may each run on another server connection, and PgBouncer refuses startup
parameters such as ``statement_timeout``. So there: no statement cache (asyncpg then parses each
statement afresh, unnamed, in the same round trip as its execution, never relying on a
statement prepared earlier), and the server-side timeout comes with every transaction as
``SET LOCAL statement_timeout`` — a statement outside one runs in a transaction of its own — so
it always holds and ends with the transaction: a server connection handed to other clients
keeps no setting of ours. ``SET`` (session level), session advisory locks and ``LISTEN`` are
never used on a pooled connection, whatever the pooler.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Coroutine
from typing import Any, Literal, TypeVar, cast

import asyncpg
import msgspec
from asyncpg.pool import PoolAcquireContext

from notifier.bridge import aio
from notifier.errors import StoreError, StoreUnavailable
from notifier.store import hosts
from notifier.store.base import UNAVAILABLE, Conn, Row

T = TypeVar("T")

# The client's own bound on a statement comes this long after the server's, so that a server
# that can answer cancels the statement itself (and the connection is kept).
CLIENT_GRACE_SECONDS = 0.5

Pooler = Literal["none", "pgbouncer"]

# How asyncpg's ``Transaction.start`` opens a top-level transaction: one simple query.
_BEGIN = re.compile(r"BEGIN( [A-Z ]+)?;", re.ASCII)
# Statements that open, end or mark a transaction: never run in a transaction of our own.
_TRANSACTION_CONTROL = re.compile(
    r"\s*(COMMIT|ROLLBACK|END|ABORT|SAVEPOINT|RELEASE|BEGIN|START\s+TRANSACTION)\b",
    re.IGNORECASE | re.ASCII,
)


class _Connection(asyncpg.Connection):
    """Asyncio-flavoured. An asyncpg connection that closes itself when a statement times out,
    or when its server refuses a write.

    On a timeout asyncpg asks the server to cancel the statement (over a second connection) and
    keeps this one until the server has acknowledged it, so the next use of the connection — the
    ROLLBACK of its transaction, the pool's reset on release — waits for that first. When the
    path to Postgres is what stalls, neither ever comes, and each of those waits would take
    another full timeout. A connection whose statement timed out is in an unknown state anyway:
    close it at once; the pool opens a fresh one when it needs one.

    A server that refuses a write (a primary fenced with ``default_transaction_read_only``, a
    PgBouncer whose target is a standby) is no longer the primary, and a connection to it would
    refuse every write for as long as it stays open: it is closed too, so that the next one is
    opened on the host that takes writes (``target_session_attrs=read-write`` in the URL).

    ``_per_transaction`` (set on a subclass made by ``create_pool``) is SQL sent with every
    transaction's ``BEGIN``, in the same round trip, and a statement outside a transaction gets
    a transaction of its own: behind a transaction pooler, that is the only session the
    server connection is ours for.
    """

    _per_transaction = ""

    def get_reset_query(self) -> str:
        # What the pool sends when a connection is given back, one more round trip per store
        # call: asyncpg's default undoes session state (SET, LISTEN, advisory locks, cursors).
        # The store leaves none on a pooled connection — SET LOCAL and transaction-level
        # advisory locks only; LISTEN runs on a connection of its own — so there is nothing to
        # undo. An open transaction is still rolled back (asyncpg does that apart from this).
        return ""

    async def _closing_if_unusable(self, statement: Awaitable[T]) -> T:
        try:
            return await statement
        except (TimeoutError, asyncpg.ReadOnlySQLTransactionError):
            self.terminate()
            raise

    def _in_transaction(self) -> bool:
        # asyncpg's own transaction counts from before its BEGIN is sent until after its
        # COMMIT or ROLLBACK has been: a statement sent meanwhile must not open one of ours.
        return bool(self.is_in_transaction()) or getattr(self, "_top_xact", None) is not None

    async def _bounded(self, statement: Coroutine[Any, Any, T]) -> T:
        """``statement``, in a transaction of its own when ``_per_transaction`` asks for one
        and none is open.

        The transaction's own statements go straight to asyncpg, never through this class's
        ``execute`` (which would wrap them again)."""
        if not self._per_transaction or self._in_transaction():
            return await self._closing_if_unusable(statement)
        try:
            await self._closing_if_unusable(super().execute(f"BEGIN; {self._per_transaction}"))
        except BaseException:
            statement.close()
            await self._abandon()
            raise
        try:
            result = await self._closing_if_unusable(statement)
        except BaseException:
            await self._abandon()  # never instead of the statement's own error
            raise
        if self.is_in_transaction():  # not ended by the statement itself
            await self._closing_if_unusable(super().execute("COMMIT"))
        return result

    async def _abandon(self) -> None:
        """Roll back the transaction ``_bounded`` opened, if it is still open; a connection
        that cannot is closed (in an unknown state: the pool opens a fresh one)."""
        if self.is_closed() or not self.is_in_transaction():
            return
        try:
            await self._closing_if_unusable(super().execute("ROLLBACK"))
        except Exception:
            self.terminate()

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        # asyncpg's Transaction.start (its ``_top_xact`` already set, the server not yet in it)
        begin = not args and not self.is_in_transaction() and _BEGIN.fullmatch(query)
        if self._per_transaction and begin:
            query = f"{query} {self._per_transaction}"
            return await self._closing_if_unusable(super().execute(query, **kwargs))
        if _TRANSACTION_CONTROL.match(query):
            # Wrapped in a transaction of its own, a bare COMMIT or ROLLBACK would end that
            # one, and the wrapper's COMMIT would then be wrapped again, without end.
            return await self._closing_if_unusable(super().execute(query, *args, **kwargs))
        return await self._bounded(super().execute(query, *args, **kwargs))

    async def executemany(self, *args: Any, **kwargs: Any) -> Any:
        return await self._bounded(super().executemany(*args, **kwargs))

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        return await self._bounded(super().fetch(*args, **kwargs))

    async def fetchrow(self, *args: Any, **kwargs: Any) -> Any:
        return await self._bounded(super().fetchrow(*args, **kwargs))

    async def fetchval(self, *args: Any, bare: bool = False, **kwargs: Any) -> Any:
        """asyncpg's ``fetchval``; ``bare``: never in a transaction of its own (a statement
        that needs no server-side timeout, whose ``timeout`` must bound all it sends)."""
        statement = super().fetchval(*args, **kwargs)
        if bare:
            return await self._closing_if_unusable(statement)
        return await self._bounded(statement)

    async def fetchmany(self, *args: Any, **kwargs: Any) -> Any:
        return await self._bounded(super().fetchmany(*args, **kwargs))


class LongStatements:
    """Asyncio-flavoured. A connection whose ``fetch`` and ``fetchval`` wait ``timeout_seconds``
    on the client, not the pool's statement timeout."""

    def __init__(self, conn: Conn, timeout_seconds: float) -> None:
        self._conn = conn
        self._timeout = timeout_seconds

    async def fetch(self, query: str, *args: object) -> list[Row]:
        return cast(list[Row], await self._conn.fetch(query, *args, timeout=self._timeout))

    async def fetchval(self, query: str, *args: object) -> Any:
        return await self._conn.fetchval(query, *args, timeout=self._timeout)


class Pool:
    """Asyncio-flavoured. The asyncpg pool, with every wait for a connection bounded.

    asyncpg's pool waits for a free connection for ever unless told otherwise, and so would every
    request queued behind connections stuck on a stalled Postgres. The same bound also limits
    the pool's reset of a connection given back (asyncpg uses the acquire timeout for both).
    """

    def __init__(self, pool: asyncpg.Pool, acquire_timeout_seconds: float) -> None:
        self._pool = pool
        self._acquire_timeout = acquire_timeout_seconds

    def acquire(self, timeout_seconds: float | None = None) -> PoolAcquireContext:
        """A connection within ``timeout_seconds`` (by default the pool's acquire timeout), as
        ``async with pool.acquire() as conn`` or ``conn = await pool.acquire()``."""
        return self._pool.acquire(timeout=timeout_seconds or self._acquire_timeout)

    async def release(self, conn: Conn) -> None:
        await self._pool.release(conn)

    async def fetch(self, query: str, *args: object) -> list[Row]:
        async with self.acquire() as conn:
            return await conn.fetch(query, *args)

    async def fetchrow(self, query: str, *args: object) -> Row | None:
        async with self.acquire() as conn:
            return await conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: object) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchval(query, *args)


async def _init_connection(conn: asyncpg.Connection) -> None:
    # JSON goes in and out as text; msgspec does the work. `msgspec.Raw` passes pre-encoded JSON.
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda value: msgspec.json.encode(value).decode(),
        decoder=msgspec.json.decode,
        schema="pg_catalog",
        format="text",
    )


async def create_pool(
    dsn: str,
    *,
    max_size: int,
    connect_timeout_seconds: float,
    acquire_timeout_seconds: float,
    statement_timeout_seconds: float,
    pooler: Pooler = "none",
) -> tuple[asyncpg.Pool, Pool]:
    """Trio-flavoured (the bridge must be open). The asyncpg pool, to close, and the bounded
    ``Pool`` over it: each statement runs at most ``statement_timeout_seconds``.

    With ``pooler="none"`` the timeout is a startup parameter, set once per connection. With
    ``"pgbouncer"`` (transaction pooling) it is ``SET LOCAL`` in every transaction instead —
    PgBouncer refuses the startup parameter, and letting it ignore the parameter would silently
    drop the timeout — and the statement cache is off (see the module's docstring)."""
    statement_ms = max(1, math.ceil(statement_timeout_seconds * 1000))
    connection_class: type[_Connection] = _Connection
    server_settings: dict[str, str] = {"statement_timeout": str(statement_ms)}
    cache_size = 100  # asyncpg's default
    if pooler == "pgbouncer":
        per_transaction = f"SET LOCAL statement_timeout = {statement_ms};"
        connection_class = type(
            "_PooledConnection", (_Connection,), {"_per_transaction": per_transaction}
        )
        server_settings, cache_size = {}, 0
    try:
        pool = await aio(
            asyncpg.create_pool, dsn, min_size=1, max_size=max_size,
            timeout=connect_timeout_seconds, init=_init_connection, connect=hosts.connect,
            connection_class=connection_class, server_settings=server_settings,
            statement_cache_size=cache_size,
            command_timeout=statement_timeout_seconds + CLIENT_GRACE_SECONDS,
        )  # fmt: skip
    except UNAVAILABLE as exc:
        raise StoreUnavailable(f"cannot connect to Postgres: {exc!r}") from exc
    except asyncpg.PostgresError as exc:
        raise StoreError(f"cannot connect to Postgres: {exc}") from exc
    return pool, Pool(pool, acquire_timeout_seconds)


class Queries:
    """The base of the store's query classes, one for each role (composed into ``Store``):
    the bounded pool, and the DSN for a connection of its own, the outbox doorbell's LISTEN
    (``None``: no LISTEN, the relay polls)."""

    def __init__(self, pool: Pool, listen_dsn: str | None) -> None:
        self._pool = pool
        self._listen_dsn = listen_dsn
