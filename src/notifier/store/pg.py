"""The only asyncpg code: a trio-flavoured ``Store`` over an asyncpg pool on the bridge loop.

Every public method is Trio-flavoured and crosses the bridge exactly once; the asyncio-flavoured
bodies (``_*_aio``) do all their round trips on the asyncio side. asyncpg errors are mapped to
``StoreUnavailable`` (Postgres unreachable: callers answer 503 or retry) or ``StoreError``.

Nothing waits on Postgres for ever: taking a pooled connection is bounded by the acquire
timeout, and every statement by the statement timeout — on the server (Postgres cancels it, and
the connection stays usable) and, a moment later, on the client (for when the server cannot
answer at all, e.g. a stalled network path: the connection is closed). Either way the caller gets
``StoreUnavailable`` within a few seconds.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import asyncpg
import msgspec
import trio
from asyncpg.pool import PoolAcquireContext

from notifier.bridge import aio, open_bridge
from notifier.errors import StoreError, StoreUnavailable, UnstorableText
from notifier.store.rows import (
    TERMINAL_STATUSES,
    Attempt,
    AttemptRecord,
    Channel,
    ChannelChanges,
    Delivery,
    DeliveryState,
    DeliverySummary,
    Event,
    IngestResult,
    MetricsSnapshot,
    NewEvent,
    OutboxRow,
    ReplayPage,
)

log = logging.getLogger("notifier.store")

SCHEMA_PATH = Path(__file__).with_name("schema.sql")
QUERIES_DIR = Path(__file__).parent  # queries.sql, and queries_<area>.sql for each area
DOORBELL_CHANNEL = "notifier_outbox"
_MIGRATE_LOCK = 0x6E6F7469  # advisory lock key for migrate ("noti")
# Schema changes may rewrite big tables or wait for another migrate: not bounded like requests.
_MIGRATE_TIMEOUT_SECONDS = 3600.0
# The maintenance statements (reconcile, retention, outbox hygiene) wait on nobody's request, and
# on a big database one batch may well take longer than a request may: their own, longer bound.
MAINTENANCE_STATEMENT_TIMEOUT_SECONDS = 60.0
# The client's own bound on a statement comes this long after the server's, so that a server
# that can answer cancels the statement itself (and the connection is kept).
_CLIENT_GRACE_SECONDS = 0.5


def load_queries(directory: Path = QUERIES_DIR) -> dict[str, str]:
    """The named queries of every ``queries*.sql`` file in ``directory`` (``-- name: X``
    starts query X); a name defined twice is an error."""
    queries: dict[str, str] = {}

    def add(name: str | None, lines: list[str], path: Path) -> None:
        if name is None:
            return
        if name in queries:
            raise ValueError(f"{path.name}: query {name!r} is defined twice")
        queries[name] = "\n".join(lines).strip()

    for path in sorted(directory.glob("queries*.sql")):
        name: str | None = None
        lines: list[str] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("-- name:"):
                add(name, lines, path)
                name, lines = line.removeprefix("-- name:").strip(), []
            elif name is not None:
                lines.append(line)
        add(name, lines, path)
    return queries


Q = load_queries()

_UNAVAILABLE = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.InterfaceError,
    # asyncpg's own state machine confused by a connection that died mid-operation (seen when
    # a backend is terminated while the pool resets the connection): the connection is gone.
    asyncpg.InternalClientError,
    asyncpg.TooManyConnectionsError,
    # statement_timeout: Postgres did not finish the statement in time (nothing was kept).
    asyncpg.QueryCanceledError,
)

Row = Any  # an asyncpg Record; it never leaves this module
Conn = Any  # an asyncpg connection or pool proxy, used on the asyncio side only
S = TypeVar("S")
P = ParamSpec("P")
T = TypeVar("T")


class StoreConflict(StoreUnavailable):
    """Postgres rolled a transaction back to resolve a conflict with a concurrent one (a
    serialization failure, 40001, or a deadlock, 40P01). Nothing of it was written and running
    it again may well succeed: the store retries its transactions on it (``retry_conflicts``);
    one that still conflicts is, for the caller, Postgres unavailable for now."""


# Tries of a transaction that Postgres keeps rolling back for conflicts, and the first wait
# between them (doubled each time, with jitter so the rivals do not meet again in step).
CONFLICT_TRIES = 4
CONFLICT_BACKOFF_SECONDS = 0.02


async def retry_conflicts(
    run: Callable[[], Awaitable[T]],
    *,
    tries: int = CONFLICT_TRIES,
    backoff_seconds: float = CONFLICT_BACKOFF_SECONDS,
) -> T:
    """Trio-flavoured. ``run()`` — one whole transaction — again after a short jittered wait
    while it raises ``StoreConflict``, at most ``tries`` times in all; the last conflict is
    raised as ``StoreUnavailable`` (the API answers 503 with ``Retry-After``)."""
    for attempt in range(1, tries + 1):
        try:
            return await run()
        except StoreConflict as exc:
            if attempt == tries:
                raise StoreUnavailable(
                    f"Postgres kept rolling the transaction back ({tries} tries): {exc}"
                ) from exc
            log.info("store: transaction rolled back (%s); trying again", exc)
            await trio.sleep(backoff_seconds * 2 ** (attempt - 1) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def _crossing(
    fn: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """Make an asyncio-flavoured method Trio-flavoured: one bridge crossing, errors mapped."""

    @functools.wraps(fn)
    async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await aio(fn, self, *args, **kwargs)
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"Postgres unavailable: {exc!r}") from exc
        except (asyncpg.SerializationError, asyncpg.DeadlockDetectedError) as exc:
            raise StoreConflict(f"Postgres error: {exc}") from exc
        except (asyncpg.UntranslatableCharacterError, asyncpg.CharacterNotInRepertoireError) as exc:
            raise UnstorableText(f"Postgres cannot store this text: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"Postgres error: {exc}") from exc

    return cast(Callable[Concatenate[S, P], Coroutine[Any, Any, T]], wrapper)


def _transaction(
    fn: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """``_crossing`` for a method whose body is one whole transaction (or one statement) that
    can be run again from the start: a conflict with a concurrent transaction is retried
    (``retry_conflicts``). Not for steps of a transaction that spans crossings (the outbox
    claim): after a rollback there is nothing to run them in."""
    crossing = _crossing(fn)

    @functools.wraps(fn)
    async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        return await retry_conflicts(lambda: crossing(self, *args, **kwargs))

    return cast(Callable[Concatenate[S, P], Coroutine[Any, Any, T]], wrapper)


class _Connection(asyncpg.Connection):
    """Asyncio-flavoured. An asyncpg connection that closes itself when a statement times out.

    On a timeout asyncpg asks the server to cancel the statement (over a second connection) and
    keeps this one until the server has acknowledged it, so the next use of the connection — the
    ROLLBACK of its transaction, the pool's reset on release — waits for that first. When the
    path to Postgres is what stalls, neither ever comes, and each of those waits would take
    another full timeout. A connection whose statement timed out is in an unknown state anyway:
    close it at once; the pool opens a fresh one when it needs one.
    """

    async def _closing_on_timeout(self, statement: Awaitable[T]) -> T:
        try:
            return await statement
        except TimeoutError:
            self.terminate()
            raise

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        return await self._closing_on_timeout(super().execute(*args, **kwargs))

    async def executemany(self, *args: Any, **kwargs: Any) -> Any:
        return await self._closing_on_timeout(super().executemany(*args, **kwargs))

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        return await self._closing_on_timeout(super().fetch(*args, **kwargs))

    async def fetchrow(self, *args: Any, **kwargs: Any) -> Any:
        return await self._closing_on_timeout(super().fetchrow(*args, **kwargs))

    async def fetchval(self, *args: Any, **kwargs: Any) -> Any:
        return await self._closing_on_timeout(super().fetchval(*args, **kwargs))

    async def fetchmany(self, *args: Any, **kwargs: Any) -> Any:
        return await self._closing_on_timeout(super().fetchmany(*args, **kwargs))


class _LongStatements:
    """Asyncio-flavoured. A connection whose ``fetch`` and ``fetchval`` wait ``timeout_seconds``
    on the client, not the pool's statement timeout."""

    def __init__(self, conn: Conn, timeout_seconds: float) -> None:
        self._conn = conn
        self._timeout = timeout_seconds

    async def fetch(self, query: str, *args: object) -> list[Row]:
        return cast(list[Row], await self._conn.fetch(query, *args, timeout=self._timeout))

    async def fetchval(self, query: str, *args: object) -> Any:
        return await self._conn.fetchval(query, *args, timeout=self._timeout)


class _Pool:
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

    async def execute(self, query: str, *args: object) -> str:
        async with self.acquire() as conn:
            return await conn.execute(query, *args)


async def _init_connection(conn: asyncpg.Connection) -> None:
    # JSON goes in and out as text; msgspec does the work. `msgspec.Raw` passes pre-encoded JSON.
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda value: msgspec.json.encode(value).decode(),
        decoder=msgspec.json.decode,
        schema="pg_catalog",
        format="text",
    )


def _channel(row: Row) -> Channel:
    return Channel(
        id=row["id"],
        tenant_id=row["tenant_id"],
        type=row["type"],
        name=row["name"],
        config=row["config"],
        recipient=row["recipient"],
        event_types=list(row["event_types"]),
        enabled=row["enabled"],
        disabled_reason=row["disabled_reason"],
        disabled_at=row["disabled_at"],
        consecutive_failures=row["consecutive_failures"],
        failing_since=row["failing_since"],
        last_success_at=row["last_success_at"],
        max_attempts=row["max_attempts"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _summaries(items: list[dict[str, Any]]) -> list[DeliverySummary]:
    return [
        DeliverySummary(
            id=uuid.UUID(d["id"]),
            channel_id=uuid.UUID(d["channel_id"]),
            channel_type=d["channel_type"],
            status=d["status"],
        )
        for d in items
    ]


def _event(row: Row, idempotency_key: str | None) -> Event:
    return Event(
        id=row["id"],
        type=row["type"],
        recipient=row["recipient"],
        payload=row["payload"],
        idempotency_key=idempotency_key,
        created_at=row["created_at"],
        deliveries=_summaries(row["deliveries"]),
    )


def _delivery(row: Row, attempts: list[Attempt] | None = None) -> Delivery:
    return Delivery(
        id=row["id"],
        event_id=row["event_id"],
        channel_id=row["channel_id"],
        channel_type=row["channel_type"],
        status=row["status"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        last_error=row["last_error"],
        next_attempt_at=row["next_attempt_at"],
        delivered_at=row["delivered_at"],
        created_at=row["created_at"],
        attempts=attempts,
    )


class IdempotencyConflict(StoreError):
    """An idempotency key was reused with a different request body."""

    def __init__(self, key: str) -> None:
        super().__init__(f"idempotency key {key!r} was already used with a different request")
        self.key = key


class UnknownChannels(StoreError):
    """``channel_ids`` named channels that do not exist for this tenant."""

    def __init__(self, ids: Sequence[uuid.UUID]) -> None:
        super().__init__("unknown channel ids: " + ", ".join(str(i) for i in ids))
        self.ids = list(ids)


class ConfigChanged(StoreError):
    """A channel's config changed between the read a new config was made from and its write."""


class NotFound(StoreError):
    """The row does not exist (or belongs to another tenant)."""


class NotReplayable(StoreError):
    """A replay was asked for a delivery that cannot be replayed now; the message says why."""


REPLAY_NOTE = "replayed: enqueued again with a fresh attempt budget"


def _all_or_conflict(outcomes: list[IngestResult | IdempotencyConflict]) -> list[IngestResult]:
    """The results of a batch that is stored whole, or the first conflict in it, raised."""
    for outcome in outcomes:
        if isinstance(outcome, IdempotencyConflict):
            raise outcome
    return cast(list[IngestResult], outcomes)


class Store:
    """Trio-flavoured access to Postgres. Create with ``open_store``."""

    def __init__(self, pool: _Pool, dsn: str) -> None:
        self._pool = pool
        self._dsn = dsn

    # -- schema and tenants -------------------------------------------------------------------

    @_transaction
    async def migrate(self) -> None:
        sql = SCHEMA_PATH.read_text(encoding="utf-8")
        wait = _MIGRATE_TIMEOUT_SECONDS
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL statement_timeout = 0")
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATE_LOCK, timeout=wait)
            await conn.execute(sql, timeout=wait)

    @_crossing
    async def ping(self, timeout_seconds: float) -> None:
        """Whether Postgres answers ``SELECT 1`` within ``timeout_seconds`` (taking a connection
        included); ``StoreUnavailable`` when it does not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        async with self._pool.acquire(timeout_seconds) as conn:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError("no connection in time")
            await conn.fetchval("SELECT 1", timeout=left)

    @_transaction
    async def create_tenant(self, name: str, api_key_hash: str) -> uuid.UUID:
        row = await self._pool.fetchrow(Q["tenant_create"], uuid.uuid4(), name, api_key_hash)
        assert row is not None
        tenant_id: uuid.UUID = row["id"]
        return tenant_id

    @_crossing
    async def tenant_by_key_hash(self, api_key_hash: str) -> uuid.UUID | None:
        tenant_id: uuid.UUID | None = await self._pool.fetchval(
            Q["tenant_by_key_hash"], api_key_hash
        )
        return tenant_id

    # -- channels -----------------------------------------------------------------------------

    @_transaction
    async def create_channel(
        self,
        tenant_id: uuid.UUID,
        *,
        type: str,
        name: str,
        config: dict[str, Any],
        recipient: str | None,
        event_types: list[str],
        enabled: bool,
        max_attempts: int | None,
    ) -> Channel:
        row = await self._pool.fetchrow(
            Q["channel_insert"], uuid.uuid4(), tenant_id, type, name, config, recipient,
            event_types, enabled, max_attempts,
        )  # fmt: skip
        assert row is not None
        return _channel(row)

    @_crossing
    async def get_channel(self, tenant_id: uuid.UUID, channel_id: uuid.UUID) -> Channel | None:
        row = await self._pool.fetchrow(Q["channel_get"], tenant_id, channel_id)
        return _channel(row) if row else None

    @_crossing
    async def list_channels(
        self,
        tenant_id: uuid.UUID,
        *,
        type: str | None,
        recipient: str | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[Channel]:
        at, last_id = after if after else (None, None)
        rows = await self._pool.fetch(
            Q["channel_list"], tenant_id, type, recipient, at, last_id, limit
        )
        return [_channel(r) for r in rows]

    @_transaction
    async def update_channel(
        self,
        tenant_id: uuid.UUID,
        channel_id: uuid.UUID,
        changes: ChannelChanges,
        *,
        config_read: dict[str, Any] | None = None,
    ) -> Channel | None:
        """Change the fields ``changes`` names and only those; None if there is no such
        channel. A new config must come with ``config_read``, the stored config it was made
        from: it is written only over that one, else ``ConfigChanged`` is raised (read the
        channel again and make the new config anew)."""
        named = changes.named()
        if "config" in named and config_read is None:
            raise ValueError("a new config needs the config it was made from")

        def value(field: str) -> Any:
            got = getattr(changes, field)
            return None if got is msgspec.UNSET else got

        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                Q["channel_update"], tenant_id, channel_id, named, value("name"),
                value("config"), value("recipient"), value("event_types"), value("enabled"),
                value("max_attempts"), config_read if "config" in named else None,
            )  # fmt: skip
            if row is not None:
                return _channel(row)
            if "config" in named and await conn.fetchrow(Q["channel_get"], tenant_id, channel_id):
                raise ConfigChanged("the channel's config changed while the new one was made")
            return None

    @_transaction
    async def delete_channel(self, tenant_id: uuid.UUID, channel_id: uuid.UUID) -> bool:
        return await self._pool.fetchval(Q["channel_delete"], tenant_id, channel_id) is not None

    # -- events -------------------------------------------------------------------------------

    @_transaction
    async def ingest(
        self,
        tenant_id: uuid.UUID,
        events: Sequence[NewEvent],
        max_attempts: Mapping[str, int],
    ) -> list[IngestResult]:
        """Store events, their deliveries and outbox rows atomically, in the order given.

        Raises ``IdempotencyConflict`` or ``UnknownChannels`` having written nothing.
        """
        named = {cid for e in events for cid in (e.channel_ids or ())}
        async with self._pool.acquire() as conn:
            if named:
                owned = {r["id"] for r in await conn.fetch(Q["channels_owned"], tenant_id, named)}
                if missing := sorted(named - owned):
                    raise UnknownChannels(missing)
            if len(events) == 1:
                # One statement, no explicit transaction: a single round trip. A key conflict
                # writes nothing, so there is nothing to roll back.
                outcomes = await self._ingest_group(conn, tenant_id, events, max_attempts)
                return _all_or_conflict(outcomes)
            async with conn.transaction():  # a conflict anywhere rolls back the whole batch
                outcomes = await self._ingest_group(conn, tenant_id, events, max_attempts)
                return _all_or_conflict(outcomes)

    @_crossing
    async def get_event(self, tenant_id: uuid.UUID, event_id: uuid.UUID) -> Event | None:
        row = await self._pool.fetchrow(Q["event_get"], tenant_id, event_id)
        return _event(row, row["idempotency_key"]) if row else None

    # -- deliveries ---------------------------------------------------------------------------

    @_crossing
    async def list_deliveries(
        self,
        tenant_id: uuid.UUID,
        *,
        status: str | None,
        channel_id: uuid.UUID | None,
        event_id: uuid.UUID | None,
        before: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[Delivery]:
        at, last_id = before if before else (None, None)
        rows = await self._pool.fetch(
            Q["delivery_list"], tenant_id, status, channel_id, event_id, at, last_id, limit
        )
        return [_delivery(r) for r in rows]

    @_crossing
    async def get_delivery(self, tenant_id: uuid.UUID, delivery_id: uuid.UUID) -> Delivery | None:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(Q["delivery_get"], tenant_id, delivery_id)
            if row is None:
                return None
            attempts = [
                Attempt(**dict(a)) for a in await conn.fetch(Q["delivery_attempts"], delivery_id)
            ]
            return _delivery(row, attempts)

    async def delivery_state(self, delivery_id: uuid.UUID) -> DeliveryState | None:
        (state,) = await self.delivery_states([delivery_id])
        return state

    async def record_attempt(self, rec: AttemptRecord) -> bool:
        """Settle one attempt; False when the delivery had already moved past it."""
        (moved,) = await self.record_attempts([rec])
        return moved

    @_crossing
    async def delivery_states(
        self, delivery_ids: Sequence[uuid.UUID]
    ) -> list[DeliveryState | None]:
        """``delivery_state`` for many ids in one round trip, in the order given."""
        rows = await self._pool.fetch(Q["delivery_states"], list(delivery_ids))
        found = {
            r["id"]: DeliveryState(
                r["status"], r["attempt"], r["channel_state"], r["disabled_reason"]
            )
            for r in rows
        }
        return [found.get(i) for i in delivery_ids]

    @_transaction
    async def record_attempts(
        self, recs: Sequence[AttemptRecord], *, disable_after_failing_seconds: float = 0.0
    ) -> list[bool]:
        """``record_attempt`` for many attempts in one statement, in the order given; keeps
        the channels' health and disables a channel failing without a success for longer than
        ``disable_after_failing_seconds`` (0: never)."""
        rows = await self._pool.fetch(
            Q["attempt_record_batch"],
            *(list(column) for column in zip(*(
                (r.delivery_id, r.attempt, r.status, r.outcome, r.started_at, r.duration_ms,
                 r.status_code, r.error, r.response_excerpt, r.next_attempt_at, r.disable_channel)
                for r in recs
            ), strict=True)),
            float(disable_after_failing_seconds),
        )  # fmt: skip
        moved = {r["delivery_id"]: r["moved"] for r in rows}
        return [bool(moved.get(r.delivery_id)) for r in recs]

    # -- outbox -------------------------------------------------------------------------------

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

    @_crossing
    async def _acquire(self) -> Conn:
        return await self._pool.acquire()

    @_crossing
    async def outbox_depth(self) -> int:
        depth: int = await self._pool.fetchval(Q["outbox_depth"])
        return depth

    # -- operations: replay, reconciler, retention ---------------------------------------------

    @_transaction
    async def replay_delivery(self, tenant_id: uuid.UUID, delivery_id: uuid.UUID) -> None:
        """Enqueue one finished delivery again (``DEAD`` or ``DELIVERED`` → ``PENDING``, fresh
        attempt budget). Raises ``NotFound`` or ``NotReplayable`` having written nothing."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(Q["replay_check"], tenant_id, delivery_id)
            if row is None:
                raise NotFound("delivery not found")
            if row["status"] not in TERMINAL_STATUSES:
                raise NotReplayable(
                    f"the delivery is {row['status']}: only a DELIVERED or DEAD delivery can be "
                    "replayed"
                )
            if row["channel_state"] != "enabled":
                raise NotReplayable(
                    f"the delivery's channel is {row['channel_state']}"
                    + ("; enable it first" if row["channel_state"] == "disabled" else "")
                )
            await conn.fetch(
                Q["replay"], tenant_id, row["status"], delivery_id, None, None, None, None, 1,
                REPLAY_NOTE, None, None,
            )  # fmt: skip

    @_transaction
    async def replay_deliveries(
        self,
        tenant_id: uuid.UUID,
        *,
        status: str,
        channel_id: uuid.UUID | None,
        event_type: str | None,
        created_after: datetime | None,
        created_before: datetime | None,
        after: tuple[datetime, uuid.UUID] | None = None,
        limit: int,
    ) -> ReplayPage:
        """Enqueue up to ``limit`` matching finished deliveries again (oldest first, only of
        enabled channels), walking them in ``(created_at, id)`` order from just after
        ``after``; return how many, and where the next call starts if more match there.

        The walk, not the status, says what is left: a replayed ``DELIVERED`` delivery is
        ``DELIVERED`` again soon, and a call from the start would replay it again."""
        filters = (channel_id, event_type, created_after, created_before)
        at, last_id = after if after else (None, None)
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                Q["replay"], tenant_id, status, None, *filters, limit, REPLAY_NOTE, at, last_id
            )
            if rows:
                at, last_id = max((r["created_at"], r["id"]) for r in rows)
            more: bool = await conn.fetchval(
                Q["replay_more"], tenant_id, status, *filters, at, last_id
            )
        position = (at, last_id) if more and at is not None and last_id is not None else None
        return ReplayPage(queued=len(rows), more=more, next=position)

    @_transaction
    async def reconcile(self, *, stuck_after_seconds: float, limit: int) -> list[uuid.UUID]:
        """Enqueue stuck unfinished deliveries again (see ``reconcile`` in queries_ops.sql);
        return their ids."""
        async with self._maintenance() as conn:
            rows = await conn.fetch(Q["reconcile"], float(stuck_after_seconds), limit)
        return [r["id"] for r in rows]

    @_transaction
    async def delete_expired(self, *, retention_days: int, limit: int) -> int:
        """Delete up to ``limit`` finished events older than ``retention_days``; return how
        many."""
        async with self._maintenance() as conn:
            return len(await conn.fetch(Q["retention"], retention_days, limit))

    @_transaction
    async def clean_outbox(self, *, limit: int, refused_after: int) -> tuple[int, int]:
        """Delete outbox rows of finished or deleted deliveries; return how many, and how many
        rows the broker has refused at least ``refused_after`` times."""
        async with self._maintenance() as conn:
            deleted = len(await conn.fetch(Q["outbox_hygiene"], limit))
            refused: int = await conn.fetchval(Q["outbox_refused_count"], refused_after)
        return deleted, refused

    @asynccontextmanager
    async def _maintenance(self) -> AsyncIterator[Conn]:
        """Asyncio-flavoured. A connection in a transaction of its own whose statements may run
        ``MAINTENANCE_STATEMENT_TIMEOUT_SECONDS`` (on the server and on the client)."""
        seconds = MAINTENANCE_STATEMENT_TIMEOUT_SECONDS
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(f"SET LOCAL statement_timeout = {math.ceil(seconds * 1000)}")
            yield _LongStatements(conn, seconds + _CLIENT_GRACE_SECONDS)

    @asynccontextmanager
    async def open_doorbell(self) -> AsyncIterator[Doorbell]:
        """Trio-flavoured. LISTEN on the outbox channel on a connection of its own; the bell
        says when that connection is lost (the relay then listens again with a new one)."""
        bell = Doorbell()
        token = trio.lowlevel.current_trio_token()

        def on_notify(*_: object) -> None:  # asyncio-flavoured callback
            token.run_sync_soon(bell.ring)

        try:
            conn: asyncpg.Connection = await aio(asyncpg.connect, self._dsn, timeout=10)
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"Postgres unavailable: {exc!r}") from exc
        try:
            try:
                await aio(conn.add_listener, DOORBELL_CHANNEL, on_notify)
            except (*_UNAVAILABLE, asyncpg.PostgresError) as exc:
                raise StoreUnavailable(f"LISTEN failed: {exc!r}") from exc
            conn.add_termination_listener(lambda *_: token.run_sync_soon(bell.lost))
            if conn.is_closed():  # lost before the listener was in place: it will not say so
                bell.lost()
            yield bell
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await aio(conn.close, timeout=5)
                except Exception:
                    conn.terminate()

    # -- metrics ------------------------------------------------------------------------------

    @_crossing
    async def metrics_snapshot(self) -> MetricsSnapshot:
        """The scrape-time gauges (outbox depth, open deliveries) in one statement."""
        row = await self._pool.fetchrow(Q["metrics_snapshot"])
        assert row is not None
        return MetricsSnapshot(
            outbox_depth=row["outbox_depth"], pending=row["pending"], retrying=row["retrying"],
            oldest_open_age_seconds=row["oldest_open_age_seconds"],
        )  # fmt: skip

    # -- AMQP ingest --------------------------------------------------------------------------

    @_crossing
    async def tenant_ids_by_names(self, names: Sequence[str]) -> dict[str, uuid.UUID]:
        """Name → id of those of the tenants ``names`` that exist."""
        rows = await self._pool.fetch(Q["amqp_tenants_by_names"], list(names))
        return {r["name"]: r["id"] for r in rows}

    @_transaction
    async def ingest_each(
        self,
        events: Sequence[tuple[uuid.UUID, NewEvent]],
        max_attempts: Mapping[str, int],
    ) -> list[IngestResult | IdempotencyConflict | UnknownChannels]:
        """Store ``(tenant id, event)`` pairs, of any tenants, in one transaction, each event on
        its own: one outcome per event, in order — its ``IngestResult`` (``created`` False for a
        replay: same key, same body), or the error that kept it out (its idempotency key used
        with another body, its ``channel_ids`` naming channels its tenant does not have) while
        the others are stored.

        Raises, having written nothing, only what fails the transaction as a whole
        (``StoreUnavailable``, ``UnstorableText`` ...).
        """
        outcomes: dict[int, IngestResult | IdempotencyConflict | UnknownChannels] = {}
        named = {cid for _, e in events for cid in (e.channel_ids or ())}
        async with self._pool.acquire() as conn, conn.transaction():
            owned: set[tuple[uuid.UUID, uuid.UUID]] = set()
            if named:
                rows = await conn.fetch(Q["amqp_channels_owned"], list(named))
                owned = {(r["tenant_id"], r["id"]) for r in rows}
            groups: dict[uuid.UUID, list[int]] = {}
            for i, (tenant_id, e) in enumerate(events):
                missing = {c for c in e.channel_ids or () if (tenant_id, c) not in owned}
                if missing:
                    outcomes[i] = UnknownChannels(sorted(missing))
                else:
                    groups.setdefault(tenant_id, []).append(i)
            # Tenants in id order, like the keys within each (see insert_events): two batches
            # holding the same tenants' keys in other orders cannot deadlock.
            for tenant_id, indexes in sorted(groups.items()):
                group = [events[i][1] for i in indexes]
                found = await self._ingest_group(conn, tenant_id, group, max_attempts)
                outcomes.update(zip(indexes, found, strict=True))
        return [outcomes[i] for i in range(len(events))]

    @staticmethod
    async def _ingest_group(
        conn: Conn,
        tenant_id: uuid.UUID,
        events: Sequence[NewEvent],
        max_attempts: Mapping[str, int],
    ) -> list[IngestResult | IdempotencyConflict]:
        """Asyncio-flavoured. The events of one tenant, each on its own: one outcome per event
        (its ``IngestResult``, or the ``IdempotencyConflict`` that kept it out), in two
        statements at most. ``ingest`` raises the first conflict; ``ingest_each`` keeps the
        others."""
        payload = [
            {"id": e.id, "type": e.type, "recipient": e.recipient, "payload": e.payload,
             "idempotency_key": e.idempotency_key, "request_hash": e.request_hash,
             "channel_ids": e.channel_ids, "ord": i}
            for i, e in enumerate(events)
        ]  # fmt: skip
        rows = await conn.fetch(Q["insert_events"], tenant_id, payload, max_attempts)
        created = {r["id"]: r for r in rows}
        earlier: dict[str, Row] = {}
        if skipped := [e.idempotency_key for e in events if e.id not in created]:
            for r in await conn.fetch(Q["events_by_keys"], tenant_id, skipped):
                earlier[r["idempotency_key"]] = r
        outcomes: list[IngestResult | IdempotencyConflict] = []
        for e in events:
            key = e.idempotency_key
            if e.id in created:
                outcomes.append(IngestResult(event=_event(created[e.id], key), created=True))
                continue
            assert key is not None  # only a key makes an insert skip an event
            prior = earlier.get(key)
            if prior is None or prior["request_hash"] != e.request_hash:
                outcomes.append(IdempotencyConflict(key))
            else:
                outcomes.append(IngestResult(event=_event(prior, key), created=False))
        return outcomes


class Doorbell:
    """Rings when something was inserted into the outbox. A hint only: the relay also polls."""

    def __init__(self) -> None:
        self._rung = trio.Event()
        self.connected = True

    def ring(self) -> None:
        self._rung.set()

    def lost(self) -> None:
        self.connected = False
        self._rung.set()

    def clear(self) -> None:
        if self._rung.is_set():
            self._rung = trio.Event()

    async def wait(self) -> None:
        await self._rung.wait()


class OutboxClaim:
    """Rows claimed by one relay pass. Trio-flavoured methods; one crossing each."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._tx: Any = None
        self.rows: list[OutboxRow] = []

    @_crossing
    async def _begin(self, limit: int) -> None:
        self._tx = self._conn.transaction()
        await self._tx.start()
        records = await self._conn.fetch(Q["outbox_claim"], limit)
        self.rows = [
            OutboxRow(r["id"], r["delivery_id"], r["routing_key"], r["body"], r["created_at"])
            for r in records
        ]

    @_crossing
    async def finish(self, sent: Sequence[int], refused: Mapping[int, str]) -> None:
        """Delete the rows the broker confirmed; push back the ones it refused."""
        if sent:
            await self._conn.execute(Q["outbox_delete"], list(sent))
        if refused:
            await self._conn.execute(Q["outbox_refused"], list(refused), list(refused.values()))

    @_crossing
    async def _commit(self) -> None:
        await self._tx.commit()
        self._tx = None

    async def _close(self, pool: _Pool) -> None:
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


@asynccontextmanager
async def open_store(
    dsn: str,
    *,
    max_size: int = 20,
    connect_timeout_seconds: float = 5.0,
    acquire_timeout_seconds: float = 1.0,
    statement_timeout_seconds: float = 3.0,
) -> AsyncIterator[Store]:
    """Trio-flavoured. Open the bridge (if needed) and a pool; close it on exit.

    A store call waits at most ``acquire_timeout_seconds`` for a connection, and each statement
    runs at most ``statement_timeout_seconds`` (see the module docstring)."""
    statement_ms = max(1, math.ceil(statement_timeout_seconds * 1000))
    async with open_bridge():
        try:
            pool = await aio(
                asyncpg.create_pool, dsn, min_size=1, max_size=max_size,
                timeout=connect_timeout_seconds, init=_init_connection,
                connection_class=_Connection,
                server_settings={"statement_timeout": str(statement_ms)},
                command_timeout=statement_timeout_seconds + _CLIENT_GRACE_SECONDS,
            )  # fmt: skip
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"cannot connect to Postgres: {exc!r}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"cannot connect to Postgres: {exc}") from exc
        try:
            yield Store(_Pool(pool, acquire_timeout_seconds), dsn)
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(10) as closing:
                    await aio(pool.close)
                if closing.cancelled_caught:
                    pool.terminate()
