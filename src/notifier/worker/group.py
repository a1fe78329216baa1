"""A worker group: one consumer, a bounded trio channel, ``concurrency`` worker tasks, and a
retry publisher on an AMQP connection of its own (docs/architecture.md §5, §4)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Protocol

import trio

from notifier.adapters.base import Adapter
from notifier.alerts import Alerts
from notifier.batching import Batcher
from notifier.broker.amqp import AmqpConnection, open_connection
from notifier.broker.amqp_consumer import Consumer
from notifier.broker.base import Confirm, Incoming, Outgoing
from notifier.broker.repair import RepairingPublish
from notifier.broker.topology import build_topology, fifo_queue, main_queue
from notifier.config import Config, WorkerGroupConfig
from notifier.errors import BrokerError
from notifier.lifecycle import Stop, watch_closing
from notifier.metrics import Metrics
from notifier.observability import Reporter
from notifier.ratelimit import SharedBuckets
from notifier.tracing import NO_TRACING, Tracing
from notifier.worker.circuit import Breaker, SharedCircuits, breaker_for
from notifier.worker.deliveries import BatchedDeliveries, BatchStore
from notifier.worker.fair import FairDispatch, FairShare, Pending
from notifier.worker.fifo import FifoLines, FifoRetries, FifoStore
from notifier.worker.handle import Handler
from notifier.worker.observe import (
    LogObserver,
    MetricsObserver,
    Observers,
    OutcomeObserver,
    SentryObserver,
)

log = logging.getLogger("notifier.worker")


class WorkerStore(BatchStore, SharedBuckets, SharedCircuits, FifoStore, Protocol):
    """What a worker group needs of the store: delivery states and attempts, batched, the
    shared rate-limit buckets, the destinations' circuits and the FIFO channels' heads."""


async def worker_task(
    receive: trio.MemoryReceiveChannel[Incoming], dispatch: FairDispatch, stop: Stop
) -> None:
    """Take messages until stopped; a message taken is always handled to the end (or left
    waiting for its destination's share, or deferred: ``worker.fair``). A message already
    waiting is taken without a wait (no cancel scope, no checkpoint: the delivery has its
    own); only an empty channel is waited on, in a scope the stop cancels."""
    while not stop.is_set():
        try:
            incoming = receive.receive_nowait()
        except trio.WouldBlock:
            with stop.intake() as intake:
                try:
                    incoming = await receive.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    return
            if intake.cancelled_caught:
                return
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return
        await dispatch.dispatch(incoming)


def fair_share(workers: WorkerGroupConfig) -> FairShare[Pending]:
    """The group's fair share (docs/architecture.md §5): ``in_flight_per_destination`` tasks per
    destination, as many waiting per destination, and in all what the prefetch leaves once every
    task has a message."""
    cap = workers.in_flight_per_destination
    return FairShare(
        cap=cap, waiting_per_destination=cap,
        waiting_total=workers.prefetch - workers.concurrency,
    )  # fmt: skip


def outcome_observers(
    channel_type: str,
    *,
    reporter: Reporter | None,
    metrics: Metrics | None,
    alerts: Alerts | None = None,
) -> Observers:
    """What the worker does with each outcome, in this order: count it in ``metrics`` (when the
    process keeps them), write its ``notifier.worker`` line, report it to ``reporter`` (when
    one is given) if it deserves a human's attention, and buffer a dead delivery's alert in
    ``alerts`` (when given; its Sentry event is then the alert's, with the context)."""
    observers: list[OutcomeObserver] = []
    if metrics is not None:
        observers.append(MetricsObserver(metrics, channel_type))
    observers.append(LogObserver())
    if reporter is not None:
        dead_elsewhere = alerts is not None and alerts.reports_to_sentry
        observers.append(SentryObserver(reporter, alerts_report_dead=dead_elsewhere))
    if alerts is not None:
        observers.append(alerts.observer())
    return Observers(*observers)


@asynccontextmanager
async def open_fifo_consumers(
    conn: AmqpConnection, channel_type: str, partitions: int, prefetch: int
) -> AsyncIterator[list[Consumer]]:
    """Trio-flavoured. A consumer of every FIFO partition of the type: the broker makes one
    consumer of the fleet active per partition (``worker.fifo``)."""
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                conn.open_consumer(fifo_queue(channel_type, k), prefetch)
            )
            for k in range(partitions)
        ]


async def run_worker_group(
    channel_type: str,
    config: Config,
    workers: WorkerGroupConfig,
    store: WorkerStore,
    adapter: Adapter,
    stop: Stop,
    *,
    reporter: Reporter | None = None,
    metrics: Metrics | None = None,
    alerts: Alerts | None = None,
    tracing: Tracing = NO_TRACING,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Consume ``deliveries.<type>`` until ``stop``.

    Raise ``BrokerError`` when a connection or channel of the group is lost: the supervisor
    restarts the group, and its unacked messages have gone back to the queue with the channel.
    Acknowledgements only ever travel on the channel that delivered the message. Each outcome
    goes to ``metrics``, ``reporter`` and ``alerts`` through ``outcome_observers``.
    """
    broker = config.broker
    partitions = broker.fifo_partitions
    topology = build_topology(
        [channel_type], config.retry.tiers_seconds, broker.queue_type, partitions
    )
    deliveries = BatchedDeliveries(
        store, disable_after_failing_seconds=config.channel_health.disable_after_failing_seconds
    )
    async with (
        open_connection(
            broker.url, name=f"workers.{channel_type}", heartbeat_seconds=broker.heartbeat_seconds
        ) as conn,
        open_connection(
            broker.url, name=f"workers.{channel_type}.retry",
            heartbeat_seconds=broker.heartbeat_seconds,
        ) as publishing,
    ):  # fmt: skip
        await conn.declare(topology)
        async with (
            publishing.open_publisher(broker.publish_timeout_seconds) as publisher,
            conn.open_consumer(main_queue(channel_type), workers.prefetch) as consumer,
            open_fifo_consumers(conn, channel_type, partitions, workers.prefetch) as fifo_consumers,
            trio.open_nursery() as nursery,
        ):
            retries = Batcher[Outgoing, Confirm](
                publisher.publish_batch, max_batch=256,
                closed=lambda: BrokerError("the worker group is stopping"),
            )  # fmt: skip
            # a retry tier deleted under the group is declared again by the first return
            publish = RepairingPublish(retries, publishing.declare, topology)
            circuits: Breaker | None = breaker_for(store, channel_type, workers)
            handler = Handler(
                deliveries, adapter, publish, timeout_seconds=workers.timeout_seconds,
                policy=config.retry,
                observer=outcome_observers(
                    channel_type, reporter=reporter, metrics=metrics, alerts=alerts
                ),
                limits=store, circuits=circuits, tracing=tracing,
            )  # fmt: skip
            fifo_handler = Handler(
                deliveries, adapter,
                FifoRetries(publish, channel_type, config.retry.tiers_seconds, partitions),
                timeout_seconds=workers.timeout_seconds, policy=config.retry,
                observer=outcome_observers(
                    channel_type, reporter=reporter, metrics=metrics, alerts=alerts
                ),
                limits=store, circuits=circuits, tracing=tracing,
            )  # fmt: skip
            in_flight = metrics.worker_in_flight.labels(channel_type) if metrics else None
            lines = FifoLines(
                store, fifo_handler,
                FifoRetries(publish, channel_type, config.retry.tiers_seconds, partitions),
                stop, concurrency=workers.concurrency,
                tracking=in_flight.track_inprogress if in_flight is not None else None,
            )  # fmt: skip
            dispatch = FairDispatch(
                handler, adapter, fair_share(workers), stop,
                tracking=in_flight.track_inprogress if in_flight is not None else None,
                waiting=metrics.worker_waiting.labels(channel_type) if metrics else None,
            )  # fmt: skip
            lost = watch_closing(nursery, {
                "consuming connection": conn.wait_closed,
                "consuming channel": consumer.wait_closed,
                "retry connection": publishing.wait_closed,
                "retry channel": publisher.wait_closed,
            } | {
                f"FIFO partition {k} channel": c.wait_closed for k, c in enumerate(fifo_consumers)
            })  # fmt: skip
            nursery.start_soon(deliveries.run)
            nursery.start_soon(retries.run)
            if circuits is not None:
                nursery.start_soon(circuits.run)
            await nursery.start(lines.run)
            for fifo_consumer in fifo_consumers:
                nursery.start_soon(lines.consume, fifo_consumer.receive)
            task_status.started()
            log.info(
                "worker group %s: consuming with %d tasks, at most %d per destination",
                channel_type, workers.concurrency, workers.in_flight_per_destination,
            )  # fmt: skip
            async with trio.open_nursery() as pool:
                for _ in range(workers.concurrency):
                    pool.start_soon(worker_task, consumer.receive, dispatch, stop)
            await lines.wait_stopped()  # each FIFO line finishes the attempt it is making
            # stopped: end the watchers and batchers before the channels close
            nursery.cancel_scope.cancel()
        if lost:
            raise BrokerError(f"worker group {channel_type}: {lost[0]} lost")
