"""The relay's doorbell: LISTEN when it can, a hint only.

The relay polls the outbox every ``poll_interval_seconds`` whatever happens; a NOTIFY only
wakes it sooner. So losing the LISTEN connection (a terminated backend, a Postgres restart) is
no reason to stop relaying: the relay goes on polling while ``keep_listening`` opens a new
LISTEN connection in the background, with a small backoff of its own. Behind PgBouncer in
transaction pooling mode without ``database.listen_url`` there is nothing to LISTEN on: the
store's doorbell then never rings nor is lost, and the relay only polls.
"""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import trio

from notifier.hint import Hint
from notifier.store.listen import relisten

log = logging.getLogger("notifier.relay")


class Bell(Protocol):
    """One LISTEN connection's doorbell (``Store.open_doorbell``): rings on a NOTIFY, and once
    more, with ``connected`` False, when the connection is lost."""

    connected: bool

    def clear(self) -> None: ...

    async def wait(self) -> None: ...


class DoorbellStore(Protocol):
    def open_doorbell(self) -> AbstractAsyncContextManager[Bell]: ...


async def keep_listening(
    store: DoorbellStore,
    hint: Hint,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Ring ``hint`` on every outbox NOTIFY, for ever (cancel it to stop).

    ``started()`` comes after the first LISTEN, or after it failed: the relay is ready to poll
    either way. A lost or refused LISTEN connection is logged, rings ``hint`` and is opened
    again after a backoff; nothing here ever fails the relay for it.
    """

    async def use(bell: Bell, again: bool) -> None:
        if again:
            hint.ring()  # a pass for whatever rang while nobody listened
        await _forward(bell, hint)

    await relisten(
        store.open_doorbell, use, log=log, what="the outbox doorbell",
        lost="the outbox LISTEN connection was lost; the relay polls until it is back",
        failed="listening for the outbox doorbell failed (the relay polls)",
        after_each=hint.ring, task_status=task_status,
    )  # fmt: skip


async def _forward(bell: Bell, hint: Hint) -> None:
    """Ring ``hint`` for every ring of ``bell``; return once its connection is lost."""
    while bell.connected:
        await bell.wait()
        bell.clear()
        hint.ring()
