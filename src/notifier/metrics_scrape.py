"""The gauges of ``/metrics`` read when it is scraped (docs/architecture.md §6, README
*Metrics*): the outbox depth, the open deliveries, the history's days, the destinations'
circuits (one statement to Postgres) and the broker's queue depths (cached a few seconds).
Every process that serves ``/metrics`` reports the same global values."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from notifier.broker.topology import dead_queue, main_queue, retry_queue
from notifier.errors import BrokerError, StoreError
from notifier.store.rows import MetricsSnapshot

if TYPE_CHECKING:
    from notifier.metrics import Metrics

log = logging.getLogger("notifier.metrics")

# How long the broker's queue depths are reused, so frequent scrapes do not hammer RabbitMQ.
QUEUE_DEPTHS_CACHE_SECONDS = 5.0

ReadSnapshot = Callable[[], Awaitable[MetricsSnapshot]]
ReadQueueDepths = Callable[[Sequence[str]], Awaitable[Mapping[str, int]]]


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
        self.broker_up: bool | None = None  # None: this process does not read the broker
        self.queue_depths: list[tuple[BrokerQueue, int]] = []

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
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        outbox, open_, oldest, overdue, ahead, circuits, broker_up, queues = self._families()
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
        if self.broker_up is not None:
            broker_up.add_metric([], 1.0 if self.broker_up else 0.0)
            yield broker_up
            for q, depth in self.queue_depths:
                queues.add_metric([q.channel_type, q.name, q.kind], depth)
            if self.queue_depths:
                yield queues


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
            else:
                self._gauges.broker_up = True
                self._gauges.queue_depths = [(q, depths[q.name]) for q in self._queues
                                             if q.name in depths]  # fmt: skip
            self._queues_fresh_until = trio.current_time() + self._cache_seconds
