"""FIFO channels: each channel's deliveries attempted one at a time, in acceptance order
(README "Ordered delivery (FIFO)", docs/architecture.md §5).

A FIFO channel's messages go to one of its type's partitions, ``deliveries.<type>.fifo.<k>``
(``k`` = the channel id modulo ``broker.fifo_partitions``), single-active-consumer queues: every
worker process consumes every partition, and RabbitMQ makes one consumer of the fleet active per
partition, failing over to the next when its process goes. A message is only a **wake-up** for
its channel: Postgres holds the order (``deliveries.fifo_seq``, numbered in the fan-out), so a
channel's *line* — a task of this module — attempts the channel's unfinished deliveries from
Postgres, lowest number first (``fifo_head``), each through the ordinary ``Handler`` (rate
limits, circuit, record, observers), until none is left. Publish order, duplicates and restarts
cannot reorder what the line reads.

- **A retrying head holds the line.** The handler's retry copy (or a wake-up the line sends
  itself) goes through the FIFO delay tiers (``deliveries.<type>.fifo.wait.<N>s``), which
  dead-letter it back to the channel's partition; meanwhile the line ends, holding nothing (no
  task, no unacked message), and wake-ups of the channel that arrive before it is due are
  acked. Other channels of the partition go on: a waiting channel blocks only itself.
- **One unacked message per line**, its *token*: should the process die, the broker hands it
  to the next active consumer, which drains the channel. Every other wake-up that arrives
  while the line runs is acked at once (the line reads Postgres again before it ends). A token
  older than ``TOKEN_HOLD_SECONDS`` is swapped for a fresh wake-up, so none is held near
  RabbitMQ's ``consumer_timeout``.
- ``DEAD`` releases the line: the head is finished, the next one is attempted.

At most ``concurrency`` lines run at once in a process (a ``trio.CapacityLimiter``, first come
first served); a line waits for its turn with its token in hand, and gives its turn up after
``LINE_TURN_SECONDS`` when others wait, so a channel that never runs dry keeps none out.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol, cast

import msgspec
import trio

from notifier.broker.base import Confirm, Incoming, Outgoing, Settle
from notifier.broker.topology import (
    FIFO_EXCHANGE,
    FIFO_WAIT_EXCHANGE,
    fifo_partition,
    fifo_routing_key,
    fifo_wait_queue,
    retry_queue,
    tier_for,
)
from notifier.errors import BrokerError, StoreError
from notifier.lifecycle import Stop
from notifier.messages import decode_message
from notifier.store.rows import FifoHead
from notifier.tracing import HEADER as TRACE_HEADER
from notifier.worker.handle import STORE_UNAVAILABLE_PAUSE_SECONDS, Handler
from notifier.worker.republish import Publish

log = logging.getLogger("notifier.worker")

# A line's token is swapped for a fresh wake-up once held this long: far below RabbitMQ's
# consumer_timeout (30 min by default), which closes a channel holding an older unacked message.
TOKEN_HOLD_SECONDS = 300.0
# A head due within this long is waited for in the line (a retry's shortest tier, a wake-up
# that came early), not through a delay tier.
SHORT_WAIT_SECONDS = 2.0
# A line runs this long at most while other lines wait for one of the ``concurrency`` turns,
# then waits at the back: a channel that never runs dry does not keep the others out.
LINE_TURN_SECONDS = 10.0
TURN_OVER = "turn over"
# A wake-up the broker did not confirm: the token goes back to the queue after this pause.
WAKE_FAILED_PAUSE_SECONDS = 1.0
# The header that routes a delay tier's copy back to its partition when it dead-letters.
CC_HEADER = "CC"


class FifoStore(Protocol):
    async def fifo_head(self, channel_id: uuid.UUID) -> FifoHead | None: ...


class _ChannelOnly(msgspec.Struct):
    channel_id: uuid.UUID


_channel_of = msgspec.json.Decoder(_ChannelOnly).decode


class FifoRetries:
    """The ``Publish`` of a FIFO handler: a retry copy (or deferral) the handler sends to the
    type's delay tier ``N`` goes to the FIFO tier ``N`` instead, with ``CC`` naming its channel's
    partition, so it comes back to the partition and never to the type's work queue."""

    def __init__(
        self, publish: Publish, channel_type: str, tiers: Sequence[int], partitions: int
    ) -> None:
        self._publish = publish
        self._type = channel_type
        self._partitions = partitions
        self._tiers = {
            retry_queue(channel_type, t): fifo_wait_queue(channel_type, t) for t in tiers
        }
        self._seconds = sorted(tiers)

    def wake_up(
        self, channel_id: uuid.UUID, tier_queue: str, body: bytes, message_id: str,
        traceparent: str | None,
    ) -> Outgoing:  # fmt: skip
        """The copy of ``body`` through the FIFO delay tier ``tier_queue``, back to the
        partition of ``channel_id`` when its time is up."""
        key = fifo_routing_key(self._type, fifo_partition(channel_id, self._partitions))
        headers: dict[str, object] = {CC_HEADER: [key]}
        if traceparent is not None:
            headers[TRACE_HEADER] = traceparent
        return Outgoing(FIFO_WAIT_EXCHANGE, tier_queue, body, message_id, headers)

    async def __call__(self, out: Outgoing) -> Confirm:
        tier = self._tiers.get(out.routing_key)
        if tier is None:
            raise BrokerError(f"no FIFO delay tier for {out.routing_key!r}")
        traceparent = (out.headers or {}).get(TRACE_HEADER)
        channel_id = _channel_of(out.body).channel_id
        return await self._publish(
            self.wake_up(channel_id, tier, out.body, out.message_id, traceparent)
        )

    async def wake_at_partition(self, channel_id: uuid.UUID, out_body: bytes, mid: str) -> Confirm:
        """A fresh wake-up of the channel straight to its partition (a token's swap)."""
        key = fifo_routing_key(self._type, fifo_partition(channel_id, self._partitions))
        return await self._publish(Outgoing(FIFO_EXCHANGE, key, out_body, mid))

    def tier_for(self, seconds: float) -> int:
        """The delay tier a wait of ``seconds`` goes through (the longest for a longer one)."""
        return tier_for(seconds, self._seconds)

    async def wake_after(
        self, channel_id: uuid.UUID, seconds: float, body: bytes, mid: str,
        traceparent: str | None,
    ) -> Confirm:  # fmt: skip
        """A wake-up of the channel through the FIFO tier covering ``seconds``."""
        tier = self.tier_for(seconds)
        return await self._publish(
            self.wake_up(channel_id, fifo_wait_queue(self._type, tier), body, mid, traceparent)
        )


class _Settled:
    """The settle sink of the message a line builds for the handler: what it came to."""

    def __init__(self) -> None:
        self.how: Settle | None = None

    def settle(self, delivery_tag: int, how: Settle) -> None:
        self.how = how


@dataclass(slots=True)
class _Line:
    token: Incoming | None
    token_since: float
    fresh: bool = False  # a wake-up arrived since the line last read its head
    start_at: float = 0.0  # not before this (trio clock): a waiting head's time
    last_attempted: uuid.UUID | None = None
    just_attempted: bool = False  # the last step of the line was an attempt
    done: trio.Event = field(default_factory=trio.Event)


class FifoLines:
    """The lines of one channel type's FIFO channels in one process. ``take`` is given each
    message of the partitions this process is the active consumer of; it never blocks."""

    def __init__(
        self,
        store: FifoStore,
        handler: Handler,
        retries: FifoRetries,
        stop: Stop,
        *,
        concurrency: int,
        tracking: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        """``tracking`` counts each attempt while it is made (the group's
        ``notifier_worker_in_flight``)."""
        self._tracking = tracking or nullcontext
        self._store = store
        self._handler = handler
        self._retries = retries
        self._stop = stop
        self._limiter = trio.CapacityLimiter(concurrency)
        self._lines: dict[uuid.UUID, _Line] = {}
        # channel → (when its head is due, when its wake-up comes back from its delay tier),
        # on trio's clock
        self._parked: dict[uuid.UUID, tuple[float, float]] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Trio-flavoured. The nursery of the lines; runs until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def consume(self, receive: trio.MemoryReceiveChannel[Incoming]) -> None:
        """Trio-flavoured. Hand every message of one partition's consumer to ``take``."""
        async for incoming in receive:
            self.take(incoming)

    def take(self, incoming: Incoming) -> None:
        try:
            channel_id = _channel_of(incoming.body).channel_id
        except msgspec.DecodeError:
            log.error("FIFO message %s is undecodable; rejecting to the DLQ", incoming.message_id)
            incoming.settle(Settle.REJECT)
            return
        line = self._lines.get(channel_id)
        if line is not None:
            line.fresh = True
            if line.token is None:
                line.token, line.token_since = incoming, trio.current_time()
            else:
                incoming.settle(Settle.ACK)  # the line reads Postgres again before it ends
            return
        now = trio.current_time()
        start_at = now
        parked = self._parked.pop(channel_id, None)
        if parked is not None:
            due, wake_at = parked
            if now < wake_at - SHORT_WAIT_SECONDS:
                # its head waits, and a wake-up of it is in a delay tier until then
                self._parked[channel_id] = parked
                incoming.settle(Settle.ACK)
                return
            # The wake-up (a little early, as the tiers and the clocks go), or a message
            # after it: the line starts at the head's time, holding the message meanwhile; a
            # head due later than a token may be held (longer than the longest tier) starts
            # the line now, which sends the next wake-up.
            if due - now <= TOKEN_HOLD_SECONDS:
                start_at = due
        if self._nursery is None:
            raise RuntimeError("FifoLines.take before run started")
        line = self._lines[channel_id] = _Line(incoming, now, start_at=start_at)
        self._nursery.start_soon(self._drain, channel_id, line)

    async def wait_idle(self, channel_id: uuid.UUID) -> None:
        """Trio-flavoured. Return once the channel has no line running (for tests)."""
        line = self._lines.get(channel_id)
        if line is not None:
            await line.done.wait()

    async def wait_stopped(self) -> None:
        """Trio-flavoured. Once stopped: return when every line has ended (each finishes the
        attempt it is making; its token goes back to the queue with the channel)."""
        while self._lines:
            await next(iter(self._lines.values())).done.wait()

    async def _drain(self, channel_id: uuid.UUID, line: _Line) -> None:
        settle: Settle | None = None
        try:
            with self._stop.intake():
                await trio.sleep_until(line.start_at)
            while True:
                async with self._limiter:
                    outcome = await self._run_line(channel_id, line)
                if outcome != TURN_OVER:  # else: the line waits for a turn again, at the back
                    settle = cast(Settle | None, outcome)
                    break
        except Exception:
            log.exception("FIFO channel %s: the line failed; requeueing its token", channel_id)
            settle = Settle.REQUEUE
            with trio.CancelScope(shield=True):
                await trio.sleep(WAKE_FAILED_PAUSE_SECONDS)
        finally:
            # No checkpoint from the last read of the head to here: a wake-up taken meanwhile
            # found the line running and set ``fresh``, which _run_line checked.
            del self._lines[channel_id]
            line.done.set()
        if line.token is not None and settle is not None:
            line.token.settle(settle)

    async def _run_line(self, channel_id: uuid.UUID, line: _Line) -> Settle | str | None:
        """Attempt the channel's line until it is empty or its head must wait; how to settle
        the token (None: leave it to the channel's close, the process is stopping), or
        ``TURN_OVER`` once the line has had ``LINE_TURN_SECONDS`` while other lines wait."""
        turn_ends = trio.current_time() + LINE_TURN_SECONDS
        while True:
            if self._stop.is_set():
                return None
            if trio.current_time() > turn_ends and self._limiter.statistics().tasks_waiting:
                return TURN_OVER
            held = trio.current_time() - line.token_since
            if line.token is not None and held > TOKEN_HOLD_SECONDS:
                await self._swap_token(channel_id, line)
            line.fresh = False
            try:
                head = await self._store.fifo_head(channel_id)
            except StoreError as exc:
                log.warning("FIFO channel %s: store unavailable, requeueing: %s", channel_id, exc)
                await trio.sleep(STORE_UNAVAILABLE_PAUSE_SECONDS)
                return Settle.REQUEUE
            if head is None:
                if line.fresh:
                    continue
                return Settle.ACK
            if 0 < head.wait_seconds <= SHORT_WAIT_SECONDS:
                await trio.sleep(head.wait_seconds)  # due in a moment: wait here
                line.just_attempted = False
                continue
            if head.wait_seconds > 0:
                return await self._park(channel_id, line, head)
            if line.just_attempted and head.delivery_id == line.last_attempted:
                # due still, just after its attempt: the attempt was not recorded (a panic
                # whose row could not be written); not again at once, the token goes back
                # after a pause
                await trio.sleep(WAKE_FAILED_PAUSE_SECONDS)
                return Settle.REQUEUE
            message = decode_message(head.body)
            settled = _Settled()
            headers = {} if head.traceparent is None else {TRACE_HEADER: head.traceparent}
            incoming = Incoming(
                head.body, str(head.delivery_id), 0, False, settled, headers=headers
            )
            with self._tracking():
                await self._handler.handle(incoming, message)
            line.last_attempted, line.just_attempted = head.delivery_id, True
            if settled.how is Settle.REQUEUE:
                # Postgres unavailable (the handler paused already) or a settling that timed
                # out: the token goes back, and the line starts again from Postgres.
                return Settle.REQUEUE

    async def _park(self, channel_id: uuid.UUID, line: _Line, head: FifoHead) -> Settle:
        """The head is not due: make sure a wake-up of the channel waits in a delay tier, and
        end the line. The handler's retry copy is that wake-up when the line has just
        attempted the head; otherwise (a wake-up that came early, a line that started behind a
        waiting head) the line sends one."""
        if head.delivery_id != line.last_attempted:
            with trio.move_on_after(STORE_UNAVAILABLE_PAUSE_SECONDS):
                try:
                    confirm = await self._retries.wake_after(
                        channel_id, head.wait_seconds, head.body, str(head.delivery_id),
                        head.traceparent,
                    )  # fmt: skip
                except BrokerError:
                    confirm = Confirm.UNCONFIRMED
                if confirm is not Confirm.CONFIRMED:
                    log.warning(
                        "FIFO channel %s: the wake-up was not confirmed (%s); requeueing",
                        channel_id, confirm.value,
                    )  # fmt: skip
                    await trio.sleep(WAKE_FAILED_PAUSE_SECONDS)
                    return Settle.REQUEUE
        now = trio.current_time()
        tier = self._retries.tier_for(head.wait_seconds)
        self._parked[channel_id] = (now + head.wait_seconds, now + tier)
        if len(self._parked) > 4096:  # forget the ones whose wake-up came back long ago
            self._parked = {c: p for c, p in self._parked.items() if p[1] > now}
        return Settle.ACK

    async def _swap_token(self, channel_id: uuid.UUID, line: _Line) -> None:
        """Ack the line's old token once a fresh wake-up of the channel is confirmed in its
        partition (it comes back here, the active consumer, and becomes the token)."""
        token = line.token
        if token is None:
            return
        try:
            confirm = await self._retries.wake_at_partition(
                channel_id, token.body, token.message_id or ""
            )
        except BrokerError:
            return  # tried again after the next attempt
        if confirm is Confirm.CONFIRMED:
            token.settle(Settle.ACK)
            line.token = None
