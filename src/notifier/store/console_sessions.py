"""The console's sessions and the fleet's count of failed sign-ins, in Postgres
(``console_sessions``, ``console_signin_failures``: migrations/0007), and ``ConsoleStore``, the
interface the console is written against (``notifier.testing.console.MemoryConsoleStore`` is
the in-memory one of the unit tests)."""

from __future__ import annotations

import uuid
from typing import Protocol, runtime_checkable

import msgspec

from notifier.store.base import Q, transaction
from notifier.store.pool import Queries

# An address with no failed sign-in for this long starts again from nothing (and maintenance
# deletes its row).
SIGNIN_FORGET_AFTER_SECONDS = 15 * 60.0


class SignedIn(msgspec.Struct, frozen=True):
    """A session's tenant and the hash of the API key it signed in with."""

    tenant_id: uuid.UUID
    key_hash: str


class SignInFailures(msgspec.Struct, frozen=True):
    """An address's failed sign-ins in a row and the seconds since the last one."""

    count: int
    quiet_seconds: float


@runtime_checkable
class ConsoleStore(Protocol):
    """Sessions by the SHA-256 of their id (the id itself is never stored), and failed
    sign-ins by client address, forgotten after ``forget_after_seconds`` of quiet."""

    async def create_console_session(
        self, id_hash: str, tenant_id: uuid.UUID, key_hash: str, *, max_age_seconds: float
    ) -> None: ...

    async def console_session(self, id_hash: str) -> SignedIn | None:
        """The session, unless it has ended, expired, or its tenant's key changed or the
        tenant was disabled; its last use is noted."""
        ...

    async def end_console_session(self, id_hash: str) -> None: ...

    async def signin_failures(
        self, address: str, *, forget_after_seconds: float
    ) -> SignInFailures | None: ...

    async def signin_failed(self, address: str, *, forget_after_seconds: float) -> None: ...

    async def signin_succeeded(self, address: str) -> None: ...


class ConsoleSessionQueries(Queries):
    """``ConsoleStore`` on Postgres (its maintenance: ``MaintenanceQueries.clean_console``)."""

    @transaction
    async def create_console_session(
        self, id_hash: str, tenant_id: uuid.UUID, key_hash: str, *, max_age_seconds: float
    ) -> None:
        await self._pool.fetch(
            Q["console_session_create"], id_hash, tenant_id, key_hash, float(max_age_seconds)
        )

    @transaction
    async def console_session(self, id_hash: str) -> SignedIn | None:
        row = await self._pool.fetchrow(Q["console_session_touch"], id_hash)
        return None if row is None else SignedIn(row["tenant_id"], row["api_key_hash"])

    @transaction
    async def end_console_session(self, id_hash: str) -> None:
        await self._pool.fetch(Q["console_session_end"], id_hash)

    @transaction
    async def signin_failures(
        self, address: str, *, forget_after_seconds: float
    ) -> SignInFailures | None:
        row = await self._pool.fetchrow(
            Q["console_signin_failures"], address, float(forget_after_seconds)
        )
        return None if row is None else SignInFailures(row["failures"], row["quiet_seconds"])

    @transaction
    async def signin_failed(self, address: str, *, forget_after_seconds: float) -> None:
        await self._pool.fetch(Q["console_signin_failed"], address, float(forget_after_seconds))

    @transaction
    async def signin_succeeded(self, address: str) -> None:
        await self._pool.fetch(Q["console_signin_succeeded"], address)
