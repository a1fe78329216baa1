"""The history benchmark's own arithmetic (bench/history.py): how it spreads a history over
days, when each attempt starts, and the ratios it prints."""

from __future__ import annotations

import pytest
from bench.history import attempt_offsets, load_query, per_day, stage_ratio
from bench.stage import Stage


def test_per_day_spreads_every_row_oldest_days_taking_the_remainder() -> None:
    assert per_day(10, 3) == [4, 3, 3]
    assert sum(per_day(10_000_000, 30)) == 10_000_000
    assert per_day(30, 30) == [1] * 30


def test_per_day_refuses_fewer_rows_than_days() -> None:
    with pytest.raises(ValueError, match="cannot fill"):
        per_day(5, 30)
    with pytest.raises(ValueError, match="cannot fill"):
        per_day(5, 0)


def test_attempts_start_after_the_retry_delays_in_turn() -> None:
    assert attempt_offsets((1, 5, 15), 1) == [0.0]
    assert attempt_offsets((1, 5, 15), 3) == [0.0, 1.0, 6.0]
    # past the last delay, the last one again
    assert attempt_offsets((1, 5), 4) == [0.0, 1.0, 6.0, 11.0]


def test_load_query_takes_the_named_block_alone() -> None:
    text = "-- name: a\nSELECT 1;\n\n-- name: retention\nDELETE FROM x\nRETURNING id;\n"
    assert load_query("retention", text) == "DELETE FROM x\nRETURNING id;"
    assert "notifier_partition_drop" in load_query("partition_drop")


def test_stage_ratio_is_the_history_over_the_empty() -> None:
    empty = Stage("e", "e", "events", 1000, 1.0, cpu={"server": 1.0, "pg_own": 0.5})
    full = Stage("h", "h", "events", 900, 1.0, cpu={"server": 1.8, "pg_own": 0.9})
    r = stage_ratio(empty, full)
    assert r["rate"] == pytest.approx(0.9)
    assert r["cpu_server"] == pytest.approx(2.0)
    assert r["cpu_pg_own"] == pytest.approx(2.0)
    assert stage_ratio(empty, Stage("x", "x", "events", 900, 1.0))["cpu_server"] is None
