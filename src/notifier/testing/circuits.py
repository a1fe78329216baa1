"""The circuits shared by the fleet, in memory, for unit tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio

from notifier.errors import StoreUnavailable
from notifier.worker.circuit import (
    CLOSED,
    Circuit,
    CircuitPolicy,
    CircuitRow,
    State,
    claim_probe,
    failed,
    succeeded,
)


class MemoryCircuits:
    """``notifier.worker.circuit.SharedCircuits`` in this process's memory, with the rules of
    ``worker.circuit`` on ``clock`` (trio's: a ``MockClock`` in tests), as the SQL keeps them
    on Postgres's. ``calls`` lists every call by name (a healthy destination should add none).
    Set ``unavailable = True`` to make every call raise ``StoreUnavailable``."""

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self.circuits: dict[tuple[str, str], Circuit] = {}
        self.calls: list[str] = []
        self.unavailable = False

    async def _enter(self, name: str) -> None:
        await trio.lowlevel.checkpoint()
        if self.unavailable:
            raise StoreUnavailable("memory circuits are unavailable")
        self.calls.append(name)

    def _row(self, destination: str, c: Circuit) -> CircuitRow:
        probe_in = None if c.next_probe_at is None else c.next_probe_at - self._clock()
        return CircuitRow(
            destination=destination, state=c.state, consecutive_failures=c.consecutive_failures,
            probe_in_seconds=probe_in,
        )  # fmt: skip

    async def circuit_failed(
        self, channel_type: str, destination: str, *, probe: bool, policy: CircuitPolicy
    ) -> CircuitRow:
        await self._enter("failed")
        key = (channel_type, destination)
        c = self.circuits[key] = failed(
            self.circuits.get(key, CLOSED), self._clock(), policy, probe=probe
        )
        return self._row(destination, c)

    async def circuit_succeeded(self, channel_type: str, destination: str) -> None:
        await self._enter("succeeded")
        key = (channel_type, destination)
        if key in self.circuits:
            self.circuits[key] = succeeded(self.circuits[key])

    async def circuit_claim_probe(
        self, channel_type: str, destination: str, *, policy: CircuitPolicy
    ) -> tuple[bool, CircuitRow | None]:
        await self._enter("claim_probe")
        key = (channel_type, destination)
        if (c := self.circuits.get(key)) is None:
            return False, None
        claimed = claim_probe(c, self._clock(), policy)
        if claimed is None:
            return False, self._row(destination, c)
        self.circuits[key] = claimed
        return True, self._row(destination, claimed)

    async def troubled_circuits(self, channel_type: str) -> Sequence[CircuitRow]:
        await self._enter("troubled")
        return [
            self._row(d, c) for (t, d), c in self.circuits.items()
            if t == channel_type and (c.state is not State.CLOSED or c.consecutive_failures)
        ]  # fmt: skip
