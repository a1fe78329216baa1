"""Failure alerts of dead deliveries, off the delivery path (docs/architecture.md §5).

The worker's ``AlertObserver`` puts each recorded ``DEAD`` outcome into a bounded buffer
without waiting (when full, the oldest alert is dropped and counted); ``Alerts.run``, one
background task per worker process, takes them in order, reads the delivery's latest attempts
and its channel's name in one statement, builds the ``AlertContext``, reports it to Sentry
(tags and a ``dead_delivery`` context) and hands it to the operator webhook's buffer, whose own
task POSTs it with a few tries. Neither task can slow a delivery or change its settlement: a
broken alert sink, or a store that cannot tell the history, costs at most the alert (or its
history).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Protocol

import trio

from notifier.alerts.buffer import DropOldest
from notifier.alerts.context import AlertContext, build_context, short_error
from notifier.alerts.webhook import WebhookAlertSink, send_with_tries
from notifier.config import AlertsConfig, alert_secret
from notifier.metrics import Metrics
from notifier.observability import Reporter
from notifier.store.rows import DeadHistory
from notifier.worker.observe import Outcome

log = logging.getLogger("notifier.alerts")

SENTRY_CONTEXT = "dead_delivery"
# Reasons an alert is dropped (notifier_alerts_dropped_total{reason}).
DROP_REASONS = ("buffer_full", "failed", "stopped")
SINKS = ("sentry", "webhook")


class AlertHistory(Protocol):
    async def dead_history(
        self, delivery_id: uuid.UUID, created_at: datetime, channel_id: uuid.UUID, limit: int
    ) -> DeadHistory:
        """Trio-flavoured. The delivery's channel name and its latest ``limit`` attempts."""
        ...


class AlertSink(Protocol):
    name: str

    async def send(self, context: AlertContext) -> None:
        """Trio-flavoured. One try; ``AlertNotSent`` when it failed."""
        ...

    async def aclose(self) -> None: ...


def dead(outcome: Outcome) -> bool:
    """Whether ``outcome`` ended its delivery ``DEAD`` (recorded so): what an alert is for."""
    return outcome.recorded and outcome.status == "DEAD" and outcome.message is not None


class Alerts:
    """The alerts of one process. ``observer()`` is the worker groups' ``OutcomeObserver``;
    ``run`` the background task (until ``close`` and what is buffered is sent or dropped).

    ``reporter``: where the Sentry event goes (None: no Sentry); ``sink``: the operator
    webhook (None: none). ``history``: the store (one bounded statement per alert).
    """

    def __init__(
        self,
        settings: AlertsConfig,
        history: AlertHistory,
        *,
        reporter: Reporter | None = None,
        sink: AlertSink | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._settings = settings
        self._history = history
        self._reporter = reporter
        self._sink = sink
        self._metrics = metrics
        if metrics is not None:
            for reason in DROP_REASONS:
                metrics.alerts_dropped.labels(reason)
            for name in SINKS:
                metrics.alerts_sent.labels(name)
        self._dead = DropOldest[Outcome](settings.buffer_size, lambda _: self._overflowed())
        self._outgoing = DropOldest[AlertContext](
            settings.buffer_size, lambda _: self._overflowed()
        )
        self._closing = False
        self._done = trio.Event()
        self._open = 0  # alerts taken and not yet sent to every sink or dropped
        self._idle = trio.Event()

    @property
    def reports_to_sentry(self) -> bool:
        return self._reporter is not None

    def observer(self) -> AlertObserver:
        return AlertObserver(self)

    def put_nowait(self, outcome: Outcome) -> None:
        """Buffer the alert of a dead delivery; never waits (a full buffer drops its oldest)."""
        if self._closing:
            self._dropped("stopped")
            return
        self._open += 1
        self._dead.put_nowait(outcome)

    def close(self) -> None:
        """Take no more alerts; ``run`` sends what is buffered (no retries) and returns."""
        self._closing = True
        self._dead.close()

    async def drain(self, timeout_seconds: float) -> None:
        """Trio-flavoured. ``close``, then wait until ``run`` has sent or dropped what was
        buffered, at most ``timeout_seconds``."""
        self.close()
        with trio.move_on_after(timeout_seconds):
            await self._done.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Trio-flavoured. Build, report and send alerts until ``close``d and drained."""
        try:
            await self._run(task_status)
        finally:
            self._done.set()

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        try:
            async with trio.open_nursery() as nursery:
                if self._sink is not None:
                    nursery.start_soon(self._send_all, self._sink)
                task_status.started()
                try:
                    while True:
                        try:
                            outcome = await self._dead.get()
                        except trio.EndOfChannel:
                            break
                        await self._one(outcome)
                finally:
                    self._outgoing.close()
        finally:
            if self._sink is not None:
                with trio.CancelScope(shield=True):
                    await self._sink.aclose()

    async def _one(self, outcome: Outcome) -> None:
        """Build one alert and pass it on; never raises ``Exception``."""
        message = outcome.message
        assert message is not None
        try:
            history = DeadHistory()
            with trio.move_on_after(self._settings.timeout_seconds):
                try:
                    history = await self._history.dead_history(
                        message.delivery_id, message.created_at, message.channel_id,
                        self._settings.history_attempts,
                    )  # fmt: skip
                except Exception as exc:  # the alert goes out without its history
                    log.warning(
                        "alert of delivery %s: reading its attempts failed: %s",
                        message.delivery_id, exc,
                    )  # fmt: skip
            context = build_context(
                outcome, history, history_attempts=self._settings.history_attempts,
                payload_excerpt_bytes=self._settings.payload_excerpt_bytes,
            )  # fmt: skip
        except Exception:
            log.exception("alert of delivery %s: building it failed", message.delivery_id)
            self._dropped("failed")
            self._finished()
            return
        if self._reporter is not None:
            try:
                self._reporter.report(
                    summary(outcome), tags=context.tags(), exc=outcome.exc,
                    contexts={SENTRY_CONTEXT: context.as_json()},
                )  # fmt: skip
                self._sent("sentry")
            except Exception:  # a reporter's failure costs its report, not the webhook's
                log.exception("alert of delivery %s: reporting it failed", message.delivery_id)
        if self._sink is not None:
            self._outgoing.put_nowait(context)
        else:
            self._finished()

    async def _send_all(self, sink: AlertSink) -> None:
        """Trio-flavoured. POST each alert, with tries; what fails is dropped and counted."""
        s = self._settings
        while True:
            try:
                context = await self._outgoing.get()
            except trio.EndOfChannel:
                return
            try:
                sent, failure = await send_with_tries(
                    lambda: sink.send(context), max_tries=s.max_tries,  # noqa: B023
                    backoff_seconds=s.retry_backoff_seconds, stopping=lambda: self._closing,
                )  # fmt: skip
            except Exception:
                log.exception("alert of delivery %s: sending it failed", context.delivery_id)
                sent, failure = False, "the sink raised"
            if sent:
                self._sent(sink.name)
            else:
                log.warning(
                    "alert of delivery %s not sent to the %s: %s",
                    context.delivery_id, sink.name, failure,
                    extra={"delivery_id": str(context.delivery_id)},
                )  # fmt: skip
                self._dropped("failed")
            self._finished()

    async def wait_idle(self) -> None:
        """Trio-flavoured. Wait until every alert taken so far was sent or dropped."""
        while self._open > 0:
            if self._idle.is_set():
                self._idle = trio.Event()
            await self._idle.wait()

    def _finished(self) -> None:
        self._open -= 1
        if self._open == 0:
            self._idle.set()

    def _overflowed(self) -> None:
        self._dropped("buffer_full")
        self._finished()

    def _sent(self, sink: str) -> None:
        if self._metrics is not None:
            self._metrics.alerts_sent.labels(sink).inc()

    def _dropped(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.alerts_dropped.labels(reason).inc()


def summary(outcome: Outcome) -> str:
    """The Sentry event's message."""
    if outcome.handler_failed:
        return "worker handler failed; delivery dead"
    if outcome.outcome == "panic":
        return "adapter raised; delivery dead"
    return f"delivery dead: {short_error(outcome.error)}"


def open_alerts(
    settings: AlertsConfig,
    history: AlertHistory,
    environ: Mapping[str, str],
    *,
    reporter: Reporter | None,
    metrics: Metrics | None,
) -> Alerts:
    """The alerts of a worker process as ``[alerts]`` configures them: to ``reporter`` (Sentry;
    None: not) and, when ``dead_webhook_url`` is set, to that webhook, signed with the secret
    ``dead_webhook_secret_env`` names (a ``ConfigError`` when it is missing or malformed)."""
    sink = None
    if settings.dead_webhook_url:
        sink = WebhookAlertSink(
            settings.dead_webhook_url, alert_secret(settings, environ),
            timeout_seconds=settings.timeout_seconds,
        )  # fmt: skip
    return Alerts(settings, history, reporter=reporter, sink=sink, metrics=metrics)


class AlertObserver:
    """The worker's ``OutcomeObserver`` for alerts: each dead delivery's outcome goes into the
    alerts' buffer, without waiting and without I/O."""

    def __init__(self, alerts: Alerts) -> None:
        self._alerts = alerts

    def observe(self, outcome: Outcome) -> None:
        if dead(outcome):
            self._alerts.put_nowait(outcome)
