"""The gauges of ``/metrics`` read when it is scraped (docs/architecture.md §6, README
*Metrics*): the outbox depth, the open deliveries, the history's days, the destinations'
circuits, the channels notifier disabled (one statement to Postgres), the broker's queue depths
and consumers (cached a few seconds), and the readiness ``/readyz`` would answer. Every process
that serves ``/metrics`` reports the same global values (readiness aside: its own)."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from notifier.broker.base import QueueCounts
from notifier.broker.topology import dead_queue, main_queue, retry_queue
from notifier.errors import BrokerError, StoreError
from notifier.store.rows import MetricsSnapshot

if TYPE_CHECKING:
    from notifier.metrics import Metrics

log = logging.getLogger("notifier.metrics")

# How long the broker's queue depths are reused, so frequent scrapes do not hammer RabbitMQ.
QUEUE_DEPTHS_CACHE_SECONDS = 5.0


ReadSnapshot = Callable[[], Awaitable[MetricsSnapshot]]
ReadQueueDepths = Callable[[Sequence[str]], Awaitable[Mapping[str, QueueCounts]]]


@dataclass(frozen=True)
class BrokerQueue:
    """A queue whose depth ``/metrics`` reports, with its labels."""

    name: str
    channel_type: str
    kind: str  # main, retry or dead


def broker_queues(channel_types: Iterable[str], tiers_seconds: Sequence[int]) -> list[BrokerQueue]:
    """The work queue, every delay tier and the dead-letter queue of each channel type."""
    queues = []
    for t in channel_types:
        queues.append(BrokerQueue(main_queue(t), t, "main"))
        queues.extend(BrokerQueue(retry_queue(t, s), t, "retry") for s in tiers_seconds)
        queues.append(BrokerQueue(dead_queue(t), t, "dead"))
    return queues


# notifier_destination_circuit_state's values.
CIRCUIT_STATE_VALUES = {"closed": 0.0, "open": 1.0, "half_open": 2.0}


class ScrapeTime(Collector):
    """The gauges read at scrape time. A source that could not be read leaves its series out
    (the broker's absence is said by ``notifier_broker_up 0``)."""

    def __init__(self) -> None:
        self.snapshot: MetricsSnapshot | None = None
        self.database_up: bool | None = None  # None: not read yet
        self.broker_up: bool | None = None  # None: this process does not read the broker
        self.queue_depths: list[tuple[BrokerQueue, int]] = []
        self.queue_consumers: list[tuple[BrokerQueue, int]] = []
        self.ready: bool | None = None  # None: readiness is not checked here

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "notifier_outbox_depth", "Outbox rows not yet published (read from Postgres)."
            ),
            GaugeMetricFamily(
                "notifier_open_deliveries",
                "Deliveries not finished yet, by status (read from Postgres).",
                labels=["status"],
            ),
            GaugeMetricFamily(
                "notifier_oldest_open_delivery_age_seconds",
                "Seconds since the open delivery that changed least recently last changed.",
            ),
            GaugeMetricFamily(
                "notifier_history_days_overdue",
                "Days of history (events, deliveries, attempts) that ended more than "
                "maintenance.retention_days ago and are still kept: a delivery of theirs is not "
                "finished, or no maintenance role runs (read from Postgres).",
            ),
            GaugeMetricFamily(
                "notifier_history_partitions_ahead_seconds",
                "How far ahead of now the history's daily partitions reach; maintenance keeps "
                "7 days made ahead, and ingest fails once it reaches 0 (read from Postgres).",
            ),
            GaugeMetricFamily(
                "notifier_destination_circuit_state",
                "A destination's circuit breaker: 0 closed, 1 open, 2 half-open (read from "
                "Postgres; those not closed or changed in the last 10 minutes).",
                labels=["channel_type", "destination"],
            ),
            GaugeMetricFamily(
                "notifier_broker_up", "1 when RabbitMQ answered the queue depth read, else 0."
            ),
            GaugeMetricFamily(
                "notifier_queue_messages",
                "Ready messages in a RabbitMQ queue (main, retry tier or dead-letter queue).",
                labels=["channel_type", "queue", "kind"],
            ),
            GaugeMetricFamily(
                "notifier_queue_consumers",
                "Consumers of a RabbitMQ queue (a worker group consumes its main queue only).",
                labels=["channel_type", "queue", "kind"],
            ),
            GaugeMetricFamily(
                "notifier_database_up",
                "1 when Postgres answered the scrape's read, else 0.",
            ),
            GaugeMetricFamily(
                "notifier_channels_auto_disabled",
                "Channels disabled by notifier (their receiver said gone, or failing too long), "
                "not by a PATCH, every tenant's (read from Postgres).",
                labels=["channel_type"],
            ),
            GaugeMetricFamily(
                "notifier_fifo_lag_seconds",
                "A FIFO channel's lag: seconds since the event of its oldest unfinished delivery "
                "was accepted (read from Postgres; the 50 channels furthest behind).",
                labels=["channel_type", "channel_id"],
            ),
            GaugeMetricFamily(
                "notifier_fifo_backlog",
                "A FIFO channel's unfinished deliveries (the same 50 channels).",
                labels=["channel_type", "channel_id"],
            ),
            GaugeMetricFamily(
                "notifier_ready",
                "1 when this process's readiness (GET /readyz: Postgres, its schema, RabbitMQ) "
                "is ready, else 0.",
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        (
            outbox, open_, oldest, overdue, ahead, circuits, broker_up, queues, consumers,
            database_up, disabled, fifo_lag, fifo_backlog, ready,
        ) = self._families()  # fmt: skip
        if self.database_up is not None:
            database_up.add_metric([], 1.0 if self.database_up else 0.0)
            yield database_up
        if self.ready is not None:
            ready.add_metric([], 1.0 if self.ready else 0.0)
            yield ready
        if (s := self.snapshot) is not None:
            outbox.add_metric([], s.outbox_depth)
            open_.add_metric(["PENDING"], s.pending)
            open_.add_metric(["RETRYING"], s.retrying)
            yield outbox
            yield open_
            # No open delivery: the oldest is no age at all.
            oldest.add_metric([], s.oldest_open_age_seconds or 0.0)
            yield oldest
            overdue.add_metric([], s.history_days_overdue)
            ahead.add_metric([], s.history_ahead_seconds)
            yield overdue
            yield ahead
            for channel_type, destination, state in s.circuits:
                circuits.add_metric([channel_type, destination], CIRCUIT_STATE_VALUES[state])
            if s.circuits:
                yield circuits
            for channel_type, count in s.auto_disabled:
                disabled.add_metric([channel_type], count)
            if s.auto_disabled:
                yield disabled
            for channel_type, channel_id, backlog, age in s.fifo_lines:
                fifo_lag.add_metric([channel_type, channel_id], age)
                fifo_backlog.add_metric([channel_type, channel_id], backlog)
            if s.fifo_lines:
                yield fifo_lag
                yield fifo_backlog
        if self.broker_up is not None:
            broker_up.add_metric([], 1.0 if self.broker_up else 0.0)
            yield broker_up
            for q, depth in self.queue_depths:
                queues.add_metric([q.channel_type, q.name, q.kind], depth)
            if self.queue_depths:
                yield queues
            for q, count in self.queue_consumers:
                consumers.add_metric([q.channel_type, q.name, q.kind], count)
            if self.queue_consumers:
                yield consumers


class ScrapeReader:
    """Refreshes the scrape-time gauges of ``metrics`` before a render: Postgres on every
    scrape (one store call), the broker's queue depths at most every ``cache_seconds``.

    A source that cannot be read is logged and its series are left out; the metrics of the
    process itself are served regardless.
    """

    def __init__(
        self,
        metrics: Metrics,
        read_snapshot: ReadSnapshot,
        queues: Sequence[BrokerQueue],
        read_queue_depths: ReadQueueDepths | None,
        *,
        cache_seconds: float = QUEUE_DEPTHS_CACHE_SECONDS,
    ) -> None:
        self._gauges = metrics.scrape_time
        self._read_snapshot = read_snapshot
        self._queues = list(queues)
        self._read_queue_depths = read_queue_depths
        self._cache_seconds = cache_seconds
        self._queues_fresh_until = -math.inf
        self._lock = trio.Lock()  # one broker read at a time; others wait and reuse it

    async def refresh(self) -> None:
        """Trio-flavoured."""
        try:
            self._gauges.snapshot = await self._read_snapshot()
        except StoreError as exc:
            log.warning("metrics: reading Postgres failed: %s", exc)
            self._gauges.snapshot = None
        self._gauges.database_up = self._gauges.snapshot is not None
        if self._read_queue_depths is None:
            return
        async with self._lock:
            if trio.current_time() < self._queues_fresh_until:
                return
            try:
                depths = await self._read_queue_depths([q.name for q in self._queues])
            except BrokerError as exc:
                log.warning("metrics: reading the queue depths failed: %s", exc)
                self._gauges.broker_up = False
                self._gauges.queue_depths = []
                self._gauges.queue_consumers = []
            else:
                self._gauges.broker_up = True
                found = [(q, depths[q.name]) for q in self._queues if q.name in depths]
                self._gauges.queue_depths = [(q, c.messages) for q, c in found]
                self._gauges.queue_consumers = [(q, c.consumers) for q, c in found]
            self._queues_fresh_until = trio.current_time() + self._cache_seconds
