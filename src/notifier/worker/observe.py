"""What the worker tells the world about each message it handled: the ``Outcome`` record, the
``OutcomeObserver`` seam, and the three observers notifier ships — the Prometheus metrics, the
one ``notifier.worker`` line per attempt (its format is documented in the README), and the
Sentry event of a dead delivery or a failure.

The handler decides and carries out (docs/architecture.md §5); it only builds one ``Outcome`` per
message and hands it on. What each effect makes of it lives here, one class per effect, so a new
effect (a trace, an audit feed) is one more observer rather than one more call inside the handler.
The observers are composed where the worker group is built (``worker.group.outcome_observers``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Protocol

import msgspec

from notifier.messages import WorkerMessage
from notifier.metrics import Metrics, seconds_between
from notifier.observability import Reporter

log = logging.getLogger("notifier.worker")

# The outcome of a message whose body could not be decoded: no delivery, no attempt row.
UNDECODABLE = "undecodable"
# A message whose destination had its fair share of the tasks, sent through a delay tier at the
# same attempt (``worker.fair``): no attempt, no row.
DEFERRED = "deferred"


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What handling one message came to: one per attempt, and one per message that never
    reached an attempt because its body could not be decoded or the handler itself raised.

    ``outcome`` is the attempt row's (``delivered``, ``retry``, ``rate_limited``, ``dead``,
    ``panic``), ``UNDECODABLE``, or ``DEFERRED`` (no row). ``recorded`` says whether that row
    was written: an attempt whose record failed is made again once its message is redelivered,
    so it counts for nothing yet.
    """

    channel_type: str  # the worker group's
    message_id: str | None  # the broker message's
    message: WorkerMessage | None  # None when the body did not decode
    outcome: str
    finished_at: datetime
    status: str | None = None  # the delivery's status as recorded; None leaves it as it was
    recorded: bool = False
    duration_ms: int | None = None  # the adapter call's; None when no call was made
    error: str | None = None
    exc: BaseException | None = None
    handler_failed: bool = False  # the handler itself raised, not the adapter


class OutcomeObserver(Protocol):
    """Told of every ``Outcome``, synchronously and without I/O of its own (it runs inside the
    shielded settlement of a message, so it must be quick and must not block)."""

    def observe(self, outcome: Outcome) -> None: ...


class Observers:
    """Several observers as one, told in order. One that raises is logged and skipped: observing
    never changes what happens to a message (its record and settlement are already decided)."""

    def __init__(self, *observers: OutcomeObserver) -> None:
        self._observers = observers

    def observe(self, outcome: Outcome) -> None:
        for observer in self._observers:
            try:
                observer.observe(outcome)
            except Exception:
                log.exception("observing outcome %s of %s failed", outcome.outcome, observer)


class MetricsObserver:
    """The attempt counters and histograms of ``notifier.metrics``, for recorded attempts.

    The series' children are looked up once per label values and kept: a ``labels()`` call
    per message is a lock and a dict lookup of its own, and the values are a handful."""

    def __init__(self, metrics: Metrics, channel_type: str) -> None:
        self._metrics = metrics
        metrics.start_channel_type(channel_type)
        self._children: dict[tuple[int | str, ...], Any] = {}

    def _child(self, series: Any, *labels: str) -> Any:
        """``series.labels(*labels)``, kept by the series (the process's own, for its life)
        and the label values."""
        key: tuple[int | str, ...] = (id(series), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = series.labels(*labels)
        return child

    def observe(self, outcome: Outcome) -> None:
        m, kind = self._metrics, outcome.channel_type
        if outcome.outcome == DEFERRED:
            self._child(m.deliveries_deferred, kind).inc()
            return
        if not outcome.recorded or outcome.message is None:
            return
        self._child(m.delivery_attempts, kind, outcome.outcome).inc()
        if outcome.duration_ms is not None:
            self._child(m.delivery_attempt_duration, kind).observe(outcome.duration_ms / 1000)
        if outcome.status == "DEAD":
            self._child(m.deliveries_dead, kind).inc()
        elif outcome.status == "DELIVERED":
            latency = seconds_between(outcome.message.created_at, outcome.finished_at)
            self._child(m.delivery_latency, kind).observe(latency)


class LogObserver:
    """The one ``notifier.worker`` INFO line per recorded attempt, with the delivery's ids as
    fields (a failure of the handler itself is logged with its traceback where it happens).
    Nothing is built for it when the logger would drop it (a level above INFO)."""

    def observe(self, outcome: Outcome) -> None:
        message = outcome.message
        if not outcome.recorded or message is None or outcome.handler_failed:
            return
        if not log.isEnabledFor(logging.INFO):
            return
        log.info(
            "delivery %s attempt %d: %s%s", message.delivery_id, message.attempt,
            outcome.outcome, f" ({outcome.error})" if outcome.error else "",
            extra={
                "delivery_id": str(message.delivery_id),
                "event_id": str(message.event_id),
                "channel_id": str(message.channel_id),
                "tenant_id": str(message.tenant_id),
                "channel_type": message.channel_type,
                "attempt": message.attempt,
                "outcome": outcome.outcome,
            },
        )  # fmt: skip


class SentryObserver:
    """One event for each dead delivery, each failure of the handler and each undecodable body.

    Only ids, the channel type, the attempt number and the outcome travel as tags: never a
    channel's config (it holds secrets) or an event's payload. With ``alerts_report_dead``, a
    delivery recorded ``DEAD`` is left to the failure alerts (``notifier.alerts``), whose event
    carries its context.
    """

    def __init__(self, reporter: Reporter, *, alerts_report_dead: bool = False) -> None:
        self._reporter = reporter
        self._alerts_report_dead = alerts_report_dead

    def observe(self, outcome: Outcome) -> None:
        message = outcome.message
        if (
            self._alerts_report_dead
            and outcome.recorded
            and outcome.status == "DEAD"
            and message is not None
        ):
            return
        tags = {"channel_type": outcome.channel_type, "message_id": str(outcome.message_id)}
        if outcome.outcome == UNDECODABLE:
            self._reporter.report("undecodable message", tags=tags, exc=outcome.exc)
        elif outcome.handler_failed:
            if message is not None:
                tags |= {"delivery_id": str(message.delivery_id), "attempt": str(message.attempt)}
            self._reporter.report("worker handler failed", tags=tags, exc=outcome.exc)
        elif outcome.recorded and outcome.status == "DEAD" and message is not None:
            self._reporter.report(
                f"delivery dead: {outcome.error}" if outcome.outcome == "dead"
                else "adapter raised; delivery dead",
                tags={
                    "delivery_id": str(message.delivery_id),
                    "event_id": str(message.event_id),
                    "channel_id": str(message.channel_id),
                    "tenant_id": str(message.tenant_id),
                    "channel_type": message.channel_type,
                    "attempt": str(message.attempt),
                    "outcome": outcome.outcome,
                },
                exc=outcome.exc,
            )  # fmt: skip
