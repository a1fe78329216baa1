"""``python -m bench.pgbouncer``: what ``database.pooler = "pgbouncer"`` costs the store.

The store's hot path, one call at a time (latency-bound, as a single request or delivery sees
it): an ingest of one event (one delivery), then the worker's read (``delivery_states``) and
settle (``record_attempts``) of that delivery. Three configurations, in the same run, their
rounds interleaved so that the machine's drift hits each alike:

- ``direct``: Postgres itself, the default store (statement cache on, statement_timeout a
  startup parameter);
- ``direct, pooler mode``: Postgres itself, ``pooler="pgbouncer"`` (no statement cache,
  ``SET LOCAL statement_timeout`` with every transaction, a statement alone in a transaction
  of its own) — the store's own cost of the mode;
- ``pgbouncer``: the same through a PgBouncer in transaction pooling mode (tests/pgbouncer.py)
  — the cost in production, PgBouncer's hop included.

Plus the cache alone: one hot-path statement (``delivery_states``) on a plain asyncpg
connection, statement cache on vs off.

Printed per configuration: calls/s and the client's CPU (this process: trio, the bridge and
asyncpg) per call, PgBouncer's CPU per call, and the ratio to ``direct``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg
import msgspec
import trio
from tests.pgbouncer import pgbouncer_instance

from bench.procs import cpu_seconds
from notifier.bridge import aio, open_bridge
from notifier.store import Store, open_store
from notifier.store.base import Q
from notifier.store.pool import Pooler
from notifier.store.rows import AttemptRecord, NewEvent

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass
class Totals:
    calls: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    bouncer_cpu: float = 0.0
    per_stage: dict[str, tuple[int, float]] = field(default_factory=dict)

    def add(self, stage: str, calls: int, wall: float, cpu: float, bouncer_cpu: float) -> None:
        self.calls += calls
        self.wall += wall
        self.cpu += cpu
        self.bouncer_cpu += bouncer_cpu
        done, took = self.per_stage.get(stage, (0, 0.0))
        self.per_stage[stage] = (done + calls, took + wall)


async def _admin(sql: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(ADMIN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    await aio(run)


async def _timed(
    totals: Totals,
    stage: str,
    calls: int,
    bouncer_pid: int | None,
    work: Callable[[], Awaitable[None]],
) -> None:
    bouncer0 = cpu_seconds(bouncer_pid) if bouncer_pid else 0.0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await work()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    bouncer = (cpu_seconds(bouncer_pid) - bouncer0) if bouncer_pid else 0.0
    totals.add(stage, calls, wall, cpu, bouncer)


async def _round(
    store: Store, tenant: uuid.UUID, n: int, totals: Totals | None, bouncer_pid: int | None
) -> None:
    ids: list[tuple[uuid.UUID, datetime]] = []

    async def ingest() -> None:
        for _ in range(n):
            event = NewEvent(
                id=uuid.uuid4(), type="bench.pgbouncer", recipient=None,
                payload=msgspec.Raw(b'{"n": 1}'), idempotency_key=None, request_hash="",
                channel_ids=None,
            )  # fmt: skip
            (result,) = await store.ingest(tenant, [event], {"webhook": 5})
            ids.append((result.event.deliveries[0].id, result.event.created_at))

    async def read_and_settle() -> None:
        for delivery_id, created_at in ids:
            await store.delivery_states([(delivery_id, created_at)])
            now = datetime.now(UTC)
            await store.record_attempts([
                AttemptRecord(
                    delivery_id=delivery_id, attempt=1, status="DELIVERED",
                    outcome="delivered", started_at=now, duration_ms=1, status_code=200,
                    created_at=created_at,
                )
            ])  # fmt: skip

    scratch = Totals()
    await _timed(totals or scratch, "ingest", n, bouncer_pid, ingest)
    await _timed(totals or scratch, "read+settle", 2 * n, bouncer_pid, read_and_settle)


async def _statement_alone(
    connections: dict[str, tuple[str, int]], ids: list[tuple[uuid.UUID, datetime]], rounds: int
) -> dict[str, float]:
    """Asyncio-flavoured. Median seconds per ``delivery_states`` statement on plain asyncpg
    connections (name -> (url, statement cache size)), in chunks of 20 interleaved across the
    connections, so that the machine's drift hits each alike."""
    conns = {
        name: await asyncpg.connect(url, statement_cache_size=cache)
        for name, (url, cache) in connections.items()
    }
    chunks: dict[str, list[float]] = {name: [] for name in conns}
    try:
        for _ in range(rounds):
            for start in range(0, len(ids), 20):
                for name, conn in conns.items():
                    began = time.perf_counter()
                    for delivery_id, at in ids[start : start + 20]:
                        await conn.fetch(Q["delivery_states"], [delivery_id], at, at)
                    took = time.perf_counter() - began
                    chunks[name].append(took / len(ids[start : start + 20]))
    finally:
        for conn in conns.values():
            await conn.close()
    return {name: statistics.median(values) for name, values in chunks.items()}


async def main(calls: int, rounds: int) -> None:
    database = f"notifier_bench_pgb_{uuid.uuid4().hex[:8]}"
    direct = f"postgresql://postgres@127.0.0.1:5432/{database}"
    async with open_bridge():
        await _admin(f'CREATE DATABASE "{database}"')
        try:
            async with open_store(direct, max_size=2) as setup:
                await setup.migrate()
            with pgbouncer_instance(pool_size=2) as bouncer:
                await bouncer.start()
                assert bouncer.process is not None
                await _compare(direct, bouncer.url(database), bouncer.process.pid, calls, rounds)
        finally:
            await _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


async def _compare(direct: str, through: str, bouncer_pid: int, calls: int, rounds: int) -> None:
    configs: dict[str, tuple[str, Pooler, int | None]] = {
        "direct": (direct, "none", None),
        "direct, pooler mode": (direct, "pgbouncer", None),
        "pgbouncer": (through, "pgbouncer", bouncer_pid),
    }
    totals = {name: Totals() for name in configs}
    async with AsyncExitStack() as stack:
        stores = {
            name: await stack.enter_async_context(open_store(url, max_size=2, pooler=pooler))
            for name, (url, pooler, _) in configs.items()
        }
        setup = stores["direct"]
        tenant = await setup.create_tenant(f"bench-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex)
        await setup.create_channel(
            tenant, type="webhook", name="bench", config={"url": "http://127.0.0.1:9/"},
            recipient=None, event_types=["*"], enabled=True, max_attempts=None,
        )  # fmt: skip
        for store in stores.values():  # warm-up: connections, caches
            await _round(store, tenant, 50, None, None)
        for _ in range(rounds):
            for name, store in stores.items():
                await _round(store, tenant, calls, totals[name], configs[name][2])
    _report(totals)
    ids = [
        (r["id"], r["created_at"])
        for r in await aio(_fetch, direct, "SELECT id, created_at FROM deliveries LIMIT 500")
    ]
    connections = {
        "direct, cache on": (direct, 100),
        "direct, cache off": (direct, 0),
        "pgbouncer, cache off": (through, 0),  # with a cache it breaks there
    }
    alone = await aio(_statement_alone, connections, ids, rounds)
    print("\none delivery_states statement on a plain asyncpg connection (median):")
    for name, seconds in alone.items():
        ratio = seconds / alone["direct, cache on"]
        print(f"  {name:<22}{1e6 * seconds:>7.0f} µs  x{ratio:.2f}")


async def _fetch(url: str, query: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(query))
    finally:
        await conn.close()


def _report(totals: dict[str, Totals]) -> None:
    base = totals["direct"]
    print(f"{'configuration':<22}{'calls/s':>9}{'ingest/s':>10}{'r+s/s':>8}"
          f"{'CPU ms/call':>13}{'PgB CPU ms':>12}{'time x':>8}{'CPU x':>7}")  # fmt: skip
    for name, t in totals.items():
        ingest_calls, ingest_wall = t.per_stage["ingest"]
        rs_calls, rs_wall = t.per_stage["read+settle"]
        print(
            f"{name:<22}{t.calls / t.wall:>9.0f}{ingest_calls / ingest_wall:>10.0f}"
            f"{rs_calls / rs_wall:>8.0f}{1000 * t.cpu / t.calls:>13.3f}"
            f"{1000 * t.bouncer_cpu / t.calls:>12.3f}"
            f"{(t.wall / t.calls) / (base.wall / base.calls):>8.2f}"
            f"{(t.cpu / t.calls) / (base.cpu / base.calls):>7.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="events per round (3 calls each)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trio.run(main, args.calls, args.rounds)
