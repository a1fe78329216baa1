"""The benchmark's own arithmetic and parsing (bench/): what its printed figures rest on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from bench.baseline_asyncio import load_queries, loop_factory, loop_family
from bench.baseline_clients import AiohttpClient, close_clients, open_clients, read_bounded
from bench.procs import BusyTracker, CpuGroups, Unit, Usage, postgres_role
from bench.report import ratio_values, ratios, scaling, scaling_values
from bench.sink import read_arrivals
from bench.soak import slope_bytes_per_delivery
from bench.stage import Stage, Window, percentile

from notifier.store.base import Q


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0


def test_cpu_spent_counts_a_process_born_in_between_from_zero() -> None:
    before = {"pg": {10: 1.0, 11: 5.0}}
    after = {"pg": {10: 1.5, 12: 0.25}}  # 11 exited (its time is lost), 12 is new
    assert CpuGroups.spent(before, after) == {"pg": pytest.approx(0.75)}


def test_rss_slope_leaves_out_the_warm_up() -> None:
    # 40 MiB of warm-up, then exactly 100 bytes per delivery
    samples = [(0.0, 0, 10_000)] + [
        (float(i), d, 50_000 + d * 100 // 1024)
        for i, d in enumerate(range(10_000, 110_000, 10_240))
    ]
    slope = slope_bytes_per_delivery(samples, 10_000)
    assert slope is not None
    assert slope == pytest.approx(100, rel=0.02)
    assert slope_bytes_per_delivery(samples[:2], 10_000) is None


def test_sink_log_lines_parse(tmp_path: Path) -> None:
    log = tmp_path / "sink.log"
    log.write_text(
        "1764885000.123 5f0e-id 1400 v1,abc=\n"
        "1764885000.456 - 1200 -\n"
        "1764885001.000 6a1f-id 1400 v1,def= v1,old=\n"
    )
    arrivals = read_arrivals(log, 1)
    assert [(a.at, a.webhook_id, a.signed) for a in arrivals] == [
        (1764885000.456, "-", False),
        (1764885001.0, "6a1f-id", True),
    ]
    assert len(read_arrivals(log, 0, 1)) == 1


def test_the_asyncio_baseline_runs_notifiers_own_statements() -> None:
    queries = load_queries()
    assert queries["attempt_record_batch"] == Q["attempt_record_batch"]
    assert queries["delivery_states"] == Q["delivery_states"]


class Chunks:
    """An answer's body, chunk by chunk, counting the chunks read."""

    def __init__(self, *parts: bytes) -> None:
        self._parts = list(parts)
        self.read = 0

    def __aiter__(self) -> Chunks:
        return self

    async def __anext__(self) -> bytes:
        if self.read == len(self._parts):
            raise StopAsyncIteration
        self.read += 1
        return self._parts[self.read - 1]


async def test_an_answer_is_read_up_to_the_limit() -> None:
    assert await read_bounded(Chunks(b"ok")) == b"ok"
    assert await read_bounded(Chunks(), 4) == b""
    # the chunk that reaches the limit is kept whole; the ones after it are not read
    long = Chunks(b"abc", b"def", b"ghi")
    assert await read_bounded(long, 4) == b"abcdef"
    assert long.read == 2


def test_the_baseline_runs_on_the_loop_it_is_asked_for() -> None:
    assert loop_factory("asyncio") is None
    factory = loop_factory("uvloop")
    assert factory is not None
    uv = factory()
    try:
        assert loop_family(uv) == "uvloop"
    finally:
        uv.close()
    plain = asyncio.SelectorEventLoop()  # asyncio's default on Linux (no policy in between)
    try:
        assert loop_family(plain) == "asyncio"
    finally:
        plain.close()


def test_the_aiohttp_baseline_shares_one_session_and_closes_it_once() -> None:
    async def main() -> None:
        clients = open_clients("aiohttp", 16)
        assert len(clients) == 16
        assert len({id(c) for c in clients}) == 1
        assert isinstance(clients[0], AiohttpClient)
        await close_clients(clients)
        h11_clients = open_clients("h11", 3)
        assert len({id(c) for c in h11_clients}) == 3
        await close_clients(h11_clients)

    factory = loop_factory("uvloop")
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


def test_notifier_is_compared_with_all_three_delivery_baselines() -> None:
    def drained(key: str, seconds: float, server_cpu: float) -> Stage:
        return Stage(key, key, "deliveries", 1000, seconds,
                     cpu={"server": server_cpu, "pg_own": 0.1, "rabbitmq": 0.1})  # fmt: skip

    stages = [
        drained("delivery", 1.0, 0.6),  # 1,000/s, 0.6 CPU s per 1,000
        drained("asyncio", 1.0, 0.7),
        drained("asyncio_h11", 0.5, 0.3),
        drained("uvloop_aiohttp", 0.25, 0.2),  # 4,000/s, 0.2 CPU s per 1,000
    ]
    values = ratio_values(stages)
    assert set(values) == {"delivery/asyncio", "delivery/asyncio_h11", "delivery/uvloop_aiohttp"}
    assert values["delivery/uvloop_aiohttp"]["rate"] == pytest.approx(0.25)
    assert values["delivery/uvloop_aiohttp"]["cpu_per_item"] == pytest.approx(3.0)
    assert values["delivery/uvloop_aiohttp"]["cpu_per_item_with_pg_and_rabbitmq"] == (
        pytest.approx(0.8 / 0.4)
    )
    assert "delivery (log INFO) vs uvloop + aiohttp    rate  0.25x" in ratios(stages)


def test_busy_fractions_come_from_the_intervals_between_readings() -> None:
    a, b = Unit("server", "notifier 1"), Unit("server", "notifier 2")
    thread = Unit("rabbitmq", "beam.smp thread 1_scheduler/7", thread=True)
    tracker = BusyTracker()
    tracker.add(0.0, {a: Usage(10.0, 1.0), thread: Usage(3.0)}, machine=100.0)
    # b first seen at 0.5 s: it counts from the next interval on
    tracker.add(0.5, {a: Usage(10.5, 1.0), b: Usage(2.0, 0.0), thread: Usage(3.1)}, machine=101.0)
    tracker.add(1.0, {a: Usage(10.75, 1.25), b: Usage(2.25, 0.25), thread: Usage(3.2)},
                machine=101.5)  # fmt: skip
    busy_a = tracker.units[a]
    assert (busy_a.mean, busy_a.peak, busy_a.wait) == pytest.approx((0.75, 1.0, 0.25))
    assert (tracker.units[b].mean, tracker.units[b].wall) == pytest.approx((0.5, 0.5))
    assert tracker.units[thread].wait == 0.0  # no schedstat: no waiting counted
    # a group's peak is its processes together, not its threads; the machine's in cores
    assert tracker.group_peak == pytest.approx({"server": 1.0})
    assert tracker.machine_peak == pytest.approx(2.0)
    summary = tracker.summary(["server"])
    assert summary["intervals"] == 2
    assert [p["name"] for p in summary["processes"]] == ["notifier 1", "notifier 2"]
    # the busiest of a group is the one that asked most of a core: busy and waiting together
    assert [(x["name"], x["thread"]) for x in summary["busiest"]] == [
        ("notifier 1", False),
        ("beam.smp thread 1_scheduler/7", True),
    ]


def test_postgres_processes_are_told_apart_by_their_titles() -> None:
    db = "notifier_bench_1_ab"
    assert postgres_role(f"postgres: 15/main: postgres {db} 127.0.0.1(4711) idle", db) == (
        "own",
        "backend",
    )
    assert postgres_role("postgres: app other_db [local] SELECT", db)[0] == "other"
    assert postgres_role(f"postgres: 15/main: autovacuum worker {db}", db)[0] == "own"
    assert postgres_role("postgres: 15/main: walwriter", db) == ("server", "walwriter")
    assert postgres_role("/usr/lib/postgresql/15/bin/postgres -D /data", db) == (
        "server",
        "postmaster",
    )


def _scaled(key: str, n: int, notifier: float, wait: float, machine: float) -> Stage:
    """A scaling stage of 2,000 items over 4 s: ``notifier`` cores busy in notifier's
    processes (each as busy, ``wait`` waiting), 0.25 in Postgres, ``machine`` cores busy."""
    share = notifier / n
    each = [{"group": "server", "name": f"notifier {i}", "thread": False,
             "mean": share, "peak": share, "wait": wait} for i in range(n)]  # fmt: skip
    pg = {"group": "pg_own", "name": "postgres backend 9", "thread": False,
          "mean": 0.25, "peak": 0.3, "wait": 0.0}  # fmt: skip
    busy = {"busiest": [each[0], pg], "processes": each}
    return Stage(f"{key}_{n}", key, "events", 2000, 4.0,
                 cpu={"server": 4 * notifier, "pg_own": 1.0, "pg_server": 0.0, "rabbitmq": 0.0,
                      "sink": 0.0, "wrk": 0.4, "bench": 0.0},
                 window=Window(4.0, 4 * machine, 2, busy))  # fmt: skip


def test_the_scaling_statement_names_what_saturates_first() -> None:
    stages = [
        _scaled("scale_ingest", 1, 0.95, 0.02, 1.3),  # one process at its core
        _scaled("scale_ingest", 2, 1.2, 0.35, 1.95),  # each asks 0.95 of a core, gets 0.6
        _scaled("scale_delivery", 1, 0.5, 0.0, 0.8),  # nothing saturated, cores idle
        _scaled("scale_delivery", 2, 0.8, 0.1, 1.9),  # no process at a core, the machine full
    ]
    values = scaling_values(stages)
    two = values["scale_ingest"]["processes"]["2"]
    assert two["ours"] == pytest.approx(1.2 + 0.25 + 0.1)
    assert two["machine"] == pytest.approx(1.95)
    assert two["others"] == pytest.approx(1.95 - 1.55)
    assert two["cpu_per_1000"]["server"] == pytest.approx(4 * 1.2 / 2)
    assert two["busiest"]["name"] == "notifier 0"
    ingest_1, ingest_2, delivery_1, delivery_2 = values["ceiling"]["statements"]
    assert ingest_1.startswith(
        "ingest, POST /v1/events with 1 process uses 1.30 of 2 cores (notifier 0.95, "
        "postgres 0.25, wrk 0.10)"
    )
    assert "the first to saturate: notifier 0 at 0.95 of a core" in ingest_1
    assert "the first to saturate: notifier 0, runnable 0.95 of the time" in ingest_2
    assert "nothing saturated and cores left idle" in delivery_1
    assert "the 2 cores are full: the machine is the ceiling, notifier" in delivery_2
    assert "notifier's processes runnable 1.00 cores' worth" in delivery_2
    text = scaling(stages)
    assert "ceiling on 2 cores:" in text
    assert "notifier 1 0.60+0.35 (peak 0.60)" in text
