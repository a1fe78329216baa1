"""The store's queries for the circuit breakers shared by the fleet (``worker.circuit``): one
statement per call, on Postgres's clock."""

from __future__ import annotations

from collections.abc import Sequence

from notifier.store.base import Q, Row, transaction
from notifier.store.pool import Queries
from notifier.store.rows import DestinationCircuit
from notifier.worker.circuit import CircuitPolicy, CircuitRow, State


def _row(r: Row) -> CircuitRow:
    return CircuitRow(
        destination=r["destination"], state=State(r["state"]),
        consecutive_failures=r["consecutive_failures"], probe_in_seconds=r["probe_in_seconds"],
    )  # fmt: skip


class CircuitQueries(Queries):
    """``worker.circuit.SharedCircuits`` on the ``circuits`` table, and what the API reads."""

    @transaction
    async def circuit_failed(
        self, channel_type: str, destination: str, *, probe: bool, policy: CircuitPolicy
    ) -> CircuitRow:
        row = await self._pool.fetchrow(
            Q["circuit_failed"], channel_type, destination, probe, policy.failure_threshold,
            float(policy.probe_base_seconds), float(policy.probe_max_seconds),
        )  # fmt: skip
        return _row(row)

    @transaction
    async def circuit_succeeded(self, channel_type: str, destination: str) -> None:
        await self._pool.fetch(Q["circuit_succeeded"], channel_type, destination)

    @transaction
    async def circuit_claim_probe(
        self, channel_type: str, destination: str, *, policy: CircuitPolicy
    ) -> tuple[bool, CircuitRow | None]:
        row = await self._pool.fetchrow(
            Q["circuit_claim_probe"], channel_type, destination, float(policy.probe_lease_seconds)
        )
        if row is None:
            return False, None
        return bool(row["claimed"]), _row(row)

    @transaction
    async def troubled_circuits(self, channel_type: str) -> list[CircuitRow]:
        return [_row(r) for r in await self._pool.fetch(Q["circuits_troubled"], channel_type)]

    @transaction
    async def circuits_of(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], DestinationCircuit]:
        """The circuits of these (channel type, destination) pairs that have a row (the others
        are closed, with no failure)."""
        if not keys:
            return {}
        rows = await self._pool.fetch(Q["circuits_of"], [k[0] for k in keys], [k[1] for k in keys])
        return {
            (r["channel_type"], r["destination"]): DestinationCircuit(
                state=r["state"],
                consecutive_failures=r["consecutive_failures"],
                opened_at=r["opened_at"],
                next_probe_at=r["next_probe_at"],
            )
            for r in rows
        }
