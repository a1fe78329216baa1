"""A worker group's fair share between destinations (docs/architecture.md §5).

A destination (``adapters.base.destination_of``: a webhook's origin, else the channel) never
holds more than ``cap`` of the group's worker tasks while it is slow: while its mean delivery
time (or the age of one of its deliveries under way) is ``BORROW_BELOW_SECONDS`` or more. A
destination faster than that may borrow idle tasks beyond its cap — it hands each back within
that time — so one busy, healthy receiver still has the whole group. A message for a
destination at its cap does not wait in a task:

- it **waits** in the destination's waiting list, holding no task, and runs as soon as one of
  the destination's running deliveries ends — in the task that ran it, so the destination's
  share stays ``cap`` and its messages keep their order; the list holds at most ``cap``
  messages per destination (each then waits at most about one delivery's time) and, over the
  whole group, what the prefetch leaves once every task has a message (``prefetch -
  concurrency``), so the waiting messages can never fill the prefetch and stop the consumer;
- past that it is **deferred**: the same message, at the same attempt, goes through a delay tier
  and comes back later. The tier is chosen from a virtual queue per destination: each deferral
  pushes the time when the destination's backlog would be cleared by one delivery's time (the
  destination's recent mean) divided by ``cap``, so a deep backlog for a slow receiver spreads
  out over the tiers instead of bouncing through the shortest one every second.

A new destination counts as slow until a delivery of it has ended (a receiver that hangs from
the start must not take every task before it is measured); until then its deferred messages
come back after the shortest tier.

Neither costs an attempt or a Postgres statement. ``FairShare`` is the pure bookkeeping (tested
as tables, the clock passed in); ``FairDispatch`` is the thin trio part that the worker tasks
call.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec
import trio
from prometheus_client import Gauge

from notifier.adapters.base import destination_namer
from notifier.broker.base import Incoming, Settle
from notifier.lifecycle import Stop
from notifier.messages import WorkerMessage, decode_message
from notifier.worker.handle import Handler

log = logging.getLogger("notifier.worker")

T = TypeVar("T")

# Until a delivery of a destination has ended, it counts as this slow (too slow to borrow).
FIRST_ESTIMATE_SECONDS = 1.0
# The weight of the newest delivery's time in a destination's mean.
EWMA_WEIGHT = 0.2
# A destination whose deliveries take less than this (on average, and each one under way so
# far) may borrow idle tasks beyond its cap.
BORROW_BELOW_SECONDS = 1.0
# Destinations remembered (idle ones are forgotten past this many, their estimates first).
DESTINATIONS_KEPT = 4096


class Verdict(enum.Enum):
    RUN = "run"  # the caller runs it now
    WAIT = "wait"  # kept in the destination's waiting list: a running task of it takes it
    DEFER = "defer"  # through a delay tier, for ``FairShare.defer_seconds``


@dataclass(slots=True)
class _Destination(Generic[T]):
    running: int = 0
    started: list[float] = field(default_factory=list)  # of the deliveries under way
    waiting: deque[T] = field(default_factory=deque)
    seconds_per_delivery: float = FIRST_ESTIMATE_SECONDS
    measured: bool = False  # a delivery of it has ended
    clear_at: float = 0.0  # when the deferred backlog would be cleared (virtual queue)


@dataclass(frozen=True, slots=True)
class FairShareStatistics:
    running: int  # deliveries being made
    waiting: int  # messages in waiting lists
    destinations: int  # destinations remembered


class FairShare(Generic[T]):
    """Per-destination in-flight caps with bounded waiting lists; pure, no I/O, no clock."""

    def __init__(self, *, cap: int, waiting_per_destination: int, waiting_total: int) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1")
        self._cap = cap
        self._per_destination = max(0, waiting_per_destination)
        self._total = max(0, waiting_total)
        self._waiting = 0
        self._running = 0
        self._destinations: dict[str, _Destination[T]] = {}

    @property
    def cap(self) -> int:
        return self._cap

    def statistics(self) -> FairShareStatistics:
        return FairShareStatistics(self._running, self._waiting, len(self._destinations))

    def running(self, key: str) -> int:
        found = self._destinations.get(key)
        return found.running if found else 0

    def admit(self, key: str, item: T, now: float) -> Verdict:
        """``RUN`` (counted as running from ``now`` until ``finished``), ``WAIT`` (kept), or
        ``DEFER``."""
        dest = self._destinations.get(key)
        if dest is None:
            if len(self._destinations) >= DESTINATIONS_KEPT:
                self._forget_idle()
            dest = self._destinations[key] = _Destination()
        if dest.running < self._cap or self._may_borrow(dest, now):
            dest.running += 1
            dest.started.append(now)
            self._running += 1
            return Verdict.RUN
        if len(dest.waiting) < self._per_destination and self._waiting < self._total:
            dest.waiting.append(item)
            self._waiting += 1
            return Verdict.WAIT
        return Verdict.DEFER

    @staticmethod
    def _may_borrow(dest: _Destination[T], now: float) -> bool:
        """Whether a destination at its cap is fast enough to take an idle task beyond it."""
        return dest.seconds_per_delivery < BORROW_BELOW_SECONDS and (
            not dest.started or now - min(dest.started) < BORROW_BELOW_SECONDS
        )

    def finished(self, key: str, started_at: float, now: float) -> T | None:
        """A delivery of ``key`` run since ``started_at`` ended at ``now``: the next waiting
        message of ``key``, which the caller now runs (counted as running from ``now``), or
        None."""
        dest = self._destinations[key]
        dest.started.remove(started_at)
        seconds = max(0.0, now - started_at)
        if dest.measured:
            dest.seconds_per_delivery += EWMA_WEIGHT * (seconds - dest.seconds_per_delivery)
        else:
            dest.seconds_per_delivery, dest.measured = seconds, True
        if dest.waiting:
            self._waiting -= 1
            dest.started.append(now)
            return dest.waiting.popleft()
        dest.running -= 1
        self._running -= 1
        return None

    def release(self, key: str, started_at: float) -> None:
        """A message ``finished`` handed over at ``started_at`` was not run after all: its slot
        is let go."""
        dest = self._destinations[key]
        dest.started.remove(started_at)
        dest.running -= 1
        self._running -= 1

    def defer_seconds(self, key: str, now: float) -> float:
        """How long a message deferred now for ``key`` should stay away: its place in the
        destination's virtual queue, which it joins. Before a delivery of the destination has
        ended its pace is unknown: the message comes back as soon as the shortest tier allows
        (0 s here) and joins no queue."""
        dest = self._destinations[key]
        if not dest.measured:
            return 0.0
        dest.clear_at = max(dest.clear_at, now) + dest.seconds_per_delivery / self._cap
        return dest.clear_at - now

    def give_up_waiting(self) -> list[T]:
        """Every waiting message, taken out of the lists (a stopping group hands them back)."""
        items: list[T] = []
        for dest in self._destinations.values():
            items.extend(dest.waiting)
            dest.waiting.clear()
        self._waiting = 0
        return items

    def _forget_idle(self) -> None:
        idle = [k for k, d in self._destinations.items() if d.running == 0 and not d.waiting]
        for key in idle:
            del self._destinations[key]


Pending = tuple[Incoming, WorkerMessage]


class FairDispatch:
    """Trio-flavoured. What a worker task does with each message it takes: find its destination,
    then run it (and, after it, the destination's waiting messages), leave it waiting, or defer
    it (``Handler.defer``)."""

    def __init__(
        self,
        handler: Handler,
        adapter: object,
        share: FairShare[Pending],
        stop: Stop,
        *,
        tracking: Callable[[], AbstractContextManager[object]] | None = None,
        waiting: Gauge | None = None,
    ) -> None:
        """``tracking`` wraps each delivery (the in-flight gauge); ``waiting`` is set to the
        number of waiting messages."""
        self._handler = handler
        self._adapter = adapter
        self._destination = destination_namer(adapter)
        self._share = share
        self._stop = stop
        self._tracking = tracking or nullcontext
        self._waiting_gauge = waiting

    def _count_waiting(self) -> None:
        if self._waiting_gauge is not None:
            self._waiting_gauge.set(self._share.statistics().waiting)

    @property
    def share(self) -> FairShare[Pending]:
        return self._share

    def destination(self, message: WorkerMessage) -> str:
        """The message's destination; its channel's when the adapter cannot say."""
        try:
            return self._destination(message)
        except Exception:
            log.exception("delivery %s: naming its destination failed", message.delivery_id)
            return f"channel:{message.channel_id}"

    async def dispatch(self, incoming: Incoming) -> None:
        """Handle, keep or defer one message just taken; never raises ``Exception``."""
        try:
            message = decode_message(incoming.body)
        except msgspec.DecodeError:
            with self._tracking():
                await self._handler.handle(incoming)  # logged, observed, rejected there
            return
        key = self.destination(message)
        t0 = trio.current_time()  # the delivery's start, as the share counts it
        verdict = self._share.admit(key, (incoming, message), t0)
        if verdict is Verdict.WAIT:
            self._count_waiting()
            return
        if verdict is Verdict.DEFER:
            seconds = self._share.defer_seconds(key, t0)
            await self._handler.defer(incoming, message, seconds, destination=key)
            return
        pending: Pending | None = (incoming, message)
        while pending is not None:
            with self._tracking():
                await self._handler.handle(*pending)
            now = trio.current_time()
            pending = self._share.finished(key, t0, now)
            t0 = now
            if pending is None:
                break
            self._count_waiting()
            if self._stop.is_set():
                # Stopping: waiting messages were never started; they go back to the queue
                # untouched, this one and every other destination's.
                self._share.release(key, t0)
                for incoming_, _ in [pending, *self._share.give_up_waiting()]:
                    incoming_.settle(Settle.REQUEUE)
                self._count_waiting()
                pending = None
