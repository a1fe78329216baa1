"""Prometheus metrics of one notifier process, served at ``GET /metrics`` by the ingest app.

Counters and histograms are per process: each counts what its own process did (its ingest, its
relay, its worker groups), so a deployment of several processes sums them. The scrape-time
gauges (outbox depth, open deliveries, broker queue depths; ``metrics_scrape``) are global
values read from Postgres and RabbitMQ when ``/metrics`` is scraped: every process that serves
``/metrics`` reports the same values (aggregate them with ``max``, not ``sum``).

In a launch of several processes (``notifier run --processes N``), the parent gives every
process the same directory in ``$PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's multiprocess mode):
each process writes its counters and histograms there, and ``/metrics``, whichever process
answers it, reports the sum over the whole launch (the counts of a process that has exited
included, so they never go down); ``notifier_worker_in_flight`` is summed over the live
processes. Series keep their names and labels; none has a ``pid`` label but the process
metrics below.

The standard process metrics (``process_resident_memory_bytes``, ``process_cpu_seconds_total``,
``process_open_fds``, ``process_max_fds``, ``process_virtual_memory_bytes``,
``process_start_time_seconds``; Linux, read from ``/proc``) describe one process, so they are
never summed: a process on its own reports its own, read when ``/metrics`` is scraped; in a
launch every process reports its own as gauges with a ``pid`` label (multiprocess mode
``liveall``), written every ``PROCESS_METRICS_INTERVAL_SECONDS`` and when it answers a scrape,
and the series of a process that has exited leave with it.

Updating a metric is a plain in-process call (a lock and an addition): no I/O and no bridge
crossing per message. Labels are bounded: channel type, outcome, status, queue kind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from notifier.metrics_scrape import ScrapeTime

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the text exposition format
OUTCOMES = ("delivered", "retry", "rate_limited", "deferred", "dead", "panic")

# An attempt is bounded by workers.<type>.timeout_seconds (10 s by default).
ATTEMPT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Event created → delivered spans the retries: seconds to hours.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400)
RELAY_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)
# An ingest request is a few milliseconds; a group commit waiting on a slow Postgres, seconds.
INGEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# Set by the parent of a launch; prometheus-client reads it when it is first imported.
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# In a launch, each process writes its process metrics this often (and when it answers /metrics).
PROCESS_METRICS_INTERVAL_SECONDS = 5.0


class _ProcessGauges:
    """In a launch: this process's process metrics (prometheus-client's ``ProcessCollector``,
    read from ``/proc``) copied into gauges of the shared directory, one series per process
    (``liveall`` adds the ``pid`` label; the launch removes a process's files when it exits)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._source = ProcessCollector(registry=None)
        self._registry = registry
        self._gauges: dict[str, Gauge] = {}

    def refresh(self) -> None:
        for family in self._source.collect():
            for sample in family.samples:
                gauge = self._gauges.get(sample.name)
                if gauge is None:
                    gauge = self._gauges[sample.name] = Gauge(
                        sample.name, family.documentation, registry=self._registry,
                        multiprocess_mode="liveall",
                    )  # fmt: skip
                gauge.set(sample.value)


PORTAL_ENTRY_OUTCOMES = ("opened", "invalid", "expired", "revoked")


class Metrics:
    """Every metric of one process, on a registry of its own (several services may share a
    process, as the tests do). Pass one instance to the ingest app, the relay and the worker
    groups; ``render()`` is the ``/metrics`` body.

    In a process of a launch (``$PROMETHEUS_MULTIPROC_DIR`` set) ``render()`` reports the
    whole launch; one ``Metrics`` per process then, as its values live in per-process files."""

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        self.multiproc_dir = environ.get(MULTIPROC_DIR_ENV) or None
        self.registry = CollectorRegistry()
        r = self.registry
        self.events_ingested = Counter(
            "notifier_events_ingested", "Events stored (replays of an idempotency key excluded).",
            ["source"], registry=r,
        )  # fmt: skip
        self.ingest_unauthorized = Counter(
            "notifier_ingest_unauthorized",
            "Requests of the HTTP API refused for their API key: `missing_key`, `unknown_key` "
            "(401), `limited` (429: too many 401s from the client's address).",
            ["reason"], registry=r,
        )  # fmt: skip
        self.ingest_request_duration = Histogram(
            "notifier_ingest_request_duration_seconds",
            "Time to answer POST /v1/events or /v1/events/batch (headers read to answer ready), "
            "by route and HTTP status.",
            ["route", "status"], buckets=INGEST_BUCKETS, registry=r,
        )  # fmt: skip
        self.delivery_attempts = Counter(
            "notifier_delivery_attempts", "Delivery attempts recorded, by outcome.",
            ["channel_type", "outcome"], registry=r,
        )  # fmt: skip
        self.deliveries_dead = Counter(
            "notifier_deliveries_dead", "Deliveries that ended DEAD.", ["channel_type"],
            registry=r,
        )  # fmt: skip
        self.delivery_attempt_duration = Histogram(
            "notifier_delivery_attempt_duration_seconds",
            "Time one adapter call took (rate-limited attempts, which make none, excluded).",
            ["channel_type"], buckets=ATTEMPT_BUCKETS, registry=r,
        )  # fmt: skip
        self.delivery_latency = Histogram(
            "notifier_delivery_latency_seconds",
            "Event created to delivery delivered, retries included.",
            ["channel_type"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.relay_batch_size = Histogram(
            "notifier_relay_batch_size",
            "Outbox rows claimed per relay batch (empty ones excluded).",
            buckets=BATCH_BUCKETS, registry=r,
        )  # fmt: skip
        self.relay_lag = Histogram(
            "notifier_relay_lag_seconds",
            "Outbox row written to its publish confirmed by RabbitMQ.",
            buckets=RELAY_LAG_BUCKETS, registry=r,
        )  # fmt: skip
        self.relay_rows_published = Counter(
            "notifier_relay_rows_published", "Outbox rows published, confirmed and deleted.",
            registry=r,
        )  # fmt: skip
        self.worker_in_flight = Gauge(
            "notifier_worker_in_flight", "Messages a worker group is handling right now.",
            ["channel_type"], registry=r, multiprocess_mode="livesum",
        )  # fmt: skip
        self.deliveries_deferred = Counter(
            "notifier_deliveries_deferred",
            "Messages sent through a delay tier, attempt unused, because their destination had "
            "its fair share of the worker tasks.",
            ["channel_type"], registry=r,
        )  # fmt: skip
        self.worker_waiting = Gauge(
            "notifier_worker_waiting",
            "Messages waiting, holding no task, for a slot of their destination's fair share.",
            ["channel_type"], registry=r, multiprocess_mode="livesum",
        )  # fmt: skip
        # Failure alerts of dead deliveries (`notifier.alerts`).
        self.alerts_sent = Counter(
            "notifier_alerts_sent",
            "Alerts of dead deliveries sent, by sink: `sentry` (handed to the SDK), `webhook` "
            "(the operator webhook answered 2xx).",
            ["sink"], registry=r,
        )  # fmt: skip
        self.alerts_dropped = Counter(
            "notifier_alerts_dropped",
            "Alerts of dead deliveries dropped: `buffer_full` (the oldest waiting, for a newer "
            "one), `failed` (every try of the operator webhook failed), `stopped` (after the "
            "process began to stop).",
            ["reason"], registry=r,
        )  # fmt: skip
        # The ingest server's connections (`notifier.ingest.connection`).
        self.ingest_connections_open = Gauge(
            "notifier_ingest_connections_open", "Connections the ingest server holds open.",
            registry=r, multiprocess_mode="livesum",
        )  # fmt: skip
        self.ingest_connections_refused = Counter(
            "notifier_ingest_connections_refused",
            "New connections closed at once, over ingest.max_connections (total) or "
            "ingest.max_connections_per_address (per_address).",
            ["reason"], registry=r,
        )  # fmt: skip
        self.ingest_connections_closed = Counter(
            "notifier_ingest_connections_closed",
            "Connections closed by the server whatever they were doing: a write that missed "
            "ingest.write_timeout_seconds, or still open at the end of the shutdown grace.",
            ["reason"], registry=r,
        )  # fmt: skip
        # The customer portal's links opened (`notifier.console.portal`).
        self.portal_entries = Counter(
            "notifier_portal_entries",
            "Portal links opened: `opened` (a session started), `invalid` (no such token: 403), "
            "`expired` or `revoked` (410).",
            ["outcome"], registry=r,
        )  # fmt: skip
        for outcome in PORTAL_ENTRY_OUTCOMES:
            self.portal_entries.labels(outcome)
        for reason in ("total", "per_address"):
            self.ingest_connections_refused.labels(reason)
        for reason in ("write_timeout", "shutdown"):
            self.ingest_connections_closed.labels(reason)
        self.scrape_time = ScrapeTime()
        r.register(self.scrape_time)
        self._process: _ProcessGauges | None = None
        if self.multiproc_dir is None:
            ProcessCollector(registry=r)
        else:
            self._process = _ProcessGauges(r)
            self._process.refresh()

    def refresh_process_metrics(self) -> None:
        """In a launch, write this process's process metrics to the shared directory (a few
        small reads of ``/proc``); on its own, nothing (they are read at scrape time)."""
        if self._process is not None:
            self._process.refresh()

    def render(self) -> bytes:
        """The text exposition (``CONTENT_TYPE``) of every metric."""
        if self.multiproc_dir is None:
            return generate_latest(self.registry)
        self.refresh_process_metrics()
        launch = CollectorRegistry()
        MultiProcessCollector(launch, self.multiproc_dir)  # type: ignore[no-untyped-call]
        launch.register(self.scrape_time)
        return generate_latest(launch)

    def start_channel_type(self, channel_type: str) -> None:
        """Export a worker group's series at zero from the start, so ``rate()`` and
        ``increase()`` see the first increment."""
        for outcome in OUTCOMES:
            self.delivery_attempts.labels(channel_type, outcome)
        self.deliveries_dead.labels(channel_type)
        self.delivery_attempt_duration.labels(channel_type)
        self.delivery_latency.labels(channel_type)
        self.worker_in_flight.labels(channel_type)
        self.deliveries_deferred.labels(channel_type)
        self.worker_waiting.labels(channel_type)

    def observe_relay_batch(
        self, claimed: int, published: Sequence[datetime], confirmed_at: datetime
    ) -> None:
        """One relay batch: ``claimed`` rows, of which rows written at ``published`` were
        confirmed at ``confirmed_at``."""
        self.relay_batch_size.observe(claimed)
        for created_at in published:
            self.relay_lag.observe(seconds_between(created_at, confirmed_at))
        self.relay_rows_published.inc(len(published))


async def run_process_metrics(
    metrics: Metrics, interval_seconds: float = PROCESS_METRICS_INTERVAL_SECONDS
) -> None:
    """Trio-flavoured. In a launch, keep this process's process metrics fresh in the shared
    directory until cancelled; on its own, return at once."""
    if metrics.multiproc_dir is None:
        return
    while True:
        metrics.refresh_process_metrics()
        await trio.sleep(interval_seconds)


def seconds_between(start: datetime, end: datetime) -> float:
    """``end - start`` in seconds, never negative (the two may come from different clocks); a
    time without a zone counts as UTC."""
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    return max((end - start).total_seconds(), 0.0)
