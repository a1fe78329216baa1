"""The per-attempt decisions (docs/architecture.md §4, §5) as tables: backoff, retry_after, tiers,
outcomes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from notifier.broker.base import Settle
from notifier.broker.topology import tier_for
from notifier.config import parse_config
from notifier.worker.decide import (
    Decision,
    Result,
    RetryPolicy,
    backoff_seconds,
    decide,
    decide_rate_limited,
    retry_delay,
)

DEFAULT = RetryPolicy()  # base 30 s, cap 1800 s, the default tiers
TIERS = (1, 5, 15, 30, 60, 120, 240, 480, 960, 1800)
NOW = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)


def test_the_policy_is_the_retry_section_with_its_rules() -> None:
    """The worker decides with ``[retry]`` itself: a policy whose tiers are out of order (which
    ``tier_for``'s bisection cannot use) is refused however it is made."""
    config = parse_config({"retry": {"base_seconds": 2}}, env={})
    assert isinstance(config.retry, RetryPolicy)
    assert backoff_seconds(2, config.retry) == 4
    with pytest.raises(ValueError, match="strictly increasing"):
        RetryPolicy(tiers_seconds=(30, 5))


def test_the_default_policy_is_the_one_in_the_design() -> None:
    assert (DEFAULT.base_seconds, DEFAULT.max_seconds) == (30, 1800)
    assert tuple(DEFAULT.tiers_seconds) == TIERS


# -- backoff per attempt ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "seconds"),
    [
        (1, 30),  # base · 2^0
        (2, 60),
        (3, 120),
        (4, 240),
        (5, 480),
        (6, 960),
        (7, 1800),  # 1920 capped at 30 min
        (8, 1800),
        (100, 1800),  # far past the cap
        (10_000, 1800),  # no overflow for an absurd attempt
    ],
)
def test_backoff_doubles_from_the_base_and_is_capped(attempt: int, seconds: float) -> None:
    assert backoff_seconds(attempt, DEFAULT) == seconds


@pytest.mark.parametrize(
    ("policy", "attempt", "seconds"),
    [
        (RetryPolicy(base_seconds=1, max_seconds=30), 1, 1),
        (RetryPolicy(base_seconds=1, max_seconds=30), 2, 2),
        (RetryPolicy(base_seconds=1, max_seconds=30), 5, 16),
        (RetryPolicy(base_seconds=1, max_seconds=30), 6, 30),  # 32 capped
        (RetryPolicy(base_seconds=10, max_seconds=1800), 1, 10),
        (RetryPolicy(base_seconds=10, max_seconds=1800), 4, 80),
        (RetryPolicy(base_seconds=0.5, max_seconds=3), 3, 2),
        (RetryPolicy(base_seconds=0.5, max_seconds=3), 4, 3),  # 4 capped
    ],
)
def test_backoff_with_a_custom_base_and_cap(
    policy: RetryPolicy, attempt: int, seconds: float
) -> None:
    assert backoff_seconds(attempt, policy) == seconds


# -- retry_after vs backoff ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "retry_after", "seconds"),
    [
        (1, None, 30),  # no retry_after: the backoff
        (3, None, 120),
        (1, 45, 45),  # longer than the backoff: it wins
        (3, 600, 600),
        (7, 3600, 3600),  # longer than the cap still wins (the tiers bound it)
        (1, 10, 30),  # shorter: ignored
        (3, 0, 120),  # zero: ignored
        (2, 60, 60),  # equal: the same either way
    ],
)
def test_retry_after_wins_only_when_longer(
    attempt: int, retry_after: float | None, seconds: float
) -> None:
    assert retry_delay(attempt, DEFAULT, retry_after) == seconds


# -- tier rounding ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "tier"),
    [
        (1, 1),  # exactly a tier
        (5, 5),
        (30, 30),
        (1800, 1800),  # exactly the last tier
        (1.5, 5),  # between tiers: rounded up
        (5.001, 15),
        (31, 60),
        (961, 1800),
        (0, 1),  # below the first tier: the first tier
        (0.2, 1),
        (1801, 1800),  # above the last tier: the last tier
        (86_400, 1800),
    ],
)
def test_a_delay_is_rounded_up_to_a_tier(delay: float, tier: int) -> None:
    assert tier_for(delay, TIERS) == tier


@pytest.mark.parametrize(
    ("delay", "tier"),
    [(0, 2), (2, 2), (3, 10), (10, 10), (11, 10)],
)
def test_tier_rounding_with_custom_tiers(delay: float, tier: int) -> None:
    assert tier_for(delay, (2, 10)) == tier


# -- the outcome of one attempt -----------------------------------------------------------------

DELIVERED = Decision(status="DELIVERED", outcome="delivered", settle=Settle.ACK)
DEAD = Decision(status="DEAD", outcome="dead", settle=Settle.REJECT)
PANIC = Decision(status="DEAD", outcome="panic", settle=Settle.REJECT)


def retrying(tier: int, next_attempt: int) -> Decision:
    return Decision(
        status="RETRYING",
        outcome="retry",
        settle=Settle.ACK,
        retry_tier=tier,
        retry_attempt=next_attempt,
        next_attempt_at=NOW + timedelta(seconds=tier),
    )


@pytest.mark.parametrize(
    ("result", "attempt", "max_attempts", "retry_after", "expected"),
    [
        (Result.DELIVERED, 1, 5, None, DELIVERED),  # first try
        (Result.DELIVERED, 5, 5, None, DELIVERED),  # last try
        (Result.DELIVERED, 9, 5, None, DELIVERED),  # past the budget still counts
        (Result.RETRIABLE, 1, 5, None, retrying(30, 2)),  # backoff 30 → tier 30
        (Result.RETRIABLE, 2, 5, None, retrying(60, 3)),  # 60
        (Result.RETRIABLE, 3, 5, None, retrying(120, 4)),  # 120
        (Result.RETRIABLE, 4, 5, None, retrying(240, 5)),  # 240, the last attempt next
        (Result.RETRIABLE, 7, 10, None, retrying(1800, 8)),  # capped backoff
        (Result.RETRIABLE, 1, 5, 45, retrying(60, 2)),  # retry_after 45 > 30 → tier 60
        (Result.RETRIABLE, 1, 5, 10, retrying(30, 2)),  # retry_after shorter: ignored
        (Result.RETRIABLE, 1, 5, 7200, retrying(1800, 2)),  # beyond the last tier
        (Result.RETRIABLE, 5, 5, None, DEAD),  # attempts used up
        (Result.RETRIABLE, 5, 5, 10, DEAD),  # retry_after does not buy another attempt
        (Result.RETRIABLE, 6, 5, None, DEAD),  # past the budget
        (Result.RETRIABLE, 1, 1, None, DEAD),  # a budget of one attempt
        (Result.PERMANENT, 1, 5, None, DEAD),  # never worth another try
        (Result.PERMANENT, 5, 5, None, DEAD),
        (Result.PANIC, 1, 5, None, PANIC),  # a crash: its own outcome, to the DLQ
        (Result.PANIC, 5, 5, None, PANIC),
    ],
)
def test_decide(
    result: Result,
    attempt: int,
    max_attempts: int,
    retry_after: float | None,
    expected: Decision,
) -> None:
    got = decide(
        result,
        attempt=attempt,
        max_attempts=max_attempts,
        policy=DEFAULT,
        now=NOW,
        retry_after=retry_after,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("attempt", "tier"),
    [
        (1, 1),  # backoff 1
        (2, 5),  # 2 → 5
        (3, 5),  # 4 → 5
        (4, 15),  # 8 → 15
        (5, 30),  # 16 → 30
        (6, 30),  # 32 capped at 30
    ],
)
def test_decide_with_a_custom_policy(attempt: int, tier: int) -> None:
    policy = RetryPolicy(base_seconds=1, max_seconds=30, tiers_seconds=(1, 5, 15, 30))
    got = decide(Result.RETRIABLE, attempt=attempt, max_attempts=10, policy=policy, now=NOW)
    assert got == retrying(tier, attempt + 1)


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "replayed_at", "expected"),
    [
        # replayed as entry 6 after 5 attempts, with a budget of 5: attempts 7 to 11
        (7, 11, 6, retrying(30, 8)),  # the first after the replay: the base backoff again
        (8, 11, 6, retrying(60, 9)),  # then doubling from there
        (10, 11, 6, retrying(240, 11)),  # the last attempt next
        (11, 11, 6, DEAD),  # the replay's budget used up
        (2, 5, 0, retrying(60, 3)),  # never replayed: counted from the first attempt
        (1, 5, 3, retrying(30, 2)),  # whatever the numbers, never under the base
    ],
)
def test_after_a_replay_the_backoff_starts_again_from_the_base(
    attempt: int, max_attempts: int, replayed_at: int, expected: Decision
) -> None:
    got = decide(
        Result.RETRIABLE, attempt=attempt, max_attempts=max_attempts, policy=DEFAULT, now=NOW,
        replayed_at=replayed_at,
    )  # fmt: skip
    assert got == expected


def test_next_attempt_at_is_the_tier_not_the_backoff() -> None:
    policy = RetryPolicy(base_seconds=20, max_seconds=1800)  # backoff 20 s → the 30 s tier
    got = decide(Result.RETRIABLE, attempt=1, max_attempts=5, policy=policy, now=NOW)
    assert (got.retry_tier, got.next_attempt_at) == (30, NOW + timedelta(seconds=30))


# -- rate limited -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait", "tier"),
    [
        (0.01, 1),
        (1, 1),
        (3, 5),
        (5, 5),
        (100, 120),
        (1800, 1800),
        (5000, 1800),  # longer than the last tier: the last tier
    ],
)
def test_decide_rate_limited(wait: float, tier: int) -> None:
    assert decide_rate_limited(wait, policy=DEFAULT, now=NOW) == Decision(
        status=None,  # the delivery's status and attempt stay as they are
        outcome="rate_limited",
        settle=Settle.ACK,
        retry_tier=tier,
        retry_attempt=None,  # the copy asks for the same attempt
        next_attempt_at=NOW + timedelta(seconds=tier),
    )
