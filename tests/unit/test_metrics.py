"""Metrics: what ``Metrics`` renders, what the handler and the relay record in it over the shipped
fakes, and how ``ScrapeReader`` reads (and caches) the scrape-time gauges."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from notifier.adapters.base import Receipt
from notifier.broker.base import Incoming, QueueCounts, Settle
from notifier.broker.topology import build_topology
from notifier.errors import BrokerError, PermanentError, RetriableError, StoreUnavailable
from notifier.messages import WorkerMessage, encode_message
from notifier.metrics import (
    CONTENT_TYPE,
    Metrics,
    run_process_metrics,
)
from notifier.metrics_scrape import BrokerQueue, ScrapeReader, broker_queues
from notifier.relay.relay import relay_once
from notifier.store.rows import DeliveryState, MetricsSnapshot
from notifier.testing import (
    MemoryBroker,
    MemoryDeliveries,
    MemoryOutbox,
    PacedAdapter,
    RecordingAdapter,
    RecordingReporter,
    SettleRecorder,
    worker_message,
)
from notifier.testing.buckets import MemoryBuckets
from notifier.worker.decide import RetryPolicy
from notifier.worker.group import outcome_observers
from notifier.worker.handle import Handler

POLICY = RetryPolicy(base_seconds=1, max_seconds=30, tiers_seconds=(1, 5, 15, 30))
WEBHOOK = {"channel_type": "webhook"}


def families(metrics: Metrics) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """The rendered text, parsed: family name → its samples ``(name, labels, value)``, without
    the ``_created`` timestamps."""
    text = metrics.render().decode()
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples if not s.name.endswith("_created")]
        for f in text_string_to_metric_families(text)
    }


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


# -- rendering ----------------------------------------------------------------------------------


def test_renders_every_metric_with_its_labels() -> None:
    m = Metrics()
    m.start_channel_type("webhook")
    m.events_ingested.labels(source="http").inc(3)
    now = datetime.now(UTC)
    m.observe_relay_batch(2, [now - timedelta(seconds=1)], now)
    m.scrape_time.snapshot = MetricsSnapshot(
        outbox_depth=4, pending=5, retrying=6, oldest_open_age_seconds=7.5
    )
    m.scrape_time.broker_up = True
    m.scrape_time.queue_depths = [(BrokerQueue("deliveries.webhook", "webhook", "main"), 9)]

    got = families(m)

    assert got["notifier_events_ingested"] == [
        ("notifier_events_ingested_total", {"source": "http"}, 3.0)
    ]
    attempts = {
        s[1]["outcome"]: s[2]
        for s in got["notifier_delivery_attempts"]
        if s[0] == "notifier_delivery_attempts_total"
    }
    # every outcome of the group is exported from the start, at zero
    assert attempts == dict.fromkeys(
        ["delivered", "retry", "rate_limited", "deferred", "dead", "panic"], 0.0
    )
    assert ("notifier_deliveries_dead_total", WEBHOOK, 0.0) in got["notifier_deliveries_dead"]
    for histogram in (
        "notifier_delivery_attempt_duration_seconds",
        "notifier_delivery_latency_seconds",
    ):
        assert (f"{histogram}_count", WEBHOOK, 0.0) in got[histogram]
    assert ("notifier_relay_batch_size_sum", {}, 2.0) in got["notifier_relay_batch_size"]
    assert ("notifier_relay_lag_seconds_count", {}, 1.0) in got["notifier_relay_lag_seconds"]
    assert ("notifier_relay_rows_published_total", {}, 1.0) in got["notifier_relay_rows_published"]
    assert got["notifier_worker_in_flight"] == [("notifier_worker_in_flight", WEBHOOK, 0.0)]
    assert got["notifier_outbox_depth"] == [("notifier_outbox_depth", {}, 4.0)]
    assert got["notifier_open_deliveries"] == [
        ("notifier_open_deliveries", {"status": "PENDING"}, 5.0),
        ("notifier_open_deliveries", {"status": "RETRYING"}, 6.0),
    ]
    assert got["notifier_oldest_open_delivery_age_seconds"] == [
        ("notifier_oldest_open_delivery_age_seconds", {}, 7.5)
    ]
    assert got["notifier_broker_up"] == [("notifier_broker_up", {}, 1.0)]
    assert got["notifier_queue_messages"] == [
        (
            "notifier_queue_messages",
            {"channel_type": "webhook", "queue": "deliveries.webhook", "kind": "main"},
            9.0,
        )
    ]
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_scrape_time_series_that_were_not_read_are_left_out() -> None:
    got = families(Metrics())
    for name in (
        "notifier_outbox_depth",
        "notifier_open_deliveries",
        "notifier_oldest_open_delivery_age_seconds",
        "notifier_broker_up",
        "notifier_queue_messages",
        "notifier_queue_consumers",
        "notifier_database_up",
        "notifier_channels_auto_disabled",
        "notifier_ready",
    ):
        assert name not in got


def test_auto_disabled_channels_and_readiness_are_rendered() -> None:
    m = Metrics()
    m.scrape_time.snapshot = MetricsSnapshot(
        outbox_depth=0, pending=0, retrying=0, oldest_open_age_seconds=None,
        auto_disabled=(("email", 1), ("webhook", 3)),
    )  # fmt: skip
    m.scrape_time.ready = False
    got = families(m)
    assert got["notifier_channels_auto_disabled"] == [
        ("notifier_channels_auto_disabled", {"channel_type": "email"}, 1.0),
        ("notifier_channels_auto_disabled", {"channel_type": "webhook"}, 3.0),
    ]
    assert got["notifier_ready"] == [("notifier_ready", {}, 0.0)]


def test_an_unreachable_broker_is_broker_up_zero_without_queue_series() -> None:
    m = Metrics()
    m.scrape_time.broker_up = False
    got = families(m)
    assert got["notifier_broker_up"] == [("notifier_broker_up", {}, 0.0)]
    assert "notifier_queue_messages" not in got


def test_no_open_delivery_is_an_oldest_age_of_zero() -> None:
    m = Metrics()
    m.scrape_time.snapshot = MetricsSnapshot(
        outbox_depth=0, pending=0, retrying=0, oldest_open_age_seconds=None
    )
    assert value(m, "notifier_oldest_open_delivery_age_seconds") == 0.0


def test_each_circuit_read_is_a_series_by_destination() -> None:
    m = Metrics()
    m.scrape_time.snapshot = MetricsSnapshot(
        outbox_depth=0, pending=0, retrying=0, oldest_open_age_seconds=None,
        circuits=(
            ("webhook", "https://a.example:443", "open"),
            ("webhook", "https://b.example:443", "half_open"),
            ("webhook", "https://c.example:443", "closed"),  # closed lately: 0
        ),
    )  # fmt: skip
    got = families(m)["notifier_destination_circuit_state"]
    assert {(s[1]["destination"], s[1]["channel_type"], s[2]) for s in got} == {
        ("https://a.example:443", "webhook", 1.0),
        ("https://b.example:443", "webhook", 2.0),
        ("https://c.example:443", "webhook", 0.0),
    }
    # none in trouble or changed lately: no series at all
    m.scrape_time.snapshot = MetricsSnapshot(
        outbox_depth=0, pending=0, retrying=0, oldest_open_age_seconds=None
    )
    assert "notifier_destination_circuit_state" not in families(m)


def test_a_process_on_its_own_reports_its_process_metrics() -> None:
    got = families(Metrics(environ={}))
    [(_, labels, resident)] = got["process_resident_memory_bytes"]
    assert labels == {}  # one process: no pid label
    assert resident > 0
    assert got["process_open_fds"][0][2] > 0
    assert got["process_cpu_seconds"][0][0] == "process_cpu_seconds_total"


async def test_a_process_on_its_own_has_no_process_metrics_to_write() -> None:
    # read at scrape time: nothing to keep fresh, the task ends at once
    with trio.fail_after(1):
        await run_process_metrics(Metrics(environ={}))


def test_metrics_instances_do_not_share_values() -> None:
    a, b = Metrics(), Metrics()
    a.events_ingested.labels(source="http").inc()
    assert value(a, "notifier_events_ingested_total", source="http") == 1.0
    assert value(b, "notifier_events_ingested_total", source="http") is None


def test_broker_queues_are_the_main_queue_every_tier_and_the_dead_letter_queue() -> None:
    assert broker_queues(["webhook"], [1, 5]) == [
        BrokerQueue("deliveries.webhook", "webhook", "main"),
        BrokerQueue("deliveries.webhook.retry.1s", "webhook", "retry"),
        BrokerQueue("deliveries.webhook.retry.5s", "webhook", "retry"),
        BrokerQueue("deliveries.webhook.dead", "webhook", "dead"),
    ]


# -- the handler --------------------------------------------------------------------------------


class Rig:
    def __init__(self, adapter: RecordingAdapter, store: MemoryDeliveries | None = None) -> None:
        self.metrics = Metrics()
        self.store = store or MemoryDeliveries()
        self.broker = MemoryBroker()
        self.broker.declare(build_topology(["webhook"], POLICY.tiers_seconds, "quorum"))
        self.sink = SettleRecorder()
        self.handler = Handler(
            self.store, adapter, self.broker.publish, timeout_seconds=10, policy=POLICY,
            observer=outcome_observers(
                adapter.channel_type, reporter=RecordingReporter(), metrics=self.metrics
            ),
            limits=MemoryBuckets(),
        )  # fmt: skip

    async def handle(self, m: WorkerMessage) -> Settle:
        if self.store.state(m.delivery_id) is None:
            self.store.add(m.delivery_id, status="PENDING", attempt=m.attempt - 1)
        await self.handler.handle(
            Incoming(encode_message(m), str(m.delivery_id), len(self.sink.settled) + 1, False,
                     self.sink)
        )  # fmt: skip
        return self.sink.settled[-1]

    def attempts(self, outcome: str) -> float | None:
        return value(
            self.metrics, "notifier_delivery_attempts_total", channel_type="webhook",
            outcome=outcome,
        )  # fmt: skip

    def sample(self, name: str) -> float | None:
        return value(self.metrics, name, channel_type="webhook")


async def test_a_delivered_attempt_counts_its_duration_and_its_latency() -> None:
    rig = Rig(RecordingAdapter("webhook", Receipt(status_code=200)))
    created = datetime.now(UTC) - timedelta(hours=1)

    assert await rig.handle(worker_message(1, created_at=created)) is Settle.ACK

    assert rig.attempts("delivered") == 1.0
    assert rig.attempts("retry") == 0.0
    assert rig.sample("notifier_deliveries_dead_total") == 0.0
    assert rig.sample("notifier_delivery_attempt_duration_seconds_count") == 1.0
    assert rig.sample("notifier_delivery_latency_seconds_count") == 1.0
    # created an hour ago: past every bucket below the hour
    latency_sum = rig.sample("notifier_delivery_latency_seconds_sum")
    assert latency_sum is not None
    assert latency_sum >= 3600
    assert value(
        rig.metrics, "notifier_delivery_latency_seconds_bucket", channel_type="webhook", le="1800.0"
    ) == 0.0  # fmt: skip


async def test_retries_then_dead_count_each_attempt_and_one_dead_delivery() -> None:
    rig = Rig(RecordingAdapter("webhook", RetriableError("HTTP 503"), PermanentError("HTTP 404")))

    assert await rig.handle(worker_message(1)) is Settle.ACK  # retry published
    assert await rig.handle(worker_message(1, attempt=2)) is Settle.REJECT  # dead

    assert rig.attempts("retry") == 1.0
    assert rig.attempts("dead") == 1.0
    assert rig.attempts("delivered") == 0.0
    assert rig.sample("notifier_deliveries_dead_total") == 1.0
    assert rig.sample("notifier_delivery_attempt_duration_seconds_count") == 2.0
    assert rig.sample("notifier_delivery_latency_seconds_count") == 0.0


async def test_an_adapter_crash_counts_a_panic_and_a_dead_delivery() -> None:
    rig = Rig(RecordingAdapter("webhook", RuntimeError("boom")))

    assert await rig.handle(worker_message(1)) is Settle.REJECT

    assert rig.attempts("panic") == 1.0
    assert rig.sample("notifier_deliveries_dead_total") == 1.0


class CrashingStore(MemoryDeliveries):
    """A store whose state read has a bug (not a ``StoreError``): the handler itself fails."""

    async def delivery_state(self, delivery_id: uuid.UUID) -> DeliveryState | None:
        await trio.lowlevel.checkpoint()
        raise KeyError("a bug")


async def test_a_handler_crash_counts_a_panic_without_a_duration() -> None:
    rig = Rig(RecordingAdapter("webhook"), CrashingStore())

    assert await rig.handle(worker_message(1)) is Settle.REJECT

    assert rig.attempts("panic") == 1.0
    assert rig.sample("notifier_deliveries_dead_total") == 1.0
    assert rig.sample("notifier_delivery_attempt_duration_seconds_count") == 0.0


async def test_a_rate_limited_attempt_is_counted_without_a_duration(
    mock_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(PacedAdapter("webhook", interval_seconds=10))

    assert await rig.handle(worker_message(1)) is Settle.ACK  # takes the slot
    assert await rig.handle(worker_message(2)) is Settle.ACK  # waits in a delay tier

    assert rig.attempts("delivered") == 1.0
    assert rig.attempts("rate_limited") == 1.0
    assert rig.sample("notifier_delivery_attempt_duration_seconds_count") == 1.0


async def test_a_duplicate_is_not_an_attempt() -> None:
    rig = Rig(RecordingAdapter("webhook"))
    rig.store.add(worker_message(1).delivery_id, status="DELIVERED", attempt=1)

    assert await rig.handle(worker_message(1)) is Settle.ACK

    assert rig.attempts("delivered") == 0.0


async def test_a_handler_without_metrics_still_handles() -> None:
    store = MemoryDeliveries()
    store.add(worker_message(1).delivery_id)
    sink = SettleRecorder()
    handler = Handler(
        store, RecordingAdapter("webhook"), MemoryBroker().publish, timeout_seconds=10,
        policy=POLICY,
        observer=outcome_observers("webhook", reporter=RecordingReporter(), metrics=None),
    )  # fmt: skip
    await handler.handle(Incoming(encode_message(worker_message(1)), None, 1, False, sink))
    assert sink.settled == [Settle.ACK]


# -- the relay ----------------------------------------------------------------------------------


async def test_the_relay_records_batch_size_lag_and_rows_published() -> None:
    outbox, mq, m = MemoryOutbox(), MemoryBroker(), Metrics()
    mq.bind("deliveries", "webhook", "deliveries.webhook")
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    outbox.add(worker_message(1).delivery_id, "webhook", b"one", created_at=an_hour_ago)
    outbox.add(worker_message(2).delivery_id, "webhook", b"two", created_at=an_hour_ago)
    outbox.add(worker_message(3).delivery_id, "sms", b"unroutable", created_at=an_hour_ago)

    assert await relay_once(outbox, mq, 10, m) == 3

    assert value(m, "notifier_relay_batch_size_count") == 1.0
    assert value(m, "notifier_relay_batch_size_sum") == 3.0  # claimed, the refused one included
    assert value(m, "notifier_relay_rows_published_total") == 2.0
    assert value(m, "notifier_relay_lag_seconds_count") == 2.0  # confirmed rows only
    assert value(m, "notifier_relay_lag_seconds_bucket", le="300.0") == 0.0  # an hour late
    assert value(m, "notifier_relay_lag_seconds_bucket", le="+Inf") == 2.0


async def test_an_empty_relay_round_is_not_a_batch() -> None:
    m = Metrics()
    assert await relay_once(MemoryOutbox(), MemoryBroker(), 10, m) == 0
    assert value(m, "notifier_relay_batch_size_count") == 0.0


# -- scrape-time reads --------------------------------------------------------------------------

SNAPSHOT = MetricsSnapshot(outbox_depth=1, pending=2, retrying=3, oldest_open_age_seconds=4.0)
QUEUES = broker_queues(["webhook"], [1])


class Sources:
    """Scripted scrape-time sources that count their reads."""

    def __init__(self) -> None:
        self.snapshot_reads = 0
        self.queue_reads: list[list[str]] = []
        self.store_down = False
        self.broker_down = False
        self.depths = {  # no tier queue
            "deliveries.webhook": QueueCounts(7, 2),
            "deliveries.webhook.dead": QueueCounts(1, 0),
        }

    async def read_snapshot(self) -> MetricsSnapshot:
        await trio.lowlevel.checkpoint()
        self.snapshot_reads += 1
        if self.store_down:
            raise StoreUnavailable("Postgres unavailable")
        return SNAPSHOT

    async def read_queue_depths(self, names: Sequence[str]) -> Mapping[str, QueueCounts]:
        await trio.lowlevel.checkpoint()
        self.queue_reads.append(list(names))
        if self.broker_down:
            raise BrokerError("cannot connect to RabbitMQ")
        return self.depths


def queue_series(m: Metrics) -> dict[str, float]:
    return {s[1]["queue"]: s[2] for s in families(m).get("notifier_queue_messages", [])}


def consumer_series(m: Metrics) -> dict[str, float]:
    return {s[1]["queue"]: s[2] for s in families(m).get("notifier_queue_consumers", [])}


async def test_every_scrape_reads_postgres_and_the_broker_at_most_every_few_seconds(
    mock_clock: trio.testing.MockClock,
) -> None:
    m, sources = Metrics(), Sources()
    reader = ScrapeReader(
        m, sources.read_snapshot, QUEUES, sources.read_queue_depths, cache_seconds=5
    )

    await reader.refresh()
    await trio.sleep(4)
    sources.depths = {"deliveries.webhook": QueueCounts(8, 0)}
    await reader.refresh()  # the broker's answer is still fresh

    assert sources.snapshot_reads == 2
    assert sources.queue_reads == [[q.name for q in QUEUES]]
    assert queue_series(m) == {"deliveries.webhook": 7.0, "deliveries.webhook.dead": 1.0}
    assert consumer_series(m) == {"deliveries.webhook": 2.0, "deliveries.webhook.dead": 0.0}
    assert value(m, "notifier_outbox_depth") == 1.0
    assert value(m, "notifier_broker_up") == 1.0
    assert value(m, "notifier_database_up") == 1.0

    await trio.sleep(1)
    await reader.refresh()

    assert len(sources.queue_reads) == 2
    assert queue_series(m) == {"deliveries.webhook": 8.0}
    assert consumer_series(m) == {"deliveries.webhook": 0.0}


async def test_concurrent_scrapes_read_the_broker_once(mock_clock: trio.testing.MockClock) -> None:
    m, sources = Metrics(), Sources()
    reader = ScrapeReader(m, sources.read_snapshot, QUEUES, sources.read_queue_depths)
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(reader.refresh)
    assert len(sources.queue_reads) == 1
    assert sources.snapshot_reads == 3


async def test_sources_that_fail_leave_their_series_out(
    mock_clock: trio.testing.MockClock,
) -> None:
    m, sources = Metrics(), Sources()
    reader = ScrapeReader(
        m, sources.read_snapshot, QUEUES, sources.read_queue_depths, cache_seconds=5
    )
    await reader.refresh()
    sources.store_down = sources.broker_down = True
    await trio.sleep(5)

    await reader.refresh()

    got = families(m)
    assert "notifier_outbox_depth" not in got
    assert "notifier_open_deliveries" not in got
    assert "notifier_queue_messages" not in got
    assert "notifier_queue_consumers" not in got
    assert got["notifier_broker_up"] == [("notifier_broker_up", {}, 0.0)]
    assert got["notifier_database_up"] == [("notifier_database_up", {}, 0.0)]


async def test_without_a_broker_reader_no_broker_series_are_served() -> None:
    m, sources = Metrics(), Sources()
    await ScrapeReader(m, sources.read_snapshot, QUEUES, None).refresh()
    got = families(m)
    assert "notifier_broker_up" not in got
    assert got["notifier_outbox_depth"] == [("notifier_outbox_depth", {}, 1.0)]
