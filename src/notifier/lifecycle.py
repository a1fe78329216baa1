"""Graceful stop and restart-with-backoff: the two small pieces the supervisor is built from."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import trio

from notifier.observability import Reporter

log = logging.getLogger("notifier.service")


class Stop:
    """A stop request shared by every component of one process.

    Components take new work only inside ``intake()`` scopes, which a stop request cancels;
    work already taken goes on until it finishes (the caller bounds it with a deadline).
    """

    def __init__(self) -> None:
        self._event = trio.Event()
        self._scopes: set[trio.CancelScope] = set()

    def set(self) -> None:
        self._event.set()
        for scope in list(self._scopes):
            scope.cancel()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    @contextmanager
    def intake(self) -> Iterator[trio.CancelScope]:
        """A cancel scope that a stop request cancels (at once if already requested)."""
        with trio.CancelScope() as scope:
            if self._event.is_set():
                scope.cancel()
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)


class _StartedOnce:
    """Pass ``started`` through to the outer task status the first time only."""

    def __init__(self, outer: Any) -> None:
        self._outer = outer
        self.done = False

    def started(self, value: Any = None) -> None:
        if not self.done:
            self.done = True
            self._outer.started(value)


async def supervise(
    name: str,
    run: Callable[..., Awaitable[None]],
    stop: Stop,
    *,
    initial_backoff_seconds: float = 0.5,
    max_backoff_seconds: float = 30.0,
    reporter: Reporter | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``run(task_status=...)`` and restart it with exponential backoff when it fails.

    A failure before the first ``started()`` propagates, so start-up errors (bad URL, refused
    declaration) surface at once. After that, failures of the component itself (a lost broker
    connection, Postgres gone) are logged and the component restarts; the rest of the process
    keeps running. A normal return ends supervision. Each such failure is also reported to
    ``reporter`` (Sentry in production, passed in by ``service.run``; none: only logged).
    """
    status = _StartedOnce(task_status)
    delay = initial_backoff_seconds
    while True:
        began = trio.current_time()
        try:
            await run(task_status=status)
            return
        except Exception as exc:
            if not status.done:
                raise
            if trio.current_time() - began > 60:
                delay = initial_backoff_seconds  # it ran fine for a while: start over
            log.error("%s failed, restarting in %.1f s: %r", name, delay, exc, exc_info=exc)
            if reporter is not None:
                reporter.report(f"{name} failed", tags={"component": name}, exc=exc)
        if stop.is_set():
            return
        with stop.intake():
            await trio.sleep(delay)
        if stop.is_set():
            return
        delay = min(delay * 2, max_backoff_seconds)


def watch_closing(
    nursery: trio.Nursery, closings: Mapping[str, Callable[[], Awaitable[None]]]
) -> list[str]:
    """Cancel ``nursery`` as soon as one of ``closings`` returns (a connection or channel of a
    component closed under it); the list returned names what closed, in order. The caller
    raises when the list is not empty once the nursery is done."""
    lost: list[str] = []

    async def watch(what: str, closed: Callable[[], Awaitable[None]]) -> None:
        await closed()
        lost.append(what)
        nursery.cancel_scope.cancel()

    for what, closed in closings.items():
        nursery.start_soon(watch, what, closed)
    return lost
