"""One message, start to finish (docs/architecture.md §5): decode → skip if settled → the
destination's circuit (``worker.circuit``: deferred while open) → rate limit (buckets shared by
every process, taken in one statement, only where a limit applies) → deliver → publish the
retry (``worker.republish``, which also sends the fair share's deferrals) → record → settle.

Per-message failures never leave ``handle``: anything an adapter raises becomes an attempt row
and a settlement, and the worker task goes on with the next message. ``trio.Cancelled`` always
propagates (an unsettled message simply returns to the queue). What each outcome means is
decided in ``decide``; this module only carries decisions out, in the order that keeps the
at-least-once promise: a retry copy is confirmed by the broker before the attempt is recorded,
and the attempt is recorded before the original is acked. What each message came to is told
to an ``OutcomeObserver`` (``worker.observe``: metrics, the log line, Sentry), never reported
from here directly.

Every call of an adapter ends in an attempt row. When the retry copy cannot be published (after
its route was declared again, see ``broker.repair``), the attempt is recorded all the same and
the original acked: Postgres then holds the delivery ``RETRYING`` with its ``next_attempt_at``
and no message, which the reconciler (``maintenance``) enqueues again once it is overdue. The
receiver is never called again without a backoff.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec
import trio

from notifier.adapters.base import Adapter, KeepsDeadline, RateLimiter, destination_namer
from notifier.broker.base import Incoming, Settle
from notifier.errors import DeliveryError, PermanentError, RetriableError, StoreError
from notifier.messages import WorkerMessage, decode_message
from notifier.ratelimit import Bucket, Refusals, SharedBuckets
from notifier.store.rows import TERMINAL_STATUSES, AttemptRecord, DeliveryState
from notifier.tracing import HEADER as TRACE_HEADER
from notifier.tracing import NO_TRACING, Kind, Span, Tracing, parse_traceparent
from notifier.worker.circuit import Breaker, Gate
from notifier.worker.decide import Decision, Result, RetryPolicy, decide, decide_rate_limited
from notifier.worker.observe import DEFERRED, UNDECODABLE, Observers, Outcome, OutcomeObserver
from notifier.worker.republish import Publish, Republisher

log = logging.getLogger("notifier.worker")

# The retry publish and the final write of an attempt that happened are finished even during
# shutdown, bounded by this.
FINAL_WRITE_TIMEOUT_SECONDS = 10.0
# Of that, the retry publish may take worker.republish.RETRY_PUBLISH_TIMEOUT_SECONDS.
# Postgres unreachable: hold the message this long before handing it back to the queue, so an
# outage does not spin messages through the queue (each return counts against its delivery
# limit).
STORE_UNAVAILABLE_PAUSE_SECONDS = 5.0
# How much later than the timeout the call of a ``KeepsDeadline`` adapter is cut.
DEADLINE_BACKSTOP_SECONDS = 1.0


class DeliveryStore(Protocol):
    async def delivery_state(
        self, delivery_id: uuid.UUID, created_at: datetime | None = None
    ) -> DeliveryState | None: ...

    async def record_attempt(self, rec: AttemptRecord) -> bool: ...


class Attempted(msgspec.Struct, kw_only=True):
    """What one call of the adapter (or its rate limiter) came to."""

    result: Result
    error: str | None = None
    status_code: int | None = None
    response_excerpt: str | None = None
    retry_after: float | None = None
    rate_limit_wait: float | None = None
    defer_wait: float | None = None  # the destination's circuit is open: wait this long
    disable_channel: bool = False
    exc: BaseException | None = None
    called: bool = True  # False: the adapter was not called (channel not enabled, rate limited)
    unreachable: bool = False  # the receiver could not be reached or did not answer


class Handler:
    def __init__(
        self,
        store: DeliveryStore,
        adapter: Adapter,
        publish: Publish,
        *,
        timeout_seconds: float,
        policy: RetryPolicy,
        observer: OutcomeObserver | None = None,
        limits: SharedBuckets | None = None,
        circuits: Breaker | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        """``observer`` is told what each message came to (``worker.group.outcome_observers``
        composes the metrics, the log line and Sentry); without one, nothing is told.
        ``limits`` keeps the rate-limit buckets (the store: shared by every process); a message
        that needs a bucket (its channel's ``rate_limit_per_second``, the adapter's
        ``rate_buckets``) in a handler without it is a panic. ``circuits``: the destinations'
        circuit breakers (none: every delivery is attempted). ``tracing`` makes a span of each
        attempt (README, Tracing)."""
        self._store = store
        self._adapter = adapter
        self._limiter = adapter if isinstance(adapter, RateLimiter) else None
        self._limits = limits
        self._circuits = circuits
        self._refusals = Refusals()  # refused takes, answered again here until their time
        self._republish = Republisher(
            publish, adapter.channel_type, policy.tiers_seconds,
            deferred=lambda message_id, message: self._observe(message_id, message, DEFERRED),
            bound_seconds=FINAL_WRITE_TIMEOUT_SECONDS,
        )  # fmt: skip
        self._timeout = timeout_seconds
        # An adapter that ends its attempts at the timeout itself (and says where) gets a
        # little longer here: this limit is then only the backstop.
        keeps = isinstance(adapter, KeepsDeadline) and adapter.keeps_deadline
        self._limit = timeout_seconds + (DEADLINE_BACKSTOP_SECONDS if keeps else 0.0)
        self._policy = policy
        # an observer that raises is skipped: it never changes what happens to a message
        if not isinstance(observer, Observers):
            observer = Observers() if observer is None else Observers(observer)
        self._observer = observer
        self._type = adapter.channel_type
        self._destination = destination_namer(adapter)
        self._tracing = tracing

    async def handle(self, incoming: Incoming, message: WorkerMessage | None = None) -> None:
        """Trio-flavoured. Handle one message and record its settlement; never raises
        ``Exception``. ``message`` is its body when the caller decoded it already."""
        try:
            if message is None:
                message = self._decode(incoming)
            settle = (
                Settle.REJECT if message is None
                else await self._handle(message, incoming.message_id, incoming.headers)
            )  # fmt: skip
        except StoreError as exc:
            # Postgres is unreachable: we cannot know or record the state, so the message goes
            # back to the queue untouched, after a pause, and is tried again later.
            log.warning("delivery %s: store unavailable, requeueing: %s", incoming.message_id, exc)
            await trio.sleep(STORE_UNAVAILABLE_PAUSE_SECONDS)
            settle = Settle.REQUEUE
        except Exception as exc:
            # A bug in the handler itself: DEAD with a panic row when the message decoded; the
            # message goes to the DLQ, the worker goes on.
            log.exception("message %s: handler failed; rejecting to the DLQ", incoming.message_id)
            error = f"handler raised {type(exc).__name__}: {exc}"
            recorded = message is not None and await self._record_panic(message, error)
            self._observe(
                incoming.message_id, message, "panic", recorded=recorded, error=error, exc=exc,
                status=None if message is None else "DEAD", handler_failed=True,
            )  # fmt: skip
            settle = Settle.REJECT
        incoming.settle(settle)

    async def defer(
        self, incoming: Incoming, message: WorkerMessage, seconds: float, *, destination: str
    ) -> None:
        """Trio-flavoured. Send the message through the delay tier covering ``seconds``, at the
        same attempt, and ack it: its destination has its fair share of the tasks already
        (``worker.fair``). No attempt is used and nothing is written to Postgres; see
        ``worker.republish``. Never raises ``Exception``."""
        await self._republish.defer(incoming, message, seconds, destination=destination)

    def _observe(
        self, message_id: str | None, message: WorkerMessage | None, outcome: str, *,
        status: str | None = None, recorded: bool = False, duration_ms: int | None = None,
        error: str | None = None, exc: BaseException | None = None,
        handler_failed: bool = False,
    ) -> None:  # fmt: skip
        """Tell the observer what one message came to."""
        self._observer.observe(
            Outcome(
                channel_type=self._type, message_id=message_id, message=message, outcome=outcome,
                finished_at=datetime.now(UTC), status=status, recorded=recorded,
                duration_ms=duration_ms, error=error, exc=exc, handler_failed=handler_failed,
            )
        )  # fmt: skip

    def _decode(self, incoming: Incoming) -> WorkerMessage | None:
        """The message, or None (logged and observed) when the body cannot be decoded."""
        try:
            return decode_message(incoming.body)
        except msgspec.DecodeError as exc:
            log.error(
                "message %s is undecodable; rejecting to the DLQ",
                incoming.message_id, exc_info=exc,
            )  # fmt: skip
            self._observe(incoming.message_id, None, UNDECODABLE, exc=exc)
            return None

    async def _record_panic(self, message: WorkerMessage, error: str) -> bool:
        """The handler raised after decoding (docs/architecture.md §5): the delivery is ``DEAD``
        with a ``panic`` attempt row, best effort (bounded, even while shutting down); whether the
        row was written."""
        record = AttemptRecord(
            delivery_id=message.delivery_id, attempt=message.attempt, status="DEAD",
            outcome="panic", started_at=datetime.now(UTC), duration_ms=0, error=error,
            created_at=message.created_at,
        )  # fmt: skip
        with trio.CancelScope(shield=True), trio.move_on_after(FINAL_WRITE_TIMEOUT_SECONDS):
            try:
                await self._store.record_attempt(record)
                return True
            except Exception:
                log.exception("delivery %s: recording the panic failed", message.delivery_id)
        return False

    async def _handle(
        self, message: WorkerMessage, message_id: str | None, headers: Mapping[str, Any]
    ) -> Settle:
        state = await self._store.delivery_state(message.delivery_id, message.created_at)
        if state is None or state.status in TERMINAL_STATUSES or state.attempt >= message.attempt:
            # Deleted, already finished, or a copy of an attempt that was already made.
            log.debug(
                "delivery %s attempt %d: duplicate, acked", message.delivery_id, message.attempt,
                extra={"delivery_id": str(message.delivery_id), "attempt": message.attempt},
            )  # fmt: skip
            return Settle.ACK
        # The trace context the message came with: the parent of the attempt's span, and what
        # its retry copy carries, so that a delivery's attempts are siblings in one trace.
        parent = parse_traceparent(headers.get(TRACE_HEADER)) if TRACE_HEADER in headers else None
        if parent is None and not self._tracing.enabled:
            return await self._attempt_and_settle(message, message_id, state, None, None)
        with self._tracing.span(
            "notifier.attempt", parent, kind=Kind.CLIENT,
            attributes={"notifier.channel_type": self._type,
                        "notifier.destination_origin": self._destination(message),
                        "notifier.attempt": message.attempt,
                        "notifier.delivery_id": str(message.delivery_id)},
        ) as span:  # fmt: skip
            return await self._attempt_and_settle(message, message_id, state, parent, span)

    async def _attempt_and_settle(
        self, message: WorkerMessage, message_id: str | None, state: DeliveryState,
        parent: str | None, span: Span | None,
    ) -> Settle:  # fmt: skip
        """The attempt of a message that is due (in its span, when there is one): the channel's
        state, the circuit, the rate limits and the adapter's call, then the decision carried
        out."""
        started_at = datetime.now(UTC)
        t0 = trio.current_time()  # the system clock in production; a test may mock it
        if state.channel_state != "enabled":
            # A disabled or deleted channel is not attempted: the delivery ends DEAD saying
            # why, and can be replayed once the channel is enabled again.
            reason = f": {state.channel_reason}" if state.channel_reason else ""
            attempted = Attempted(
                result=Result.PERMANENT, error=f"channel {state.channel_state}{reason}",
                called=False,
            )  # fmt: skip
        else:
            attempted = await self._guarded_attempt(message, state.rate_limit_per_second)
        duration_ms = int((trio.current_time() - t0) * 1000)
        now = datetime.now(UTC)
        if attempted.defer_wait is not None:
            decision = decide_rate_limited(
                attempted.defer_wait, policy=self._policy, now=now, outcome="deferred"
            )
        elif attempted.rate_limit_wait is not None:
            decision = decide_rate_limited(attempted.rate_limit_wait, policy=self._policy, now=now)
        else:
            decision = decide(
                attempted.result, attempt=message.attempt, max_attempts=message.max_attempts,
                policy=self._policy, now=now, retry_after=attempted.retry_after,
                replayed_at=state.replayed_at,
            )  # fmt: skip
        record = AttemptRecord(
            delivery_id=message.delivery_id,
            attempt=message.attempt,
            status=decision.status,
            outcome=decision.outcome,
            started_at=started_at,
            duration_ms=duration_ms,
            status_code=attempted.status_code,
            error=attempted.error,
            response_excerpt=attempted.response_excerpt,
            next_attempt_at=decision.next_attempt_at,
            disable_channel=attempted.disable_channel,
            created_at=message.created_at,
            trace_id=None if span is None else span.trace_id,
            span_id=None if span is None else span.span_id,
        )
        if span is not None:
            span.set("notifier.outcome", decision.outcome)
            span.set("http.response.status_code", attempted.status_code)
        # The attempt happened: carry the decision out even while shutting down (bounded).
        with trio.CancelScope(shield=True), trio.move_on_after(FINAL_WRITE_TIMEOUT_SECONDS):
            return await self._carry_out(message, message_id, decision, record, attempted, parent)
        log.warning(
            "delivery %s attempt %d: settling timed out; requeueing",
            message.delivery_id, message.attempt,
            extra={"delivery_id": str(message.delivery_id), "attempt": message.attempt},
        )  # fmt: skip
        return Settle.REQUEUE

    async def _guarded_attempt(
        self, message: WorkerMessage, channel_rate: float | None
    ) -> Attempted:
        """``_attempt`` behind the destination's circuit: deferred while it is open (not
        attempted, no statement), the probe when one is due, and what the attempt showed of
        the receiver counted (a statement only when the circuit is in trouble or it could not
        be reached)."""
        if self._circuits is None:
            return await self._attempt(message, channel_rate)
        destination = self._destination(message)
        admission = await self._circuits.admit(destination)
        if admission.gate is Gate.DEFER:
            return Attempted(
                result=Result.RETRIABLE, defer_wait=admission.wait, called=False,
                error=f"circuit open: {destination} could not be reached; not attempted",
            )  # fmt: skip
        probe = admission.gate is Gate.PROBE
        attempted = await self._attempt(message, channel_rate)
        if attempted.called and attempted.result is not Result.PANIC:
            if attempted.unreachable:
                await self._circuits.unreachable(destination, probe=probe)
            else:
                await self._circuits.reached(destination, probe=probe)
        return attempted

    async def _rate_limit_wait(self, message: WorkerMessage, channel_rate: float | None) -> float:
        """Take a token of every bucket the message needs (the channel's, the adapter's), all
        or none, in one statement; 0.0 when taken (or none is needed), else the seconds to wait.
        A message that needs none costs nothing, and neither does one whose buckets were
        refused a moment ago and cannot have a token yet (``Refusals``)."""
        buckets: list[Bucket] = []
        if channel_rate is not None:
            buckets.append(Bucket.per_second(f"channel:{message.channel_id}", channel_rate))
        if self._limiter is not None:
            buckets.extend(self._limiter.rate_buckets(message))
        if not buckets:
            return 0.0
        if self._limits is None:
            raise RuntimeError("rate limits apply but the handler has no buckets to take them")
        key = tuple(buckets)
        asked_at = trio.current_time()
        if wait := self._refusals.wait(key, asked_at):
            return wait
        wait = await self._limits.take_tokens(buckets)
        if wait > 0:
            self._refusals.refused(key, asked_at, wait)
        return wait

    async def _attempt(self, message: WorkerMessage, channel_rate: float | None) -> Attempted:
        """Take the rate limits, then call the adapter; turn whatever happens into
        ``Attempted``. A store failure propagates (the message goes back to the queue)."""
        try:
            wait = await self._rate_limit_wait(message, channel_rate)
            if wait > 0:
                return Attempted(
                    result=Result.RETRIABLE, rate_limit_wait=wait,
                    error=f"rate limited: wait {wait:.3g} s", called=False,
                )  # fmt: skip
            # trio.fail_after's scope, without its two generator-based context managers
            with trio.CancelScope(deadline=trio.current_time() + self._limit) as limit:
                receipt = await self._adapter.deliver(message)
        except StoreError:
            raise  # the buckets could not be read: handled like any store failure
        except trio.TooSlowError:  # a limit of the adapter's own, cut as the worker's is
            return self._timed_out()
        except RetriableError as exc:
            return Attempted(
                result=Result.RETRIABLE, error=str(exc), status_code=exc.status_code,
                retry_after=exc.retry_after, unreachable=exc.unreachable,
            )  # fmt: skip
        except PermanentError as exc:
            return Attempted(
                result=Result.PERMANENT, error=str(exc), status_code=exc.status_code,
                disable_channel=exc.disable_channel,
            )  # fmt: skip
        except DeliveryError as exc:
            return Attempted(result=Result.PERMANENT, error=str(exc), status_code=exc.status_code)
        except Exception as exc:
            log.exception("delivery %s: adapter raised", message.delivery_id)
            return Attempted(
                result=Result.PANIC, error=f"adapter raised {type(exc).__name__}: {exc}", exc=exc
            )
        if limit.cancelled_caught:
            return self._timed_out()
        if receipt is None:
            return Attempted(result=Result.DELIVERED)
        return Attempted(
            result=Result.DELIVERED, status_code=receipt.status_code,
            response_excerpt=receipt.response_excerpt,
        )  # fmt: skip

    def _timed_out(self) -> Attempted:
        return Attempted(
            result=Result.RETRIABLE, error=f"timed out after {self._timeout:g} s",
            unreachable=True,
        )  # fmt: skip

    async def _carry_out(
        self, message: WorkerMessage, message_id: str | None, decision: Decision,
        record: AttemptRecord, attempted: Attempted, traceparent: str | None,
    ) -> Settle:  # fmt: skip
        """Retry copy first (confirmed), then the record, then the settlement of the original.
        The retry copy carries ``traceparent``, the context the original came with."""
        if decision.retry_tier is not None:
            await self._republish.retry(
                message, decision.retry_tier, decision.retry_attempt, traceparent
            )

        def observe(recorded: bool) -> None:
            self._observe(
                message_id, message, decision.outcome, status=decision.status,
                recorded=recorded, duration_ms=record.duration_ms if attempted.called else None,
                error=attempted.error, exc=attempted.exc,
            )  # fmt: skip

        try:
            await self._store.record_attempt(record)
        except StoreError as exc:
            log.warning(
                "delivery %s attempt %d: %s, but recording it failed (%r); requeueing",
                message.delivery_id, message.attempt, decision.outcome, exc,
            )  # fmt: skip
            observe(recorded=False)
            return Settle.REQUEUE
        observe(recorded=True)
        return decision.settle
