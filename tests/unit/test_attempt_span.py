"""The span of creation times the workers' statements read the history's partitions by."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from notifier.store.attempts import ANY_TIME, _span

T = datetime(2026, 12, 6, 12, tzinfo=UTC)


def test_the_span_runs_from_the_first_creation_time_to_the_last() -> None:
    assert _span([T, T - timedelta(days=2), T + timedelta(seconds=1)]) == (
        T - timedelta(days=2),
        T + timedelta(seconds=1),
    )
    assert _span([T]) == (T, T)


def test_one_unknown_creation_time_reads_every_partition() -> None:
    assert _span([T, None]) == ANY_TIME
    assert _span([]) == ANY_TIME
    assert ANY_TIME == (None, None)
