"""The publisher: one confirm-mode channel, batches published with all confirms awaited
together (one bridge crossing), and copies that share a message id kept apart."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiormq
from pamqp.commands import Basic

from notifier.bridge import aio
from notifier.broker.amqp_base import publish_outcome, wait_closing
from notifier.broker.base import Confirm, Outgoing
from notifier.errors import BrokerError

# AMQP basic properties passed through as plain values: AMQP name → pamqp attribute name.
PASSED_PROPERTIES = {
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "correlation_id": "correlation_id",
    "reply_to": "reply_to",
    "timestamp": "timestamp",
    "priority": "priority",
    "type": "message_type",
}


def _publish_properties(m: Outgoing) -> dict[str, Any]:
    """pamqp ``Basic.Properties`` arguments: persistent JSON, plus what ``m`` sets."""
    props: dict[str, Any] = {
        "delivery_mode": 2,
        "message_id": m.message_id or None,
        "content_type": "application/json",
    }
    if m.headers:
        props["headers"] = dict(m.headers)
    for name, value in (m.properties or {}).items():
        if name == "app_id":
            props["app_id"] = value
        elif name in PASSED_PROPERTIES:
            props[PASSED_PROPERTIES[name]] = value
    return props


def id_rounds(messages: Sequence[Outgoing]) -> list[list[int]]:
    """The indexes of ``messages`` in publish rounds in which no ``message_id`` appears twice.

    aiormq matches a returned message to its publish by ``message_id`` (a return carries no
    delivery tag): with two copies of one id in flight, one's return would be taken for the
    other's, and a lost copy counted as confirmed. Usually one round; messages without an id
    get a unique one from aiormq."""
    rounds: list[list[int]] = []
    uses: dict[str, int] = {}
    for index, m in enumerate(messages):
        n = 0
        if m.message_id:
            n = uses.get(m.message_id, 0)
            uses[m.message_id] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(index)
    return rounds


class AmqpPublisher:
    """Trio-flavoured publisher on one confirm-mode channel."""

    def __init__(
        self,
        channel: aiormq.abc.AbstractChannel,
        timeout_seconds: float,
        connection: aiormq.abc.AbstractConnection,
    ) -> None:
        self._ch = channel
        self._timeout = timeout_seconds
        self._conn = connection

    def check(self) -> None:
        if self._ch.is_closed:
            raise BrokerError("publisher channel is closed")

    async def wait_publishable(self) -> None:
        """Trio-flavoured. Wait for aiormq's ``ready()`` (connected and not blocked by the
        broker, which sends ``connection.blocked`` during a memory or disk alarm and holds our
        frames), raising ``BrokerError`` if the channel or connection closes first: a connection
        lost while blocked never becomes ready. One bridge crossing."""
        self.check()
        if not await aio(self._ready_or_closed):
            raise BrokerError("the publishing connection closed while waiting to publish")

    async def _ready_or_closed(self) -> bool:
        """Asyncio-flavoured: True once the connection is ready, False if the channel or the
        connection closed first."""
        ready = asyncio.ensure_future(self._conn.ready())
        # independent observers of the closing (cancelling one closes nothing)
        closings = [self._ch.closing, self._conn.closing]
        try:
            await asyncio.wait([ready, *closings], return_when=asyncio.FIRST_COMPLETED)
            return ready.done() and not any(c.done() for c in closings)
        finally:  # before the observers are cancelled, which makes them done
            for waiting in (ready, *closings):
                if not waiting.done():
                    waiting.cancel()

    async def wait_closed(self) -> None:
        """Trio-flavoured. Return when the channel is closed (by either side)."""
        await wait_closing(self._ch)

    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        """Trio-flavoured. Publish all, await all confirms together; one result per message.
        Messages that share a ``message_id`` go in rounds of their own (``id_rounds``)."""
        if not messages:
            return []
        return await aio(self._publish_batch_aio, messages)

    async def _publish_batch_aio(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        """Asyncio-flavoured: each round of ``id_rounds`` published, then its confirms awaited."""
        results = [Confirm.UNCONFIRMED] * len(messages)
        for indexes in id_rounds(messages):
            confirms = await self._publish_round([messages[i] for i in indexes])
            for i, confirm in zip(indexes, confirms, strict=True):
                results[i] = confirm
        return results

    async def _publish_round(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        """Asyncio-flavoured: publish everything, then await every confirm (bounded)."""

        async def one(m: Outgoing) -> Confirm:
            try:
                await self._ch.basic_publish(
                    m.body,
                    exchange=m.exchange,
                    routing_key=m.routing_key,
                    mandatory=True,
                    properties=Basic.Properties(**_publish_properties(m)),
                )
            except asyncio.CancelledError:
                return Confirm.UNCONFIRMED
            except Exception as exc:
                if (outcome := publish_outcome(exc)) is None:
                    raise
                return outcome
            return Confirm.CONFIRMED

        tasks = [asyncio.ensure_future(one(m)) for m in messages]
        done, pending = await asyncio.wait(tasks, timeout=self._timeout)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending)
        return [t.result() if t in done else Confirm.UNCONFIRMED for t in tasks]
