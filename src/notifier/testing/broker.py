"""An in-memory publisher with RabbitMQ's routing, returns and nacks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import trio

from notifier.broker.base import Confirm, Outgoing
from notifier.broker.topology import Topology
from notifier.errors import BrokerError

# -- in-memory broker ---------------------------------------------------------------------------


class MemoryBroker:
    """Routes by (exchange, routing key) like a direct exchange. Unroutable messages come back
    ``RETURNED``; ``nack_next``/``drop_confirms`` simulate a refusing or silent broker;
    ``block()``/``unblock()`` a broker alarm (publishes go unconfirmed and land nowhere);
    ``delete_queue`` a queue deleted under its users, ``declare_topology`` the declaration that
    brings it back (``refuse_declares`` makes that fail)."""

    def __init__(self) -> None:
        self.bindings: dict[tuple[str, str], str] = {}
        self.queues: dict[str, list[Outgoing]] = defaultdict(list)
        self.published: list[Outgoing] = []
        self.nack_next = 0
        self.drop_confirms = False
        self.closed = False
        self.declared: list[Topology] = []  # every declare_topology call
        self.refuse_declares = False
        self._unblocked: trio.Event | None = None  # while blocked: set when the block lifts

    def block(self) -> None:
        if self._unblocked is None:
            self._unblocked = trio.Event()

    def unblock(self) -> None:
        if self._unblocked is not None:
            self._unblocked.set()
            self._unblocked = None

    def close(self) -> None:
        """The connection is lost (a publisher waiting out a block wakes up to the error)."""
        self.closed = True
        self.unblock()

    async def wait_publishable(self) -> None:
        if self._unblocked is None:
            await trio.lowlevel.checkpoint()
        else:
            await self._unblocked.wait()
        self.check()

    def bind(self, exchange: str, routing_key: str, queue: str) -> None:
        self.bindings[(exchange, routing_key)] = queue

    def declare(self, topology: Topology) -> None:
        """Bind every queue of ``topology`` the way ``AmqpConnection.declare`` does."""
        for q in topology.queues:
            self.bind(q.exchange, q.routing_key, q.name)

    async def declare_topology(self, topology: Topology) -> None:
        """``AmqpConnection.declare``: record ``topology`` in ``declared`` and bind its queues;
        raise ``BrokerError`` instead while ``refuse_declares`` is set."""
        await trio.lowlevel.checkpoint()
        self.declared.append(topology)
        if self.refuse_declares:
            raise BrokerError("memory broker refuses declarations")
        self.declare(topology)

    def delete_queue(self, name: str) -> None:
        """``rabbitmqctl delete_queue``: its bindings and messages are gone."""
        self.bindings = {route: q for route, q in self.bindings.items() if q != name}
        self.queues.pop(name, None)

    async def publish(self, message: Outgoing) -> Confirm:
        """One message; the worker's retry publisher has this shape."""
        (confirm,) = await self.publish_batch([message])
        return confirm

    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        await trio.lowlevel.checkpoint()
        results = []
        for m in messages:
            self.published.append(m)
            queue = self.bindings.get((m.exchange, m.routing_key))
            if self._unblocked is not None:
                results.append(Confirm.UNCONFIRMED)  # held by the alarm past the timeout
            elif self.drop_confirms:
                if queue:
                    self.queues[queue].append(m)  # it may have landed; we just never heard
                results.append(Confirm.UNCONFIRMED)
            elif queue is None:
                results.append(Confirm.RETURNED)
            elif self.nack_next > 0:
                self.nack_next -= 1
                results.append(Confirm.NACKED)
            else:
                self.queues[queue].append(m)
                results.append(Confirm.CONFIRMED)
        return results

    def check(self) -> None:
        if self.closed:
            raise BrokerError("memory broker closed")
