"""A publish that declares its own route again when the broker says it is gone.

Queues are declared at start-up. A queue deleted afterwards (by an operator, or a broker that
lost its definitions) makes every mandatory publish routed to it come back *returned*, and
without this only a restart of the component would declare it again. A returned publish names
its exchange and routing key, which is exactly the part of the topology to declare again.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable

import trio

from notifier.broker.base import Confirm, Outgoing
from notifier.broker.topology import Topology, routes_to
from notifier.errors import BrokerError

log = logging.getLogger("notifier.broker")

Publish = Callable[[Outgoing], Awaitable[Confirm]]
Declare = Callable[[Topology], Awaitable[None]]

# A declaration that gets no answer in this long counts as failed (the publish stays returned).
DECLARE_TIMEOUT_SECONDS = 5.0


class RepairingPublish:
    """Trio-flavoured ``publish(message) -> Confirm`` over ``publish``: a message that comes
    back ``RETURNED`` while ``topology`` says where it should go gets that route declared
    again (``declare``, idempotent, as at start-up) and is published once more. The answer of
    that second publish is the answer; a route outside ``topology``, or a declaration that
    fails, leaves it ``RETURNED``.

    Concurrent returns for one route declare it once: a publish that was sent before another
    task's declaration of its route finished only publishes again.
    """

    def __init__(self, publish: Publish, declare: Declare, topology: Topology) -> None:
        self._publish = publish
        self._declare = declare
        self._topology = topology
        self._lock = trio.Lock()
        # route → how many times it was declared again (to tell an older return from a new one)
        self._declared: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.redeclared = 0  # declarations made (for tests and logs)

    async def __call__(self, message: Outgoing) -> Confirm:
        route = (message.exchange, message.routing_key)
        seen = self._declared[route]
        confirm = await self._publish(message)
        if confirm is not Confirm.RETURNED:
            return confirm
        needed = routes_to(self._topology, *route)
        if not needed.queues:
            return confirm  # not a route of ours: nothing to repair
        if not await self._redeclare(route, needed, seen):
            return confirm
        return await self._publish(message)

    async def _redeclare(self, route: tuple[str, str], needed: Topology, seen: int) -> bool:
        """Declare ``needed`` unless it was declared since ``seen``; True when it is in place."""
        async with self._lock:
            if self._declared[route] != seen:
                return True  # declared again while this publish was on its way
            names = ", ".join(q.name for q in needed.queues)
            log.warning(
                "a publish to %s with routing key %r came back unroutable: declaring %s again",
                route[0], route[1], names,
            )  # fmt: skip
            try:
                with trio.fail_after(DECLARE_TIMEOUT_SECONDS):
                    await self._declare(needed)
            except (BrokerError, trio.TooSlowError) as exc:
                log.warning("declaring %s again failed: %r", names, exc)
                return False
            self._declared[route] += 1
            self.redeclared += 1
            return True
