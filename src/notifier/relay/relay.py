"""The outbox relay: doorbell-or-poll → claim → publish with confirms → delete.

Rows are claimed ``FOR UPDATE SKIP LOCKED`` inside a transaction that lasts until their
confirms are in, so concurrent relays never publish the same row. A row is deleted only after
its confirm; a returned (unroutable) or nacked row stays, pushed back with a growing wait; a row
whose confirm never came stays as it was and is published again (a duplicate, never a loss).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Protocol

import msgspec
import trio

from notifier.broker.base import Confirm, Outgoing, Publisher
from notifier.broker.topology import (
    EXCHANGE,
    FIFO_EXCHANGE,
    FIFO_SUFFIX,
    fifo_partition,
    fifo_routing_key,
)
from notifier.errors import BrokerError
from notifier.hint import Hint
from notifier.lifecycle import Stop
from notifier.metrics import Metrics
from notifier.relay.doorbell import DoorbellStore, keep_listening
from notifier.store.rows import OutboxRow
from notifier.tracing import HEADER as TRACE_HEADER
from notifier.tracing import NO_TRACING, Kind, Tracing

log = logging.getLogger("notifier.relay")

# A publisher not ready within this long is blocked by the broker (an alarm): say so, then wait.
BLOCKED_NOTICE_SECONDS = 1.0
# After unconfirmed publishes: a publisher not ready within this long is blocked, not broken.
BLOCKED_PROBE_SECONDS = 0.5
# ``broker.fifo_partitions``' default.
DEFAULT_FIFO_PARTITIONS = 8


class Claim(Protocol):
    rows: list[OutboxRow]

    async def finish(self, sent: Sequence[int], refused: dict[int, str]) -> None: ...


class OutboxStore(DoorbellStore, Protocol):
    def claim_outbox(self, limit: int) -> AbstractAsyncContextManager[Claim]: ...


class _ChannelOnly(msgspec.Struct):
    channel_id: uuid.UUID


_channel_of = msgspec.json.Decoder(_ChannelOnly).decode


def route(row: OutboxRow, fifo_partitions: int) -> tuple[str, str]:
    """The exchange and routing key of a row: its channel type's work queue, or for a FIFO
    channel's row (``<type>.fifo``) the channel's partition (README "Ordered delivery (FIFO)").
    A FIFO row whose body names no channel (never written so) goes to the type's work queue,
    whose worker ends it as it would any message."""
    if not row.routing_key.endswith(FIFO_SUFFIX):
        return EXCHANGE, row.routing_key
    channel_type = row.routing_key.removesuffix(FIFO_SUFFIX)
    try:
        channel_id = _channel_of(row.body).channel_id
    except msgspec.DecodeError:
        return EXCHANGE, channel_type
    key = fifo_routing_key(channel_type, fifo_partition(channel_id, fifo_partitions))
    return FIFO_EXCHANGE, key


def _outgoing(row: OutboxRow, traceparent: str | None, fifo_partitions: int) -> Outgoing:
    headers = None if traceparent is None else {TRACE_HEADER: traceparent}
    exchange, key = route(row, fifo_partitions)
    return Outgoing(exchange, key, row.body, str(row.delivery_id), headers)


async def _publish(
    publisher: Publisher, batch: Sequence[OutboxRow], tracing: Tracing, fifo_partitions: int
) -> list[Confirm]:
    """Publish the rows, each with its event's trace context as the header ``traceparent``;
    with tracing on, a span per row that has one (a child of its ingest span), ended (failed,
    when the publish raises) once the broker has answered."""
    if not tracing.enabled:
        return await publisher.publish_batch(
            [_outgoing(r, r.traceparent, fifo_partitions) for r in batch]
        )
    spans = [
        tracing.start(
            "notifier.publish", r.traceparent, kind=Kind.PRODUCER, new_trace=False,
            attributes={"messaging.system": "rabbitmq", "messaging.destination.name": EXCHANGE,
                        "messaging.rabbitmq.destination.routing_key": r.routing_key,
                        "notifier.delivery_id": str(r.delivery_id)},
        )
        for r in batch
    ]  # fmt: skip
    error: BaseException | None = None
    try:
        results = await publisher.publish_batch(
            [
                _outgoing(r, s.traceparent, fifo_partitions)
                for r, s in zip(batch, spans, strict=True)
            ]
        )
        for span, confirm in zip(spans, results, strict=True):
            span.set("notifier.confirm", confirm.value)
        return results
    except BaseException as exc:
        error = exc
        raise
    finally:
        for span in spans:
            span.end(error)


async def relay_once(
    store: OutboxStore, publisher: Publisher, batch_size: int, metrics: Metrics | None = None,
    tracing: Tracing = NO_TRACING, fifo_partitions: int = DEFAULT_FIFO_PARTITIONS,
) -> int:  # fmt: skip
    """Trio-flavoured. Relay one batch; return how many rows were claimed."""
    async with store.claim_outbox(batch_size) as claim:
        if not claim.rows:
            return 0
        batch = claim.rows
        results = await _publish(publisher, batch, tracing, fifo_partitions)
        confirmed_at = datetime.now(UTC)
        confirmed = [r for r, c in zip(batch, results, strict=True) if c is Confirm.CONFIRMED]
        sent = [r.id for r in confirmed]
        refused = {
            r.id: f"broker {c.value} the message (routing key {r.routing_key!r})"
            for r, c in zip(batch, results, strict=True)
            if c in (Confirm.RETURNED, Confirm.NACKED)
        }
        for row_id, reason in refused.items():
            log.warning("outbox row %d: %s; will retry", row_id, reason)
        await claim.finish(sent, refused)
        unconfirmed = len(batch) - len(sent) - len(refused)
    if metrics is not None:  # the claim committed: the confirmed rows are gone from the outbox
        metrics.observe_relay_batch(
            len(claim.rows), [r.created_at for r in confirmed], confirmed_at
        )
    if unconfirmed:
        publisher.check()  # a broken channel ends this relay run, so the supervisor reconnects
        with trio.move_on_after(BLOCKED_PROBE_SECONDS) as probe:
            await publisher.wait_publishable()
        if not probe.cancelled_caught:
            raise BrokerError(f"{unconfirmed} publishes were not confirmed in time")
        # The broker blocked the connection under this batch (an alarm): it holds our frames.
        # The rows stay and are published again once it lifts (relay_loop waits for that); a
        # reconnect would only run into the same block.
        log.warning("%d publishes were held by a broker block; their rows stay", unconfirmed)
    return len(claim.rows)


async def relay_loop(
    store: OutboxStore,
    publisher: Publisher,
    stop: Stop,
    *,
    batch_size: int,
    poll_interval_seconds: float,
    metrics: Metrics | None = None,
    tracing: Tracing = NO_TRACING,
    fifo_partitions: int = DEFAULT_FIFO_PARTITIONS,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Relay until ``stop``; the batch in hand is always finished first.

    A pass runs when the doorbell rings and at the latest every ``poll_interval_seconds``. The
    doorbell is a hint: while its LISTEN connection is lost the relay only polls, and listens
    again in the background (``keep_listening``); it never stops for it. A failing pass (the
    broker or Postgres gone) raises, and the supervisor restarts the relay."""
    hint = Hint()
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(keep_listening, store, hint)
        task_status.started()
        try:
            await _relay_until_stopped(
                store,
                publisher,
                stop,
                hint,
                batch_size,
                poll_interval_seconds,
                metrics,
                tracing,
                fifo_partitions,
            )
        except Exception as exc:  # raised below, as itself rather than in an ExceptionGroup
            failure = exc
        nursery.cancel_scope.cancel()  # stop listening
    if failure is not None:
        raise failure


async def _relay_until_stopped(
    store: OutboxStore,
    publisher: Publisher,
    stop: Stop,
    hint: Hint,
    batch_size: int,
    poll_interval_seconds: float,
    metrics: Metrics | None,
    tracing: Tracing,
    fifo_partitions: int,
) -> None:
    while not stop.is_set():
        await _wait_publishable(publisher, stop)
        if stop.is_set():
            break
        hint.clear()
        claimed = await relay_once(store, publisher, batch_size, metrics, tracing, fifo_partitions)
        if claimed >= batch_size:
            continue  # probably more waiting: no need to wait for the bell
        with stop.intake(), trio.move_on_after(poll_interval_seconds):
            await hint.wait()


async def _wait_publishable(publisher: Publisher, stop: Stop) -> None:
    """Trio-flavoured. Claim nothing while the broker blocks publishing (docs/architecture.md §6: a
    memory or disk alarm): publishes would only time out, and the relay would reconnect into the
    same block again and again. Return when it lifts, or on ``stop``; raise ``BrokerError`` when
    the connection is lost meanwhile (the supervisor reconnects)."""
    with stop.intake():
        with trio.move_on_after(BLOCKED_NOTICE_SECONDS):
            await publisher.wait_publishable()
            return
        log.warning("the broker is blocking publishes (a memory or disk alarm); the relay waits")
        await publisher.wait_publishable()
        log.warning("the broker accepts publishes again; the relay goes on")
