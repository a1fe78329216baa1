"""The maintenance loop over an in-memory store, on trio's MockClock: a pass every interval,
batches until a short one, partitions made ahead, days dropped or kept, retention off at 0, a
prompt stop."""

from __future__ import annotations

import uuid

import trio
import trio.testing

from notifier.config import MaintenanceConfig
from notifier.lifecycle import Stop
from notifier.maintenance import MAX_BATCHES_PER_PASS, maintenance_pass, run_maintenance


class FakeStore:
    """Answers each call from a script of batch sizes and records when it was called."""

    def __init__(
        self,
        stuck: list[int] | None = None,
        expired: list[int] | None = None,
        days: tuple[list[str], list[str]] = ([], []),
        idle_buckets: list[int] | None = None,
        closed_circuits: list[int] | None = None,
    ) -> None:
        self.stuck = list(stuck or [])
        self.expired = list(expired or [])
        self.days = days
        self.idle_buckets = list(idle_buckets or [])
        self.closed_circuits = list(closed_circuits or [])
        self.calls: list[tuple[str, float]] = []

    async def reconcile(self, *, stuck_after_seconds: float, limit: int) -> list[uuid.UUID]:
        await trio.lowlevel.checkpoint()
        self.calls.append(("reconcile", trio.current_time()))
        n = self.stuck.pop(0) if self.stuck else 0
        return [uuid.uuid4() for _ in range(min(n, limit))]

    async def ensure_partitions(self, *, days_ahead: int) -> int:
        await trio.lowlevel.checkpoint()
        self.calls.append(("partitions", trio.current_time()))
        return 3 * (days_ahead + 1)  # as on a database with none of them yet

    async def drop_expired_days(self, *, retention_days: int) -> tuple[list[str], list[str]]:
        await trio.lowlevel.checkpoint()
        self.calls.append(("retention", trio.current_time()))
        return self.days

    async def clean_event_keys(self, *, retention_days: int, limit: int) -> int:
        await trio.lowlevel.checkpoint()
        self.calls.append(("keys", trio.current_time()))
        return min(self.expired.pop(0) if self.expired else 0, limit)

    async def clean_outbox(self, *, limit: int, refused_after: int) -> tuple[int, int]:
        await trio.lowlevel.checkpoint()
        self.calls.append(("outbox", trio.current_time()))
        return 0, 0

    async def clean_rate_buckets(self, *, limit: int) -> int:
        await trio.lowlevel.checkpoint()
        self.calls.append(("buckets", trio.current_time()))
        return min(self.idle_buckets.pop(0) if self.idle_buckets else 0, limit)

    async def clean_circuits(self, *, limit: int) -> int:
        await trio.lowlevel.checkpoint()
        self.calls.append(("circuits", trio.current_time()))
        return min(self.closed_circuits.pop(0) if self.closed_circuits else 0, limit)

    async def clean_console(self, *, limit: int) -> int:
        await trio.lowlevel.checkpoint()
        self.calls.append(("console", trio.current_time()))
        return 0


def config(**fields: object) -> MaintenanceConfig:
    return MaintenanceConfig(**{"interval_seconds": 30.0, "batch_size": 10, **fields})  # type: ignore[arg-type]


async def test_a_pass_takes_batches_until_a_short_one() -> None:
    store = FakeStore(
        stuck=[10, 10, 3], expired=[10, 4], idle_buckets=[10, 10, 10, 1], closed_circuits=[10, 2],
        days=(["_p20261101", "_p20261102"], ["_p20261103"]),
    )  # fmt: skip
    result = await maintenance_pass(config(), store)
    assert (result.reenqueued, result.keys_expired, result.rate_buckets_cleaned) == (23, 14, 31)
    assert (result.days_dropped, result.days_kept) == (2, 1)
    assert result.partitions_made == 3 * 8  # today and 7 days ahead, of each of three tables
    assert result.circuits_cleaned == 12
    kinds = [kind for kind, _ in store.calls]
    assert kinds == (
        ["reconcile"] * 3 + ["partitions", "retention"] + ["keys"] * 2 + ["outbox"]
        + ["buckets"] * 4 + ["circuits"] * 2 + ["console"]
    )  # fmt: skip


async def test_a_pass_is_bounded_even_when_every_batch_is_full() -> None:
    store = FakeStore(stuck=[10] * 100)
    result = await maintenance_pass(config(retention_days=0), store)
    assert result.reenqueued == 10 * MAX_BATCHES_PER_PASS
    kinds = [kind for kind, _ in store.calls]
    assert "retention" not in kinds  # retention_days = 0: off
    assert "keys" not in kinds
    assert "partitions" in kinds  # made ahead all the same


async def test_passes_run_every_interval_and_a_stop_ends_the_wait(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    stop = Stop()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_maintenance, config(), store, stop)
        await trio.sleep(95)
        stop.set()
    starts = [at for kind, at in store.calls if kind == "reconcile"]
    assert starts == [0.0, 30.0, 60.0, 90.0]
    assert trio.current_time() == 95.0  # the stop did not wait for the next pass
