"""The destinations' circuits in a migrated database: the SQL keeps the rules of
``notifier.worker.circuit`` on Postgres's clock (time is moved by moving the row's times back);
exactly one of concurrent claims gets a due probe; the API, ``/metrics`` and maintenance read
what they should."""

from __future__ import annotations

import pytest
import trio

from notifier.store import open_store
from notifier.store.rows import DestinationCircuit
from notifier.worker.circuit import CircuitPolicy, CircuitRow, State
from tests.integration.conftest import sql

POLICY = CircuitPolicy(
    failure_threshold=3, probe_base_seconds=5, probe_max_seconds=12, probe_lease_seconds=20
)
DEST = "https://example.com:443"


async def probe_due(database_url: str) -> None:
    """As if the wait for the probe (or the probe's lease) were over."""
    await sql(database_url, "UPDATE circuits SET next_probe_at = now() - interval '1 ms'")


def shape(row: CircuitRow | None) -> tuple[State, int, float | None] | None:
    """The row with its probe time rounded (Postgres's clock moves on between statements)."""
    if row is None:
        return None
    probe_in = None if row.probe_in_seconds is None else round(row.probe_in_seconds)
    return (row.state, row.consecutive_failures, probe_in)


async def test_the_sql_opens_probes_backs_off_and_closes_as_the_rules_say(
    database_url: str,
) -> None:
    async with open_store(database_url) as store:

        async def fail(probe: bool = False) -> tuple[State, int, float | None] | None:
            return shape(await store.circuit_failed("webhook", DEST, probe=probe, policy=POLICY))

        assert await store.troubled_circuits("webhook") == []
        assert await fail() == (State.CLOSED, 1, None)
        assert await fail() == (State.CLOSED, 2, None)
        assert await fail() == (State.OPEN, 3, 5)  # the threshold: open, probe in 5 s
        assert await fail() == (State.OPEN, 4, 5)  # counted, nothing else changes
        # not due: not claimed, the circuit as it is
        claimed, row = await store.circuit_claim_probe("webhook", DEST, policy=POLICY)
        assert (claimed, shape(row)) == (False, (State.OPEN, 4, 5))
        await probe_due(database_url)
        # due: of claims at once, exactly one gets it; the lease is 20 s
        results: list[tuple[bool, CircuitRow | None]] = []

        async def claim() -> None:
            results.append(await store.circuit_claim_probe("webhook", DEST, policy=POLICY))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(claim)
        winners = [shape(r) for c, r in results if c]
        assert winners == [(State.HALF_OPEN, 4, 20)]
        # a failure that is not the probe does not end it
        assert await fail() == (State.HALF_OPEN, 5, 20)
        # the probe fails: open again, the interval doubled ...
        assert await fail(probe=True) == (State.OPEN, 6, 10)
        await probe_due(database_url)
        assert (await store.circuit_claim_probe("webhook", DEST, policy=POLICY))[0]
        # ... up to the max
        assert await fail(probe=True) == (State.OPEN, 7, 12)
        [troubled] = await store.troubled_circuits("webhook")
        assert shape(troubled) == (State.OPEN, 7, 12)
        assert await store.troubled_circuits("email") == []
        # a lost probe (its process died) is claimed again once its lease is over
        await probe_due(database_url)
        assert (await store.circuit_claim_probe("webhook", DEST, policy=POLICY))[0]
        await probe_due(database_url)
        assert (await store.circuit_claim_probe("webhook", DEST, policy=POLICY))[0]
        # an answer closes it
        await store.circuit_succeeded("webhook", DEST)
        assert await store.troubled_circuits("webhook") == []
        [row_] = await sql(database_url, "SELECT * FROM circuits")
        assert (row_["state"], row_["consecutive_failures"], row_["opened_at"]) == (
            "closed", 0, None,
        )  # fmt: skip
        # nothing to claim on a closed circuit, nor on one never seen
        assert (await store.circuit_claim_probe("webhook", DEST, policy=POLICY))[0] is False
        assert await store.circuit_claim_probe("webhook", "x", policy=POLICY) == (False, None)


async def test_a_threshold_of_one_opens_at_the_first_failure(database_url: str) -> None:
    one = CircuitPolicy(
        failure_threshold=1, probe_base_seconds=2, probe_max_seconds=4, probe_lease_seconds=9
    )
    async with open_store(database_url) as store:
        row = await store.circuit_failed("email", "channel:x", probe=False, policy=one)
    assert shape(row) == (State.OPEN, 1, 2)


async def test_the_api_metrics_and_maintenance_read_the_circuits(database_url: str) -> None:
    async with open_store(database_url) as store:
        for _ in range(3):
            await store.circuit_failed("webhook", DEST, probe=False, policy=POLICY)
        await store.circuit_failed("webhook", "http://other:80", probe=False, policy=POLICY)
        await store.circuit_failed("webhook", "http://gone:80", probe=False, policy=POLICY)
        await store.circuit_succeeded("webhook", "http://gone:80")

        found = await store.circuits_of([("webhook", DEST), ("telegram", DEST), ("webhook", "n")])
        assert set(found) == {("webhook", DEST)}
        c = found[("webhook", DEST)]
        assert (c.state, c.consecutive_failures) == ("open", 3)
        assert c.opened_at is not None
        assert c.next_probe_at is not None
        assert 4 < (c.next_probe_at - c.opened_at).total_seconds() <= 5
        assert await store.circuits_of([]) == {}

        snapshot = await store.metrics_snapshot()
        assert sorted(snapshot.circuits) == [
            ("webhook", "http://gone:80", "closed"),  # closed a moment ago: still shown, as 0
            ("webhook", "http://other:80", "closed"),
            ("webhook", DEST, "open"),
        ]

        # closed and unchanged for an hour: deleted; the others stay
        assert await store.clean_circuits(limit=10) == 0
        await sql(database_url, "UPDATE circuits SET changed_at = now() - interval '61 minutes'")
        assert await store.clean_circuits(limit=10) == 2
        rows = await sql(database_url, "SELECT destination FROM circuits")
        assert [r["destination"] for r in rows] == [DEST]
        assert (await store.metrics_snapshot()).circuits == (("webhook", DEST, "open"),)


@pytest.mark.parametrize("state", ["open", "half_open"])
async def test_the_view_of_a_circuit_is_what_the_api_shows(database_url: str, state: str) -> None:
    async with open_store(database_url) as store:
        for _ in range(3):
            await store.circuit_failed("webhook", DEST, probe=False, policy=POLICY)
        if state == "half_open":
            await probe_due(database_url)
            await store.circuit_claim_probe("webhook", DEST, policy=POLICY)
        [(key, view)] = (await store.circuits_of([("webhook", DEST)])).items()
    assert key == ("webhook", DEST)
    assert isinstance(view, DestinationCircuit)
    assert view.state == state
