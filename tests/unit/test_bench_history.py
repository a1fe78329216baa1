"""The history benchmark's own arithmetic (bench/history.py): how it spreads a history over
UTC days, when each attempt starts, which days the month's retention takes, and the ratios it
prints."""

from __future__ import annotations

import datetime

import pytest
from bench import history
from bench.history import (
    attempt_offsets,
    day_dates,
    day_of,
    day_window,
    due_suffixes,
    load_query,
    month_summary,
    per_day,
    spread,
    stage_ratio,
    suffix_of,
)
from bench.stage import Stage

from notifier.store import maintenance


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
    text = "-- name: a\nSELECT 1;\n\n-- name: partition_drop\nSELECT f($1)\n;\n"
    assert load_query("partition_drop", text) == "SELECT f($1)\n;"
    # the maintenance role's own statements, which the drop runs
    assert "notifier_partition_drop" in load_query("partition_drop")
    assert "notifier_history_partitions" in load_query("partitions_due")
    assert "notifier_partitions_ensure" in load_query("partitions_ensure")


def test_the_role_timeouts_are_the_maintenance_roles() -> None:
    seconds = maintenance.MAINTENANCE_STATEMENT_TIMEOUT_SECONDS
    assert seconds * 1000 == history.STATEMENT_TIMEOUT_MS
    assert history.PARTITION_LOCK_TIMEOUT_MS == maintenance.PARTITION_LOCK_TIMEOUT_MS


def test_days_are_the_utc_dates_before_today_oldest_first() -> None:
    today = datetime.date(2026, 3, 2)
    assert day_dates(today, 3) == [
        datetime.date(2026, 2, 27), datetime.date(2026, 2, 28), datetime.date(2026, 3, 1)
    ]  # fmt: skip


def test_a_days_events_lie_inside_its_utc_date() -> None:
    day = datetime.date(2026, 12, 6)
    first, span = day_window(day)
    last = first + datetime.timedelta(seconds=span)
    assert first.tzinfo is datetime.UTC
    assert first == datetime.datetime(2026, 12, 6, history.SLACK_HOURS, tzinfo=datetime.UTC)
    assert first.date() == last.date() == day
    assert last < datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)


def test_suffixes_are_the_partitions_names_and_back() -> None:
    day = datetime.date(2026, 1, 9)
    assert suffix_of(day) == "_p20260109"  # notifier_partitions_ensure's '"_p"YYYYMMDD'
    assert day_of(suffix_of(day)) == day
    assert day_of("_legacy") is None


def test_retention_on_a_simulated_day_takes_the_days_more_than_retention_days_before() -> None:
    days = day_dates(datetime.date(2026, 1, 11), 10)  # Jan 1 .. Jan 10
    suffixes = [suffix_of(d) for d in reversed(days)] + ["_legacy"]
    # on Jan 5 with 3 days: Jan 1 goes (Jan 2, 3, 4 and 5 are kept)
    assert due_suffixes(suffixes, datetime.date(2026, 1, 5), 3) == ["_p20260101"]
    assert due_suffixes(suffixes, datetime.date(2026, 1, 4), 3) == []
    # oldest first, the legacy partition never
    assert due_suffixes(suffixes, datetime.date(2026, 1, 8), 3) == [
        "_p20260101", "_p20260102", "_p20260103", "_p20260104"
    ]  # fmt: skip


def test_spread_is_how_far_from_flat() -> None:
    assert spread([100, 100, 100]) == 0.0
    assert spread([100, 110, 105]) == pytest.approx(0.1)
    assert spread([]) == 0.0


def test_month_summary_looks_at_the_days_after_retention_has_begun() -> None:
    series = {
        "day": [1, 2, 3, 4, 5], "size": [10, 20, 30, 30, 31], "wal_build": [5] * 5,
        "wal_retention": [0, 0, 1, 1, 1], "wal_vacuum": [0] * 5, "seconds_retention": [0.5] * 5,
        "days_removed": [[], [], ["a"], ["b"], ["c"]],
    }  # fmt: skip
    out = month_summary({"days": 5, "rows_per_day": 1, "retention_days": 1, "drop": series})
    assert out["drop"]["steady_spread"] == pytest.approx(1 / 30)  # days 3 to 5
    assert out["drop"]["max_size"] == 31
    assert out["drop"]["wal_retention"] == 3
    assert out["drop"]["seconds_retention"] == pytest.approx(2.5)
    assert "delete" not in out


def test_the_builds_attempts_carry_their_deliverys_partition_key() -> None:
    assert "delivery_created_at" in history.DAY_SQL
    assert "dl.created_at\nFROM dl" in history.DAY_SQL
    # the DELETE of before deletes each table's rows itself (no cascade now), by partition key
    for table in ("delivery_attempts", "deliveries", "events"):
        assert f"DELETE FROM {table}" in history.OLD_RETENTION_SQL
    assert "a.delivery_created_at = dl.created_at" in history.OLD_RETENTION_SQL


def test_stage_ratio_is_the_history_over_the_empty() -> None:
    empty = Stage("e", "e", "events", 1000, 1.0, cpu={"server": 1.0, "pg_own": 0.5})
    full = Stage("h", "h", "events", 900, 1.0, cpu={"server": 1.8, "pg_own": 0.9})
    r = stage_ratio(empty, full)
    assert r["rate"] == pytest.approx(0.9)
    assert r["cpu_server"] == pytest.approx(2.0)
    assert r["cpu_pg_own"] == pytest.approx(2.0)
    assert stage_ratio(empty, Stage("x", "x", "events", 900, 1.0))["cpu_server"] is None
