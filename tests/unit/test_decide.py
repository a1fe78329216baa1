"""The per-attempt decision (DESIGN §5), as this version of the rules makes it."""

from __future__ import annotations

import pytest

from notifier.broker.base import Settle
from notifier.worker.decide import Decision, Result, decide

DELIVERED = Decision(status="DELIVERED", outcome="delivered", settle=Settle.ACK)
DEAD = Decision(status="DEAD", outcome="dead", settle=Settle.REJECT)
PANIC = Decision(status="DEAD", outcome="panic", settle=Settle.REJECT)


@pytest.mark.parametrize(
    ("result", "attempt", "max_attempts", "expected"),
    [
        (Result.DELIVERED, 1, 5, DELIVERED),  # first try
        (Result.DELIVERED, 5, 5, DELIVERED),  # last try
        (Result.DELIVERED, 9, 5, DELIVERED),  # past the budget still counts as delivered
        (Result.RETRIABLE, 1, 5, DEAD),  # attempts left, but this version does not retry
        (Result.RETRIABLE, 5, 5, DEAD),  # attempts used up
        (Result.PERMANENT, 1, 5, DEAD),  # never worth another try
        (Result.PERMANENT, 5, 5, DEAD),
        (Result.PANIC, 1, 5, PANIC),  # a crash: its own outcome, to the DLQ
        (Result.PANIC, 5, 5, PANIC),
    ],
)
def test_decide(result: Result, attempt: int, max_attempts: int, expected: Decision) -> None:
    assert decide(result, attempt=attempt, max_attempts=max_attempts) == expected


@pytest.mark.parametrize("result", list(Result))
def test_no_decision_schedules_a_next_attempt(result: Result) -> None:
    assert decide(result, attempt=1, max_attempts=5).next_attempt_at is None


@pytest.mark.parametrize("result", list(Result))
def test_only_delivered_is_acked(result: Result) -> None:
    settle = decide(result, attempt=1, max_attempts=5).settle
    assert (settle is Settle.ACK) is (result is Result.DELIVERED)
