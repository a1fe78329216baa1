"""What every query of the store goes through: the named SQL, the one bridge crossing, and the
mapping of asyncpg's errors to the store's.

Every public method of the store is Trio-flavoured and crosses the bridge exactly once
(``crossing``); its asyncio-flavoured body does all its round trips on the asyncio side. asyncpg
errors become ``StoreUnavailable`` (Postgres unreachable: callers answer 503 or retry),
``StoreConflict`` (rolled back for a concurrent transaction: ``transaction`` runs it again),
``UnstorableText`` or ``StoreError``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import asyncpg
import trio

from notifier.bridge import aio
from notifier.errors import StoreError, StoreUnavailable, UnstorableText

log = logging.getLogger("notifier.store")

SCHEMA_PATH = Path(__file__).with_name("schema.sql")
QUERIES_DIR = Path(__file__).parent  # queries_<area>.sql, one file for each area


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

UNAVAILABLE = (
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
    # A write refused by a server that is no longer the primary (fenced read-only during a
    # failover, a standby behind a PgBouncer): the pool closes that connection (pool.py).
    asyncpg.ReadOnlySQLTransactionError,
)

Row = Any  # an asyncpg Record; it never leaves the store
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


def crossing(
    fn: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """Make an asyncio-flavoured method Trio-flavoured: one bridge crossing, errors mapped."""

    @functools.wraps(fn)
    async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await aio(fn, self, *args, **kwargs)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"Postgres unavailable: {exc!r}") from exc
        except (asyncpg.SerializationError, asyncpg.DeadlockDetectedError) as exc:
            raise StoreConflict(f"Postgres error: {exc}") from exc
        except (asyncpg.UntranslatableCharacterError, asyncpg.CharacterNotInRepertoireError) as exc:
            raise UnstorableText(f"Postgres cannot store this text: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"Postgres error: {exc}") from exc

    return cast(Callable[Concatenate[S, P], Coroutine[Any, Any, T]], wrapper)


def transaction(
    fn: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """``crossing`` for a method whose body is one whole transaction (or one statement) that
    can be run again from the start: a conflict with a concurrent transaction is retried
    (``retry_conflicts``). Not for steps of a transaction that spans crossings (the outbox
    claim): after a rollback there is nothing to run them in."""
    crossed = crossing(fn)

    @functools.wraps(fn)
    async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        return await retry_conflicts(lambda: crossed(self, *args, **kwargs))

    return cast(Callable[Concatenate[S, P], Coroutine[Any, Any, T]], wrapper)
