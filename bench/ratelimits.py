"""``python -m bench.ratelimits``: what the shared rate-limit buckets cost.

In a scratch database, through the store (the bridge and the pool, as a worker sees it), one call
at a time, rounds of each kind interleaved so that the machine's drift hits each alike:

- ``ping``: a trivial statement, the floor of any store call;
- ``channel``: a delivery of a channel with ``rate_limit_per_second`` (one window bucket);
- ``telegram``: a Telegram delivery (the chat's bucket, the tenant's share and the bot's,
  together);
- ``ingest``: the per-API-key check (a refilling bucket).

A delivery without a limit makes no such call: its extra cost is zero. Then, on one plain asyncpg
connection, a write of one bucket row in the UNLOGGED table against the same write in a logged
copy (why the table is UNLOGGED), and the checks one hot bucket takes per second with 16
concurrent takers (one row lock, taken in turn).

Printed: the median and p99 of each, in milliseconds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import trio

from notifier.ratelimit import Bucket
from notifier.store import Store, open_store
from notifier.store.base import SCHEMA_PATH

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
ROUNDS, PER_ROUND = 10, 200


def _admin(sql: str, url: str = ADMIN) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def _line(label: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[int(len(ordered) * 0.99)]
    return f"{label:<34} median {statistics.median(ordered) * 1e3:6.3f} ms  p99 {p99 * 1e3:6.3f} ms"


async def _store_calls(store: Store) -> None:
    n = iter(range(10**9))
    kinds: dict[str, Callable[[], Awaitable[object]]] = {
        "ping": lambda: store.ping(5),
        # many tokens, a short period: the bench measures the statement, never a refusal
        "channel": lambda: store.take_tokens([Bucket(f"channel:{next(n) % 100}", 50, 0.001)]),
        "telegram": lambda: store.take_tokens(
            [
                Bucket(f"telegram:1:tenant:{(i := next(n)) % 4}:chat:{i}", 1, 1.0),
                Bucket(f"telegram:1:tenant:{i % 4}", 50, 0.001),
                Bucket("telegram:1", 50, 0.001),
            ]
        ),
        "ingest": lambda: store.admit("ingest:bench", 1, capacity=100, rate=100_000.0),
    }
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    for call in kinds.values():  # warm up
        for _ in range(50):
            await call()
    for _ in range(ROUNDS):
        for kind, call in kinds.items():
            for _ in range(PER_ROUND):
                started = time.perf_counter()
                await call()
                samples[kind].append(time.perf_counter() - started)
    print("through the store (bridge + pool), one call at a time:")
    for kind, got in samples.items():
        print("  " + _line(kind, got))

    count = 0
    hot = [Bucket("hot", 50, 0.001)]

    async def taker(until: float) -> None:
        nonlocal count
        while trio.current_time() < until:
            await store.take_tokens(hot)
            count += 1

    seconds = 3.0
    until = trio.current_time() + seconds
    async with trio.open_nursery() as nursery:
        for _ in range(16):
            nursery.start_soon(taker, until)
    print(f"  one hot bucket, 16 concurrent takers: {count / seconds:,.0f} checks/s")


async def _table_writes(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE TABLE logged_buckets (LIKE rate_buckets INCLUDING ALL);"
            "INSERT INTO rate_buckets (key) VALUES ('w');"
            "INSERT INTO logged_buckets (key) VALUES ('w')"
        )
        writes = {
            "UNLOGGED rate_buckets": "UPDATE rate_buckets SET full_at = now() WHERE key = 'w'",
            "the same, logged": "UPDATE logged_buckets SET full_at = now() WHERE key = 'w'",
        }
        samples: dict[str, list[float]] = {label: [] for label in writes}
        for _ in range(ROUNDS):
            for label, sql in writes.items():
                for _ in range(PER_ROUND):
                    started = time.perf_counter()
                    await conn.execute(sql)
                    samples[label].append(time.perf_counter() - started)
    finally:
        await conn.close()
    print("one bucket row written (its own transaction), plain asyncpg:")
    for label, got in samples.items():
        print("  " + _line(label, got))


def main() -> None:
    name = f"notifier_bench_limits_{uuid.uuid4().hex[:8]}"
    base = ADMIN.rsplit("/", 1)[0]
    _admin(f'CREATE DATABASE "{name}"')
    try:
        _admin(SCHEMA_PATH.read_text(), f"{base}/{name}")

        async def run() -> None:
            async with open_store(f"{base}/{name}", max_size=16) as store:
                await _store_calls(store)

        trio.run(run)
        asyncio.run(_table_writes(f"{base}/{name}"))
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
