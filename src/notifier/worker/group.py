"""A worker group: one consumer, a bounded trio channel, ``concurrency`` worker tasks."""

from __future__ import annotations

import logging

import trio

from notifier.adapters.base import Adapter
from notifier.broker.amqp import open_connection
from notifier.broker.base import Incoming
from notifier.broker.topology import build_topology, main_queue
from notifier.config import Config, WebhookWorkersConfig
from notifier.errors import BrokerError
from notifier.lifecycle import Stop
from notifier.worker.deliveries import BatchedDeliveries, BatchStore
from notifier.worker.handle import Handler

log = logging.getLogger("notifier.worker")


async def worker_task(
    receive: trio.MemoryReceiveChannel[Incoming], handler: Handler, stop: Stop
) -> None:
    """Take messages until stopped; a message taken is always handled to the end."""
    while True:
        with stop.intake() as intake:
            try:
                incoming = await receive.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return
        if intake.cancelled_caught:
            return
        await handler.handle(incoming)


async def run_worker_group(
    channel_type: str,
    config: Config,
    workers: WebhookWorkersConfig,
    store: BatchStore,
    adapter: Adapter,
    stop: Stop,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Consume ``deliveries.<type>`` until ``stop``; raise ``BrokerError`` when
    the connection is lost (the supervisor restarts the group)."""
    topology = build_topology([channel_type], config.retry.tiers_seconds, config.broker.queue_type)
    deliveries = BatchedDeliveries(store)
    handler = Handler(deliveries, adapter, timeout_seconds=workers.timeout_seconds)
    async with open_connection(
        config.broker.url,
        name=f"workers.{channel_type}",
        heartbeat_seconds=config.broker.heartbeat_seconds,
    ) as conn:
        await conn.declare(topology)
        async with (
            conn.open_consumer(main_queue(channel_type), workers.prefetch) as consumer,
            trio.open_nursery() as nursery,
        ):
            lost = False

            async def watch() -> None:
                nonlocal lost
                await conn.wait_closed()
                lost = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            nursery.start_soon(deliveries.run)
            task_status.started()
            log.info("worker group %s: consuming with %d tasks", channel_type, workers.concurrency)
            async with trio.open_nursery() as pool:
                for _ in range(workers.concurrency):
                    pool.start_soon(worker_task, consumer.receive, handler, stop)
            # stopped: end the watcher and the batcher before the channel closes
            nursery.cancel_scope.cancel()
        if lost:
            raise BrokerError(f"worker group {channel_type}: broker connection lost")
