"""A resettable wake-up, and the outbox doorbell built on it.

The relay sleeps between polls until something hints that a pass is due: a NOTIFY on the
outbox channel, or the LISTEN connection lost or back. A ``Hint`` keeps a ring until the
waiter clears it, so a ring between a pass and the next wait is never missed.
"""

from __future__ import annotations

import trio


class Hint:
    """Rung to wake whoever waits on it; ``clear`` re-arms it once the waiter has acted."""

    def __init__(self) -> None:
        self._rung = trio.Event()

    def ring(self) -> None:
        self._rung.set()

    def clear(self) -> None:
        if self._rung.is_set():
            self._rung = trio.Event()

    async def wait(self) -> None:
        await self._rung.wait()


class Doorbell(Hint):
    """One LISTEN connection's doorbell: rings on a NOTIFY, and once more, with ``connected``
    False, when the connection is lost (it never rings again after that)."""

    def __init__(self) -> None:
        super().__init__()
        self.connected = True

    def lost(self) -> None:
        self.connected = False
        self.ring()
