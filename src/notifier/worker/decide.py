"""What happens to a delivery after one attempt: a pure decision, tested as a table.

This is the one place where the per-message rules of DESIGN §5 live. The handler turns an
attempt's result into a ``Decision`` here and carries it out; it decides nothing itself.
"""

from __future__ import annotations

import enum
from datetime import datetime

import msgspec

from notifier.broker.base import Settle


class Result(enum.Enum):
    DELIVERED = "delivered"
    RETRIABLE = "retriable"
    PERMANENT = "permanent"
    PANIC = "panic"  # the handler or adapter raised something that is not a DeliveryError


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    status: str  # the delivery's new status
    outcome: str  # the attempt row's outcome
    settle: Settle  # what happens to the original message
    next_attempt_at: datetime | None = None


def decide(result: Result, *, attempt: int, max_attempts: int) -> Decision:
    """Delivered → ``DELIVERED`` + ack. Any failure → ``DEAD`` + reject to the DLQ.

    Retriable failures with attempts left are not retried by this version of the rules: they
    end ``DEAD`` like the rest (``attempt``/``max_attempts`` are where the retry rule will read
    its budget).
    """
    del attempt, max_attempts
    if result is Result.DELIVERED:
        return Decision(status="DELIVERED", outcome="delivered", settle=Settle.ACK)
    if result is Result.PANIC:
        return Decision(status="DEAD", outcome="panic", settle=Settle.REJECT)
    return Decision(status="DEAD", outcome="dead", settle=Settle.REJECT)
