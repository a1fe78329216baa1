"""The circuit breaker of each destination, shared by the fleet (docs/architecture.md §5).

A destination (``adapters.base.destination_of``: a webhook's origin, else the channel) whose
receiver cannot be reached ``failure_threshold`` times in a row has its circuit **opened**: its
deliveries are deferred — not attempted, no attempt spent — until a **half-open** probe, one
delivery let through by exactly one process, reaches it; then the circuit **closes**. A failed
probe opens it again with the probe interval doubled (up to a max).

- ``failed``, ``succeeded``, ``claim_probe``: the rules, pure, on whatever clock they are given.
  ``store/queries_circuits.sql`` states them on Postgres's clock, and
  ``notifier.testing.circuits.MemoryCircuits`` applies these on trio's.
- ``Breaker``: what a worker group keeps of them in memory, so that a healthy destination costs
  no statement: it reads the circuits in trouble every ``refresh_seconds`` and writes only on
  an unreachable failure, on the first success after failures it knows of, and to claim a
  probe.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import Protocol

import msgspec
import trio

from notifier.config import WorkerGroupConfig
from notifier.errors import StoreError

log = logging.getLogger("notifier.worker")

# How often a worker group reads the circuits in trouble: every process learns of a circuit
# opened elsewhere within about this long.
REFRESH_SECONDS = 1.0
# A probe's lease is the attempt's timeout plus this (the bound of its retry publish and record,
# worker.handle.FINAL_WRITE_TIMEOUT_SECONDS): a probe not reported by then was lost with its
# process, and another may be claimed.
PROBE_LEASE_MARGIN_SECONDS = 10.0


class State(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """``failure_threshold`` consecutive unreachable failures open a circuit (0: never); the
    first probe comes ``probe_base_seconds`` later, each failed probe doubles the wait up to
    ``probe_max_seconds``. A probe claimed and not reported within ``probe_lease_seconds``
    (its process died) may be claimed again by another."""

    failure_threshold: int
    probe_base_seconds: float
    probe_max_seconds: float
    probe_lease_seconds: float


class Circuit(msgspec.Struct, frozen=True, kw_only=True):
    """One destination's circuit. Times are on the clock of whoever keeps it. While half-open,
    ``next_probe_at`` is when the probe's lease ends."""

    state: State = State.CLOSED
    consecutive_failures: int = 0
    opened_at: float | None = None
    next_probe_at: float | None = None
    probe_interval: float | None = None


CLOSED = Circuit()


def failed(c: Circuit, now: float, policy: CircuitPolicy, *, probe: bool) -> Circuit:
    """An unreachable failure. A failed probe (the circuit half-open) opens it again with the
    interval doubled; any other failure counts, and opens a closed circuit at the threshold."""
    count = c.consecutive_failures + 1
    if probe and c.state is State.HALF_OPEN:
        interval = min(
            (c.probe_interval or policy.probe_base_seconds) * 2, policy.probe_max_seconds
        )
        return msgspec.structs.replace(
            c, state=State.OPEN, consecutive_failures=count, next_probe_at=now + interval,
            probe_interval=interval,
        )  # fmt: skip
    if c.state is State.CLOSED and 0 < policy.failure_threshold <= count:
        interval = policy.probe_base_seconds
        return Circuit(
            state=State.OPEN, consecutive_failures=count, opened_at=now,
            next_probe_at=now + interval, probe_interval=interval,
        )  # fmt: skip
    return msgspec.structs.replace(c, consecutive_failures=count)


def succeeded(c: Circuit) -> Circuit:
    """The receiver answered (delivered, or an error it answered with): closed, count reset."""
    return CLOSED


def claim_probe(c: Circuit, now: float, policy: CircuitPolicy) -> Circuit | None:
    """The circuit with a probe claimed, half-open until the lease ends; None when no probe is
    due (closed, or open and not yet time, or half-open with a live lease)."""
    if c.state is State.CLOSED or c.next_probe_at is None or c.next_probe_at > now:
        return None
    return msgspec.structs.replace(
        c, state=State.HALF_OPEN, next_probe_at=now + policy.probe_lease_seconds
    )


class CircuitRow(msgspec.Struct, frozen=True, kw_only=True):
    """A circuit as the store hands it to a worker: ``probe_in_seconds`` is ``next_probe_at``
    less the store's clock now (negative when due), so the processes' clocks do not matter."""

    destination: str
    state: State
    consecutive_failures: int
    probe_in_seconds: float | None = None


class SharedCircuits(Protocol):
    """The circuits of every destination, shared by the fleet (the store, on Postgres's
    clock)."""

    async def circuit_failed(
        self, channel_type: str, destination: str, *, probe: bool, policy: CircuitPolicy
    ) -> CircuitRow: ...

    async def circuit_succeeded(self, channel_type: str, destination: str) -> None: ...

    async def circuit_claim_probe(
        self, channel_type: str, destination: str, *, policy: CircuitPolicy
    ) -> tuple[bool, CircuitRow | None]: ...

    async def troubled_circuits(self, channel_type: str) -> Sequence[CircuitRow]: ...


class Gate(enum.Enum):
    GO = "go"  # closed: attempt as usual
    PROBE = "probe"  # this process holds the probe: attempt, and report how it went
    DEFER = "defer"  # open, or another process probes: do not attempt


class Admission(msgspec.Struct, frozen=True):
    gate: Gate
    wait: float = 0.0  # DEFER: the seconds until a probe may be due
    circuit: CircuitRow | None = None


GO = Admission(Gate.GO)


class _Known(msgspec.Struct, frozen=True):
    row: CircuitRow
    due: float | None  # next_probe_at on trio's clock


class Breaker:
    """A worker group's view of its type's circuits. Run ``run()`` beside the worker tasks.

    It remembers the circuits that are not closed or have failures (read every
    ``refresh_seconds``, and as its own statements return them); a destination it does not
    know of is closed and costs nothing."""

    def __init__(
        self,
        store: SharedCircuits,
        channel_type: str,
        policy: CircuitPolicy,
        *,
        refresh_seconds: float = REFRESH_SECONDS,
    ) -> None:
        self._store = store
        self._type = channel_type
        self.policy = policy
        self._refresh = refresh_seconds
        self._known: dict[str, _Known] = {}
        self._claiming: set[str] = set()
        self._refresh_failed = False

    def known(self, destination: str) -> CircuitRow | None:
        found = self._known.get(destination)
        return None if found is None else found.row

    def _remember(self, row: CircuitRow) -> None:
        if row.state is State.CLOSED and row.consecutive_failures == 0:
            self._known.pop(row.destination, None)
            return
        due = None if row.probe_in_seconds is None else trio.current_time() + row.probe_in_seconds
        self._known[row.destination] = _Known(row, due)

    async def admit(self, destination: str) -> Admission:
        """Trio-flavoured. Whether a delivery to ``destination`` may be attempted now. A
        statement only when a probe of an open circuit is due (one task of the process asks;
        exactly one process gets it); a ``StoreError`` propagates."""
        known = self._known.get(destination)
        if known is None or known.row.state is State.CLOSED:
            return GO
        now = trio.current_time()
        due = now if known.due is None else known.due
        if now < due or destination in self._claiming:
            return self._deferred(known, now)
        self._claiming.add(destination)
        try:
            claimed, row = await self._store.circuit_claim_probe(
                self._type, destination, policy=self.policy
            )
        finally:
            self._claiming.discard(destination)
        if row is None or row.state is State.CLOSED:
            self._known.pop(destination, None)
            if row is not None:
                self._remember(row)
            return GO
        if claimed:
            self._remember(row)
            log.info("circuit of %s %s: half-open, probing", self._type, destination)
            return Admission(Gate.PROBE, circuit=row)
        if row.state is State.OPEN and (row.probe_in_seconds or 0.0) <= 0:
            # another process claimed the probe as this one asked (the row is as it was before)
            row = msgspec.structs.replace(
                row, state=State.HALF_OPEN, probe_in_seconds=self.policy.probe_lease_seconds
            )
        self._remember(row)
        return self._deferred(self._known[destination], trio.current_time())

    def _deferred(self, known: _Known, now: float) -> Admission:
        wait = max((known.due or now) - now, 0.0)
        if known.row.state is State.HALF_OPEN:
            # another process probes: its answer comes well before its lease ends
            wait = min(wait, self.policy.probe_base_seconds)
        return Admission(Gate.DEFER, wait, known.row)

    async def reached(self, destination: str, *, probe: bool) -> None:
        """Trio-flavoured. The receiver answered: close the circuit, with a statement only when
        it is known to be in trouble. Store errors are logged, never raised (the attempt
        happened and is recorded all the same)."""
        if not probe and destination not in self._known:
            return
        self._known.pop(destination, None)  # one statement, whichever tasks answer together
        try:
            await self._store.circuit_succeeded(self._type, destination)
        except StoreError as exc:
            log.warning("circuit of %s %s: recording the success failed: %s",
                        self._type, destination, exc)  # fmt: skip
            return
        if probe:
            log.info("circuit of %s %s: closed, the probe reached it", self._type, destination)

    async def unreachable(self, destination: str, *, probe: bool) -> None:
        """Trio-flavoured. The receiver could not be reached: count it in the shared circuit,
        which may open it. Store errors are logged, never raised."""
        try:
            row = await self._store.circuit_failed(
                self._type, destination, probe=probe, policy=self.policy
            )
        except StoreError as exc:
            log.warning("circuit of %s %s: recording the failure failed: %s",
                        self._type, destination, exc)  # fmt: skip
            return
        before = self.known(destination)
        self._remember(row)
        if row.state is State.OPEN and (before is None or before.state is not State.OPEN):
            log.warning(
                "circuit of %s %s: open after %d consecutive unreachable failures; deliveries "
                "deferred, next probe in %.3g s", self._type, destination,
                row.consecutive_failures, row.probe_in_seconds or 0.0,
            )  # fmt: skip

    async def refresh(self) -> None:
        """Trio-flavoured. Read the circuits in trouble again; the rest are closed."""
        rows = await self._store.troubled_circuits(self._type)
        known: dict[str, _Known] = {}
        now = trio.current_time()
        for row in rows:
            due = None if row.probe_in_seconds is None else now + row.probe_in_seconds
            known[row.destination] = _Known(row, due)
        self._known = known

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Trio-flavoured. Refresh every ``refresh_seconds`` until cancelled; a failed read
        keeps what was known (logged once per outage)."""
        task_status.started()
        while True:
            try:
                await self.refresh()
            except StoreError as exc:
                if not self._refresh_failed:
                    log.warning("circuits of %s: reading them failed: %s", self._type, exc)
                self._refresh_failed = True
            else:
                self._refresh_failed = False
            await trio.sleep(self._refresh)


def breaker_for(
    store: SharedCircuits, channel_type: str, workers: WorkerGroupConfig
) -> Breaker | None:
    """The breaker ``[workers.<type>]`` asks for; None when ``circuit_failure_threshold`` is 0."""
    if workers.circuit_failure_threshold == 0:
        return None
    policy = CircuitPolicy(
        failure_threshold=workers.circuit_failure_threshold,
        probe_base_seconds=workers.circuit_probe_base_seconds,
        probe_max_seconds=workers.circuit_probe_max_seconds,
        probe_lease_seconds=workers.timeout_seconds + PROBE_LEASE_MARGIN_SECONDS,
    )
    return Breaker(store, channel_type, policy)
