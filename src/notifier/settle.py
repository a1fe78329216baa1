"""What becomes of a consumed message once it is handled. The worker's pure decisions choose
it and the broker carries it out, so it belongs to neither: both import it from here."""

from __future__ import annotations

import enum


class Settle(enum.Enum):
    ACK = "ack"
    REJECT = "reject"  # requeue=false: dead-letters to the type's DLQ
    REQUEUE = "requeue"  # nack with requeue=true: back to the queue, status unchanged
