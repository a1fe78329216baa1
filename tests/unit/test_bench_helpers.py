"""The benchmark's own arithmetic and parsing (bench/): what its printed figures rest on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from bench.baseline_asyncio import load_queries, loop_factory, loop_family
from bench.baseline_clients import AiohttpClient, close_clients, open_clients, read_bounded
from bench.procs import CpuGroups
from bench.report import ratio_values, ratios
from bench.sink import read_arrivals
from bench.soak import slope_bytes_per_delivery
from bench.stage import Stage, percentile

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
