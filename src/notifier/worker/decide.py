"""What happens to a delivery after one attempt: pure decisions, tested as tables.

This is the one place where the per-message rules of docs/architecture.md §5 live. The handler turns
an attempt's result into a ``Decision`` here and carries it out; it decides nothing itself.
"""

from __future__ import annotations

import enum
from datetime import datetime, timedelta

import msgspec

from notifier.broker.topology import tier_for
from notifier.config import RetryConfig
from notifier.settle import Settle

# The ``[retry]`` section is the policy: one struct, read from the config, no copy of its fields.
RetryPolicy = RetryConfig


class Result(enum.Enum):
    DELIVERED = "delivered"
    RETRIABLE = "retriable"
    PERMANENT = "permanent"
    PANIC = "panic"  # the handler or adapter raised something that is not a DeliveryError


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """``status`` None leaves the delivery's status (and attempt) as they are."""

    status: str | None  # the delivery's new status
    outcome: str  # the attempt row's outcome
    settle: Settle  # what happens to the original message once the rest is done
    retry_tier: int | None = None  # publish a copy to this delay tier (seconds) first
    retry_attempt: int | None = None  # ... asking for this attempt
    next_attempt_at: datetime | None = None


def backoff_seconds(attempt: int, policy: RetryPolicy) -> float:
    """The wait after failed attempt ``attempt`` (1-based): ``base · 2^(attempt-1)``, capped."""
    exponent = min(attempt - 1, 64)  # 2^64 · base is past any cap; avoids a huge float
    return float(min(policy.base_seconds * 2**exponent, policy.max_seconds))


def retry_delay(attempt: int, policy: RetryPolicy, retry_after: float | None) -> float:
    """The backoff, or the adapter's ``retry_after`` (e.g. ``Retry-After``) when that is longer."""
    delay = backoff_seconds(attempt, policy)
    return max(delay, retry_after) if retry_after is not None else delay


def decide(
    result: Result,
    *,
    attempt: int,
    max_attempts: int,
    policy: RetryPolicy,
    now: datetime,
    retry_after: float | None = None,
    replayed_at: int = 0,
) -> Decision:
    """The docs/architecture.md §5 table for one attempt's result.

    ``max_attempts`` is the highest number an attempt may have; ``replayed_at`` the number of
    the delivery's latest replay (0: none), after which the backoff starts again from the base,
    as its budget does (attempt numbers keep increasing across replays).

    - delivered → ``DELIVERED``, ack;
    - retriable with attempts left → ``RETRYING``; publish attempt + 1 to the delay tier that
      covers the wait, then ack;
    - retriable with no attempts left, or permanent → ``DEAD``, reject to the DLQ;
    - panic → ``DEAD`` with outcome ``panic``, reject to the DLQ.
    """
    if result is Result.DELIVERED:
        return Decision(status="DELIVERED", outcome="delivered", settle=Settle.ACK)
    if result is Result.PANIC:
        return Decision(status="DEAD", outcome="panic", settle=Settle.REJECT)
    if result is Result.RETRIABLE and attempt < max_attempts:
        since_replay = max(attempt - replayed_at, 1)
        tier = tier_for(retry_delay(since_replay, policy, retry_after), policy.tiers_seconds)
        return Decision(
            status="RETRYING",
            outcome="retry",
            settle=Settle.ACK,
            retry_tier=tier,
            retry_attempt=attempt + 1,
            next_attempt_at=now + timedelta(seconds=tier),
        )
    return Decision(status="DEAD", outcome="dead", settle=Settle.REJECT)


def decide_rate_limited(
    wait_seconds: float, *, policy: RetryPolicy, now: datetime, outcome: str = "rate_limited"
) -> Decision:
    """The adapter asked to wait: the same attempt goes to the tier covering the wait, the
    delivery keeps its status and attempt (no attempt is used up), the original is acked.
    ``outcome`` ``deferred``: the destination's circuit is open, the same rule."""
    tier = tier_for(wait_seconds, policy.tiers_seconds)
    return Decision(
        status=None,
        outcome=outcome,
        settle=Settle.ACK,
        retry_tier=tier,
        next_attempt_at=now + timedelta(seconds=tier),
    )
