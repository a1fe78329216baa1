"""The ingest server's connection bookkeeping: what is admitted, what is refused and why."""

from __future__ import annotations

import pytest

from notifier.ingest.limits import ConnectionLimits, auto_max_connections


def test_a_connection_over_the_total_is_refused_whatever_its_address() -> None:
    limits = ConnectionLimits(max_total=2, max_per_address=0)
    assert limits.admit("10.0.0.1") is None
    assert limits.admit("10.0.0.2") is None
    assert limits.admit("10.0.0.3") == "total"
    assert limits.open == 2


def test_a_connection_over_its_address_limit_is_refused_and_others_are_not() -> None:
    limits = ConnectionLimits(max_total=10, max_per_address=2)
    assert [limits.admit("10.0.0.1") for _ in range(3)] == [None, None, "per_address"]
    assert limits.admit("10.0.0.2") is None
    assert (limits.open, limits.open_from("10.0.0.1"), limits.open_from("10.0.0.2")) == (3, 2, 1)


def test_the_total_is_checked_before_the_address() -> None:
    limits = ConnectionLimits(max_total=1, max_per_address=1)
    assert limits.admit("10.0.0.1") is None
    assert limits.admit("10.0.0.1") == "total"


def test_a_refusal_counts_nothing_and_a_release_frees_a_place() -> None:
    limits = ConnectionLimits(max_total=1, max_per_address=1)
    assert limits.admit("10.0.0.1") is None
    assert limits.admit("10.0.0.2") == "total"
    assert limits.open_from("10.0.0.2") == 0
    limits.release("10.0.0.1")
    assert (limits.open, limits.open_from("10.0.0.1")) == (0, 0)
    assert limits.admit("10.0.0.2") is None


def test_zero_per_address_is_no_limit_per_address() -> None:
    limits = ConnectionLimits(max_total=1000, max_per_address=0)
    assert all(limits.admit("10.0.0.1") is None for _ in range(1000))
    assert limits.admit("10.0.0.1") == "total"


def test_releasing_what_was_never_admitted_is_an_error() -> None:
    limits = ConnectionLimits(max_total=1, max_per_address=0)
    with pytest.raises(ValueError, match="no connection"):
        limits.release("10.0.0.1")
    assert limits.open == 0


@pytest.mark.parametrize(
    ("soft", "limit"),
    [
        (1024, 768),  # the usual default soft limit
        (524_288, 393_216),  # a raised one
        (1, 1),  # never zero: one connection at least
    ],
)
def test_auto_takes_three_quarters_of_the_descriptor_limit(soft: int, limit: int) -> None:
    assert auto_max_connections(soft) == limit
