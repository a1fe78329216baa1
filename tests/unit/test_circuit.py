"""The circuit breaker (docs/architecture.md §5): its rules as a table, and a worker group's
``Breaker`` over the in-memory shared circuits on trio's MockClock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from notifier.config import WorkerGroupConfig
from notifier.testing.circuits import MemoryCircuits
from notifier.worker.circuit import (
    CLOSED,
    Breaker,
    Circuit,
    CircuitPolicy,
    Gate,
    State,
    breaker_for,
    claim_probe,
    failed,
    succeeded,
)

POLICY = CircuitPolicy(
    failure_threshold=3, probe_base_seconds=5, probe_max_seconds=30, probe_lease_seconds=20
)
NOW = 1000.0
DEST = "https://example.com:443"


def open_(count: int = 3, at: float = NOW - 5, interval: float = 5) -> Circuit:
    return Circuit(
        state=State.OPEN, consecutive_failures=count, opened_at=at, next_probe_at=at + interval,
        probe_interval=interval,
    )  # fmt: skip


def half_open(
    count: int = 3, interval: float = 5, lease_end: float = NOW + 20, opened_at: float = NOW - 100
) -> Circuit:
    return Circuit(
        state=State.HALF_OPEN, consecutive_failures=count, opened_at=opened_at,
        next_probe_at=lease_end, probe_interval=interval,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("before", "probe", "after"),
    [
        # a first failure is counted, the circuit stays closed
        (CLOSED, False, Circuit(consecutive_failures=1)),
        # below the threshold: counted
        (Circuit(consecutive_failures=1), False, Circuit(consecutive_failures=2)),
        # the threshold-th failure in a row opens it; the first probe after the base interval
        (Circuit(consecutive_failures=2), False, open_(3, NOW, 5)),
        # failures while open (attempts already under way) are counted, nothing else changes
        (open_(3), False, open_(4)),
        # a failed probe opens it again, the interval doubled, since the first opening
        (half_open(3, 5), True, Circuit(
            state=State.OPEN, consecutive_failures=4, opened_at=NOW - 100,
            next_probe_at=NOW + 10, probe_interval=10,
        )),
        # ... doubled up to the max
        (half_open(9, 20), True, Circuit(
            state=State.OPEN, consecutive_failures=10, opened_at=NOW - 100,
            next_probe_at=NOW + 30, probe_interval=30,
        )),
        # a failure that is not the probe, while another process probes: counted only
        (half_open(3), False, half_open(4)),
        # a "probe" failure reported after another closed the circuit: an ordinary failure
        (CLOSED, True, Circuit(consecutive_failures=1)),
    ],
)  # fmt: skip
def test_an_unreachable_failure(before: Circuit, probe: bool, after: Circuit) -> None:
    assert failed(before, NOW, POLICY, probe=probe) == after


def test_a_threshold_of_zero_never_opens() -> None:
    off = CircuitPolicy(
        failure_threshold=0, probe_base_seconds=5, probe_max_seconds=30, probe_lease_seconds=20
    )
    c = CLOSED
    for _ in range(100):
        c = failed(c, NOW, off, probe=False)
    assert (c.state, c.consecutive_failures) == (State.CLOSED, 100)


@pytest.mark.parametrize(
    "before",
    [CLOSED, Circuit(consecutive_failures=2), open_(), half_open()],
)
def test_an_answer_closes_the_circuit_whatever_its_state(before: Circuit) -> None:
    assert succeeded(before) == CLOSED


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # closed: nothing to probe
        (CLOSED, None),
        (Circuit(consecutive_failures=2), None),
        # open, the probe not yet due
        (open_(at=NOW - 4), None),
        # open and due (exactly, or past): half-open, leased
        (open_(at=NOW - 5), half_open(lease_end=NOW + 20, opened_at=NOW - 5)),
        (open_(at=NOW - 60), Circuit(
            state=State.HALF_OPEN, consecutive_failures=3, opened_at=NOW - 60,
            next_probe_at=NOW + 20, probe_interval=5,
        )),
        # half-open with a live lease: another holds the probe
        (half_open(lease_end=NOW + 1), None),
        # half-open, the lease over (the prober died): claimed again
        (half_open(lease_end=NOW), half_open(lease_end=NOW + 20)),
    ],
)  # fmt: skip
def test_claiming_the_probe(before: Circuit, after: Circuit | None) -> None:
    assert claim_probe(before, NOW, POLICY) == after


def test_the_breaker_follows_the_config() -> None:
    store = MemoryCircuits()
    assert breaker_for(store, "webhook", WorkerGroupConfig(circuit_failure_threshold=0)) is None
    breaker = breaker_for(
        store, "webhook",
        WorkerGroupConfig(circuit_failure_threshold=4, circuit_probe_base_seconds=2,
                          circuit_probe_max_seconds=60, timeout_seconds=3),
    )  # fmt: skip
    assert breaker is not None
    assert breaker.policy == CircuitPolicy(
        failure_threshold=4, probe_base_seconds=2, probe_max_seconds=60, probe_lease_seconds=13
    )


# -- the Breaker: what a worker group keeps in memory ---------------------------------------


async def test_a_healthy_destination_costs_no_statement(mock_clock: trio.testing.MockClock) -> None:
    store = MemoryCircuits()
    breaker = Breaker(store, "webhook", POLICY)
    for _ in range(10):
        assert (await breaker.admit(DEST)).gate is Gate.GO
        await breaker.reached(DEST, probe=False)
    assert store.calls == []


async def test_two_processes_share_one_circuit_through_the_store(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = MemoryCircuits()
    a = Breaker(store, "webhook", POLICY)
    b = Breaker(store, "webhook", POLICY)
    for breaker in (a, b, a):  # three failures in a row, by either process
        await breaker.unreachable(DEST, probe=False)
    # a opened it and knows; b learns it from its refresh
    assert (await a.admit(DEST)).gate is Gate.DEFER
    assert (await b.admit(DEST)).gate is Gate.GO
    await b.refresh()
    deferred = await b.admit(DEST)
    assert (deferred.gate, deferred.wait) == (Gate.DEFER, 5)
    calls = len(store.calls)
    await trio.sleep(4.5)
    assert (await a.admit(DEST)).wait == pytest.approx(0.5)
    assert len(store.calls) == calls  # deferring costs nothing
    await trio.sleep(0.5)
    # the probe is due: exactly one process gets it; the other defers, briefly
    assert (await a.admit(DEST)).gate is Gate.PROBE
    other = await b.admit(DEST)
    assert (other.gate, other.wait) == (Gate.DEFER, 5)
    # a's probe fails: open again, the next probe 10 s later
    await a.unreachable(DEST, probe=True)
    assert store.circuits[("webhook", DEST)].probe_interval == 10
    assert (await a.admit(DEST)).wait == 10
    await trio.sleep(10)
    await b.refresh()
    assert (await b.admit(DEST)).gate is Gate.PROBE
    await b.reached(DEST, probe=True)
    assert store.circuits[("webhook", DEST)] == CLOSED
    assert (await b.admit(DEST)).gate is Gate.GO
    await a.refresh()
    assert (await a.admit(DEST)).gate is Gate.GO


async def test_a_success_resets_failures_another_process_counted(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = MemoryCircuits()
    a = Breaker(store, "webhook", POLICY)
    b = Breaker(store, "webhook", POLICY)
    await a.unreachable(DEST, probe=False)
    await a.unreachable(DEST, probe=False)
    await b.refresh()  # b knows the destination counts failures
    await b.reached(DEST, probe=False)
    await b.reached(DEST, probe=False)  # the reset is written once
    assert store.calls.count("succeeded") == 1
    await a.unreachable(DEST, probe=False)  # one failure after a success: not three in a row
    assert store.circuits[("webhook", DEST)] == Circuit(consecutive_failures=1)


async def test_a_lost_probe_is_claimed_again_after_its_lease(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = MemoryCircuits()
    a = Breaker(store, "webhook", POLICY)
    b = Breaker(store, "webhook", POLICY)
    for _ in range(3):
        await a.unreachable(DEST, probe=False)
    await trio.sleep(5)
    assert (await a.admit(DEST)).gate is Gate.PROBE  # ... and a's process dies with it
    await b.refresh()
    assert (await b.admit(DEST)).gate is Gate.DEFER
    await trio.sleep(20)  # the lease
    await b.refresh()
    assert (await b.admit(DEST)).gate is Gate.PROBE


async def test_the_refresh_loop_reads_every_second_and_survives_an_outage(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = MemoryCircuits()
    breaker = Breaker(store, "webhook", POLICY)
    async with trio.open_nursery() as nursery:
        await nursery.start(breaker.run)
        await trio.sleep(2.5)
        assert store.calls == ["troubled"] * 3  # at 0, 1 and 2 s
        store.unavailable = True
        await trio.sleep(2)
        store.unavailable = False
        other = Breaker(store, "webhook", POLICY)
        for _ in range(3):
            await other.unreachable(DEST, probe=False)
        await trio.sleep(1)
        assert (await breaker.admit(DEST)).gate is Gate.DEFER
        nursery.cancel_scope.cancel()
