"""The console's sessions and failed sign-ins in memory (``ConsoleStore``), for unit tests: the
same answers as the Postgres tables on the clock it is given (trio's by default, so a
``MockClock`` drives expiry and the slow-down)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

import trio

from notifier.store.console_sessions import SignedIn, SignInFailures


@dataclasses.dataclass
class _Session:
    signed_in: SignedIn
    expires_at: float
    last_seen_at: float


@dataclasses.dataclass
class _Failures:
    count: int
    last_at: float


class MemoryConsoleStore:
    """Sessions by their id's hash, failures by address. It knows no tenants: a key replaced or
    a tenant disabled is seen by the console's own look-up of the key (as on Postgres, where
    the store sees it too)."""

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self.sessions: dict[str, _Session] = {}
        self.failures: dict[str, _Failures] = {}

    async def create_console_session(
        self, id_hash: str, tenant_id: uuid.UUID, key_hash: str, *, max_age_seconds: float
    ) -> None:
        await trio.lowlevel.checkpoint()
        now = self._clock()
        self.sessions[id_hash] = _Session(SignedIn(tenant_id, key_hash), now + max_age_seconds, now)

    async def console_session(self, id_hash: str) -> SignedIn | None:
        await trio.lowlevel.checkpoint()
        session = self.sessions.get(id_hash)
        now = self._clock()
        if session is None or session.expires_at <= now:
            return None
        session.last_seen_at = now
        return session.signed_in

    async def end_console_session(self, id_hash: str) -> None:
        await trio.lowlevel.checkpoint()
        self.sessions.pop(id_hash, None)

    async def signin_failures(
        self, address: str, *, forget_after_seconds: float
    ) -> SignInFailures | None:
        await trio.lowlevel.checkpoint()
        failures = self.failures.get(address)
        quiet = 0.0 if failures is None else self._clock() - failures.last_at
        if failures is None or quiet >= forget_after_seconds:
            return None
        return SignInFailures(failures.count, quiet)

    async def signin_failed(self, address: str, *, forget_after_seconds: float) -> None:
        await trio.lowlevel.checkpoint()
        now = self._clock()
        failures = self.failures.get(address)
        if failures is None or now - failures.last_at >= forget_after_seconds:
            failures = self.failures[address] = _Failures(0, now)
        failures.count += 1
        failures.last_at = now

    async def signin_succeeded(self, address: str) -> None:
        await trio.lowlevel.checkpoint()
        self.failures.pop(address, None)
