"""LISTEN on a connection of its own (``listening``, which the outbox doorbell in ``outbox.py``
uses too), and the tenants' changes as they happen: the channel that schema.sql's trigger
NOTIFYs with a tenant's id on every UPDATE or DELETE of its row, and the one its catalog's
trigger NOTIFYs on a change of one of its event types. Ingest forgets that tenant's cached keys
and catalog, or its catalog only (``notifier.ingest.tenants.keep_tenant_caches_fresh``).

Never on a pooled connection: a LISTEN would stay on it for its next user, and behind a
transaction pooler it would be lost with the transaction.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeVar

import asyncpg
import trio

from notifier.bridge import aio
from notifier.errors import StoreError, StoreUnavailable
from notifier.store import hosts
from notifier.store.base import UNAVAILABLE

T = TypeVar("T")

TENANTS_CHANNEL = "notifier_tenants"  # schema.sql's trigger notifier_tenant_changed()
# schema.sql's trigger notifier_event_types_changed(): a tenant's event-type catalog changed.
CATALOGS_CHANNEL = "notifier_catalogs"


@asynccontextmanager
async def listening(
    dsn: str,
    channel: str,
    *,
    on_notify: Callable[[str], None],
    on_lost: Callable[[], None],
    also: Mapping[str, Callable[[str], None]] | None = None,
) -> AsyncIterator[None]:
    """Trio-flavoured. LISTEN on ``channel`` on a connection of its own while the block runs:
    ``on_notify(payload)`` for each notification and ``on_lost()`` once the connection is lost,
    both called in trio's thread. The outbox doorbell and the tenants' changes listen so.
    ``also``: more channels LISTENed on the same connection, each with its ``on_notify``."""
    token = trio.lowlevel.current_trio_token()
    handlers = {channel: on_notify, **(also or {})}

    def notified(_conn: object, _pid: int, channel: str, payload: object) -> None:
        token.run_sync_soon(handlers[channel], str(payload))  # asyncio-flavoured callback

    unreadable = ""
    try:
        conn: asyncpg.Connection = await aio(hosts.connect, dsn, timeout=10)
    except UNAVAILABLE as exc:
        raise StoreUnavailable(f"Postgres unavailable: {exc!r}") from exc
    except ValueError as exc:  # asyncpg's ClientConfigurationError is one too
        unreadable = type(exc).__name__
    if unreadable:
        # asyncpg's message quotes a part of the URL, a password perhaps: neither it nor
        # the exception itself (not even as the context of this one) goes any further.
        raise StoreError(
            "cannot LISTEN: asyncpg cannot read the URL to LISTEN on (database.listen_url, "
            f"or database.url without it): {unreadable}"
        )
    try:
        try:
            for name in handlers:
                await aio(conn.add_listener, name, notified)
        except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise StoreUnavailable(f"LISTEN failed: {exc!r}") from exc
        conn.add_termination_listener(lambda *_: token.run_sync_soon(on_lost))
        if conn.is_closed():  # lost before the listener was in place: it will not say so
            on_lost()
        yield
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await aio(conn.close, timeout=5)
            except Exception:
                conn.terminate()


@asynccontextmanager
async def open_tenant_changes(listen_dsn: str | None) -> AsyncIterator[TenantChanges]:
    """Trio-flavoured. LISTEN on the tenants' channel and the catalogs' on a connection of its
    own; iterate the result for (channel, id of the tenant changed), until that connection is
    lost.

    Without a DSN to LISTEN on (behind a transaction pooler with no ``listen_url``) the
    result is not ``listening`` and its iteration never yields nor ends."""
    if listen_dsn is None:
        yield TenantChanges(None)
        return
    send, receive = trio.open_memory_channel[tuple[str, str]](math.inf)
    try:
        tenants = functools.partial(_send, send, TENANTS_CHANNEL)
        catalogs = {CATALOGS_CHANNEL: functools.partial(_send, send, CATALOGS_CHANNEL)}
        async with listening(
            listen_dsn, TENANTS_CHANNEL, on_notify=tenants, on_lost=send.close, also=catalogs
        ):
            yield TenantChanges(receive)
    finally:
        send.close()


# A lost or refused LISTEN connection is opened again after this, doubling up to the maximum;
# a connection that held that long starts the backoff over.
RELISTEN_INITIAL_BACKOFF_SECONDS = 0.5
RELISTEN_MAX_BACKOFF_SECONDS = 5.0


async def relisten(
    open_listener: Callable[[], AbstractAsyncContextManager[T]],
    use: Callable[[T, bool], Awaitable[None]],
    *,
    log: logging.Logger,
    what: str,
    lost: str,
    failed: str,
    after_each: Callable[[], None] = lambda: None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Open a LISTEN with ``open_listener`` and ``use(listener, again)`` it
    until its connection is lost, for ever (cancel it to stop); ``again`` is False the first
    time. A lost (``lost``) or refused (``failed``, with the error) connection is logged, then
    ``after_each()``, then it is opened again after a backoff: nothing here ever fails its
    caller. ``started()`` comes after the first LISTEN, or after it failed."""
    delay = RELISTEN_INITIAL_BACKOFF_SECONDS
    started = False
    while True:
        began = trio.current_time()
        try:
            async with open_listener() as listener:
                again = started
                if again:
                    log.info("listening for %s again", what)
                else:
                    started = True
                    task_status.started()
                await use(listener, again)
            log.warning(lost)
        except StoreError as exc:
            log.warning("%s: %r", failed, exc)
        if not started:
            started = True
            task_status.started()
        after_each()
        if trio.current_time() - began >= RELISTEN_MAX_BACKOFF_SECONDS:
            delay = RELISTEN_INITIAL_BACKOFF_SECONDS  # it held for a while: start over
        await trio.sleep(delay)
        delay = min(delay * 2, RELISTEN_MAX_BACKOFF_SECONDS)


class TenantChanges:
    """(channel, id of the tenant changed, as sent: text), as they are NOTIFYed on
    ``TENANTS_CHANNEL`` and ``CATALOGS_CHANNEL``; the iteration ends when the LISTEN connection
    is lost. Not ``listening``: never yields nor ends."""

    def __init__(self, receive: trio.MemoryReceiveChannel[tuple[str, str]] | None) -> None:
        self._receive = receive

    @property
    def listening(self) -> bool:
        return self._receive is not None

    async def __aiter__(self) -> AsyncIterator[tuple[str, str]]:
        if self._receive is None:
            await trio.sleep_forever()
        else:
            async for payload in self._receive:
                yield payload


def _send(send: trio.MemorySendChannel[tuple[str, str]], channel: str, payload: str) -> None:
    with contextlib.suppress(trio.ClosedResourceError):  # the connection was lost meanwhile
        send.send_nowait((channel, payload))
