"""Copies of a message sent back through the delay tiers (docs/architecture.md §5): the retry
copy of an attempt that will be tried again (the next attempt, after the decided backoff), and
the deferral of a message whose destination is at its fair share (``worker.fair``: the same
attempt, later; no attempt used, nothing written to Postgres).

A copy counts only once the broker confirmed it, within ``RETRY_PUBLISH_TIMEOUT_SECONDS``
(its route may be declared again on the way, see ``broker.repair``). What happens when it is
not confirmed differs: a retry copy's attempt is recorded all the same (``worker.handle``; the
reconciler enqueues it once it is overdue), while a deferral hands the original back to the
queue after ``DEFER_FAILED_PAUSE_SECONDS``, so a broker fault does not spin it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import trio

from notifier.broker.base import Confirm, Incoming, Outgoing, Settle
from notifier.broker.topology import RETRY_EXCHANGE, retry_queue, tier_for
from notifier.errors import BrokerError
from notifier.messages import WorkerMessage, encode_message
from notifier.tracing import HEADER as TRACE_HEADER
from notifier.tracing import parse_traceparent

log = logging.getLogger("notifier.worker")

# The retry publish (with a repair of its route) may take this long; the rest of the final
# write's bound (worker.handle.FINAL_WRITE_TIMEOUT_SECONDS) is the record's.
RETRY_PUBLISH_TIMEOUT_SECONDS = 6.0
# A deferral whose copy the broker did not take: the original is held this long, then requeued.
DEFER_FAILED_PAUSE_SECONDS = 1.0

Publish = Callable[[Outgoing], Awaitable[Confirm]]
# Told of each message deferred: its broker message id and the message.
Deferred = Callable[[str | None, WorkerMessage], None]


class Republisher:
    """Retry copies and deferrals of one channel type's messages, through ``publish``."""

    def __init__(
        self,
        publish: Publish,
        channel_type: str,
        tiers_seconds: Sequence[int],
        *,
        deferred: Deferred,
        bound_seconds: float,
    ) -> None:
        """``deferred`` is told of each deferral the broker confirmed; ``bound_seconds``
        bounds a deferral's publish, which is finished even during shutdown."""
        self._publish = publish
        self._type = channel_type
        self._tiers = tiers_seconds
        self._deferred = deferred
        self._bound = bound_seconds

    async def publish(self, out: Outgoing) -> tuple[Confirm, str]:
        """Publish a copy, bounded so that the record after it keeps its time; the confirm,
        and what to log when it is not ``CONFIRMED``."""
        with trio.move_on_after(RETRY_PUBLISH_TIMEOUT_SECONDS):
            try:
                confirm = await self._publish(out)
            except BrokerError as exc:
                return Confirm.UNCONFIRMED, repr(exc)
            return confirm, confirm.value
        return Confirm.UNCONFIRMED, f"no confirm in {RETRY_PUBLISH_TIMEOUT_SECONDS:g} s"

    async def retry(
        self, message: WorkerMessage, tier: int, attempt: int | None,
        traceparent: str | None = None,
    ) -> None:  # fmt: skip
        """The retry copy of ``message`` (numbered ``attempt`` when given) through the delay
        tier ``tier``, with ``traceparent`` as its header of that name; a copy the broker did
        not confirm is logged (its attempt is recorded all the same, and the reconciler
        enqueues it once it is overdue)."""
        copy = message
        if attempt is not None:
            copy = msgspec.structs.replace(message, attempt=attempt)
        queue = retry_queue(self._type, tier)
        out = Outgoing(
            RETRY_EXCHANGE, queue, encode_message(copy), str(message.delivery_id),
            None if traceparent is None else {TRACE_HEADER: traceparent},
        )  # fmt: skip
        confirm, why = await self.publish(out)
        if confirm is not Confirm.CONFIRMED:
            # The attempt happened all the same: it is recorded (with its next_attempt_at)
            # and the original acked. Handing the original back instead would call the
            # receiver again at once, unrecorded, as fast as the broker redelivers it; the
            # reconciler enqueues the next attempt from Postgres once it is overdue.
            log.warning(
                "delivery %s attempt %d: publishing the retry to %s failed (%s); the "
                "reconciler enqueues it once it is overdue",
                message.delivery_id, message.attempt, queue, why,
                extra={"delivery_id": str(message.delivery_id), "attempt": message.attempt},
            )  # fmt: skip

    async def defer(
        self, incoming: Incoming, message: WorkerMessage, seconds: float, *, destination: str
    ) -> None:
        """Trio-flavoured. Send the message through the delay tier covering ``seconds``, at the
        same attempt, and ack it. When the copy is not confirmed the original goes back to the
        queue after a pause. Never raises ``Exception``."""
        tier = tier_for(seconds, self._tiers)
        queue = retry_queue(self._type, tier)
        traceparent = parse_traceparent(incoming.headers.get(TRACE_HEADER))  # carried on
        out = Outgoing(
            RETRY_EXCHANGE, queue, incoming.body, str(message.delivery_id),
            None if traceparent is None else {TRACE_HEADER: traceparent},
        )  # fmt: skip
        confirm, why = Confirm.UNCONFIRMED, "no confirm in time"
        with trio.CancelScope(shield=True), trio.move_on_after(self._bound):
            confirm, why = await self.publish(out)
        if confirm is Confirm.CONFIRMED:
            log.debug(
                "delivery %s attempt %d: %s is at its share; deferred %d s",
                message.delivery_id, message.attempt, destination, tier,
                extra={"delivery_id": str(message.delivery_id), "attempt": message.attempt},
            )  # fmt: skip
            self._deferred(incoming.message_id, message)
            incoming.settle(Settle.ACK)
            return
        log.warning(
            "delivery %s attempt %d: deferring to %s failed (%s); requeueing",
            message.delivery_id, message.attempt, queue, why,
            extra={"delivery_id": str(message.delivery_id), "attempt": message.attempt},
        )  # fmt: skip
        await trio.sleep(DEFER_FAILED_PAUSE_SECONDS)
        incoming.settle(Settle.REQUEUE)
