"""The benchmark's own arithmetic and parsing (bench/): what its printed figures rest on."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.baseline_asyncio import load_queries
from bench.procs import CpuGroups
from bench.sink import read_arrivals
from bench.soak import slope_bytes_per_delivery
from bench.stage import percentile

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
