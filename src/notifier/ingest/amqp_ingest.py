"""AMQP ingest (``[amqp_ingest]``): events from a RabbitMQ queue, a batch per transaction.

A batch is whatever the consumer holds — up to ``prefetch`` messages, gathered for at most
``batch_linger_seconds`` after the first — so one round trip to Postgres stores many events
(docs/architecture.md §7). Per batch, in this order:

1. each message is decoded and validated (``amqp_messages.parse_message``) and its ``app_id``
   resolved to a tenant (names → ids cached by ``tenants.TenantCache``), and its event
   checked against the tenant's event-type catalog (``catalog.Catalogs``, cached too);
2. the valid events, of any tenants, are stored in ONE transaction (``Store.ingest_each``); an
   event refused on its own (idempotency conflict, unknown channel ids) does not sink the
   others, and a batch that fails as a whole for another reason (a text Postgres cannot hold)
   is stored again event by event, so only the offender is refused;
3. after the commit, the stored messages (replays included) are acked; the refused ones are
   published to the dead-letter queue with the reason, on a publishing connection of its own
   with confirms (docs/architecture.md §4), and acked once confirmed;
4. anything else — Postgres unreachable, a dead-letter publish not confirmed — is held for
   ``store_retry_seconds`` and handed back to the queue (nack with requeue), never dead-lettered.

Nothing is acked before its outcome is settled for good, so a crash at any point redelivers.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Protocol

import msgspec
import trio

from notifier.broker.amqp import open_connection
from notifier.broker.base import Confirm, Incoming, Publisher, Settle
from notifier.broker.topology import ingest_topology
from notifier.catalog import Catalogs, EventRefused, StoredCatalog
from notifier.config import Config
from notifier.errors import BrokerError, StoreError, StoreUnavailable, UnstorableText
from notifier.ingest.amqp_messages import (
    NUL_MESSAGE,
    Parsed,
    Rejected,
    dead_letter_copy,
    parse_message,
)
from notifier.ingest.events import max_attempts_by_type, refusal
from notifier.ingest.tenants import TenantCaches
from notifier.lifecycle import Stop, watch_closing
from notifier.metrics import Metrics
from notifier.store.errors import IdempotencyConflict, UnknownChannels
from notifier.store.rows import IngestResult, NewEvent
from notifier.tracing import HEADER as TRACE_HEADER
from notifier.tracing import parse_traceparent

log = logging.getLogger("notifier.ingest.amqp")

# A batch in hand (its transaction, dead-letter publishes and settlements) is finished even
# during shutdown, bounded by this; what is not settled by then goes back to the queue.
BATCH_TIMEOUT_SECONDS = 20.0

Outcome = IngestResult | IdempotencyConflict | UnknownChannels


class IngestStore(Protocol):
    async def tenant_ids_by_names(self, names: Sequence[str]) -> dict[str, uuid.UUID]: ...

    async def event_catalog(self, tenant_id: uuid.UUID) -> StoredCatalog: ...

    async def stored_idempotency_keys(self, tenant_id: uuid.UUID, keys: list[str]) -> set[str]: ...

    async def ingest_each(
        self, events: Sequence[tuple[uuid.UUID, NewEvent]], max_attempts: Mapping[str, int]
    ) -> list[Outcome]: ...


@dataclasses.dataclass
class AmqpIngestStatistics:
    batches: int = 0  # batches taken from the queue
    transactions: int = 0  # ingest transactions committed
    received: int = 0  # messages taken from the consumer
    stored: int = 0  # new events
    replays: int = 0  # same idempotency key, same body: acked, nothing written
    dead_lettered: int = 0  # published to the dead-letter queue (confirmed), then acked
    requeued: int = 0  # handed back to the queue
    store_failures: int = 0  # batches (or single events) that failed for Postgres


class _Batch:
    """The messages of one batch, each settled exactly once."""

    def __init__(self, messages: Sequence[Incoming], stats: AmqpIngestStatistics) -> None:
        self.unsettled = {m.delivery_tag: m for m in messages}
        self._stats = stats

    def settle(self, message: Incoming, how: Settle) -> None:
        if self.unsettled.pop(message.delivery_tag, None) is not None:
            message.settle(how)
            if how is Settle.REQUEUE:
                self._stats.requeued += 1


class AmqpIngest:
    """Turns batches of consumed messages into transactions and settlements (see the module
    docstring). ``run_amqp_ingest`` builds one over RabbitMQ; tests pass fakes."""

    def __init__(
        self,
        config: Config,
        store: IngestStore,
        publisher: Publisher,
        stop: Stop,
        metrics: Metrics | None = None,
        tenant_caches: TenantCaches | None = None,
    ) -> None:
        cfg = config.amqp_ingest
        self._cfg = cfg
        self._max_body_bytes = config.ingest.max_body_bytes
        self._store = store
        self._publisher = publisher
        self._stop = stop
        # Tenant names that match no tenant are not remembered here (as the HTTP API remembers
        # unknown keys): a publisher is one the broker authenticated, not anyone on the network,
        # a whole batch's unknown names cost one lookup, and a refusal is final for its message
        # (dead-lettered, not tried again by a client), so a name remembered as unknown while a
        # NOTIFY cannot arrive would refuse the events of a tenant just created.
        caches = tenant_caches or TenantCaches()
        self._tenants = caches.cache(store.tenant_ids_by_names)
        # Each tenant's event-type catalog, forgotten with its tenant on every NOTIFY.
        self._catalogs = Catalogs(store.event_catalog)
        caches.register(self._catalogs, catalog=True)
        self._max_attempts = max_attempts_by_type(config)
        self._stats = AmqpIngestStatistics()
        self._ingested = (metrics or Metrics()).events_ingested.labels(source="amqp")

    def statistics(self) -> AmqpIngestStatistics:
        """A snapshot of the counters."""
        return dataclasses.replace(self._stats)

    async def run(self, receive: trio.MemoryReceiveChannel[Incoming]) -> None:
        """Trio-flavoured. Take and handle batches until ``stop`` or the channel's end; a batch
        taken is always handled to the end."""
        while not self._stop.is_set():
            batch, ended = await self._gather(receive)
            if batch:
                await self.handle(batch)
            if ended:
                return

    async def _gather(
        self, receive: trio.MemoryReceiveChannel[Incoming]
    ) -> tuple[list[Incoming], bool]:
        """Wait for a message, then take what arrives within the linger, up to ``prefetch``.
        A stop request ends the wait (and the linger: what was taken is kept)."""
        batch: list[Incoming] = []

        def take(message: Incoming) -> None:
            batch.append(message)
            self._stats.received += 1

        with self._stop.intake():
            try:
                take(await receive.receive())
                deadline = trio.current_time() + self._cfg.batch_linger_seconds
                while len(batch) < self._cfg.prefetch:
                    try:
                        take(receive.receive_nowait())
                        continue
                    except trio.WouldBlock:
                        pass
                    with trio.move_on_at(deadline) as linger:
                        take(await receive.receive())
                    if linger.cancelled_caught:
                        break
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return batch, True
        return batch, False

    async def handle(self, messages: Sequence[Incoming]) -> None:
        """Trio-flavoured (it calls the store and the publisher). Settle every message."""
        self._stats.batches += 1
        batch = _Batch(messages, self._stats)
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(BATCH_TIMEOUT_SECONDS) as bound:
                await self._store_and_dead_letter(batch)
            if bound.cancelled_caught:
                log.error("amqp ingest: a batch took over %.0f s; returning %d messages to the "
                          "queue", BATCH_TIMEOUT_SECONDS, len(batch.unsettled))  # fmt: skip
            if batch.unsettled:
                with self._stop.intake():  # a stop request ends the pause
                    await trio.sleep(self._cfg.store_retry_seconds)
        finally:
            for message in list(batch.unsettled.values()):
                batch.settle(message, Settle.REQUEUE)

    async def _store_and_dead_letter(self, batch: _Batch) -> None:
        parsed = [(m, self._parse(m)) for m in batch.unsettled.values()]
        refused = [(m, p) for m, p in parsed if isinstance(p, Rejected)]
        valid = [(m, p) for m, p in parsed if isinstance(p, Parsed)]
        try:
            stored, refused_by_store = await self._store_events(valid)
        except StoreError as exc:  # Postgres unreachable, or failing: nothing was stored
            self._stats.store_failures += 1
            log.warning("amqp ingest: storing %d events failed, they go back to the queue: %s",
                        len(valid), exc)  # fmt: skip
            stored, refused_by_store = [], []
        for message in stored:
            batch.settle(message, Settle.ACK)
        await self._dead_letter(batch, refused + refused_by_store)

    def _parse(self, m: Incoming) -> Parsed | Rejected:
        content_type = m.properties.get("content_type")
        try:
            return parse_message(
                m.body, app_id=m.app_id, message_id=m.message_id,
                content_type=content_type if isinstance(content_type, str) else None,
                tenants=self._cfg.tenants, max_body_bytes=self._max_body_bytes,
                traceparent=parse_traceparent(m.headers.get(TRACE_HEADER)),
            )  # fmt: skip
        except Exception:  # a bug: refuse this message instead of crashing on it forever
            log.exception("amqp ingest: reading message %s failed", m.message_id)
            return Rejected("internal_error", "the message could not be read (a bug; logged)")

    async def _store_events(
        self, valid: Sequence[tuple[Incoming, Parsed]]
    ) -> tuple[list[Incoming], list[tuple[Incoming, Rejected]]]:
        """Store what can be stored; return the messages stored (or replayed) and those refused.
        Raises ``StoreError`` when nothing could be stored; messages in neither list (their
        events failed for Postgres on their own) stay unsettled."""
        if not valid:
            return [], []
        tenant_ids = await self._tenants.resolve(p.tenant for _, p in valid)
        refused: list[tuple[Incoming, Rejected]] = []
        items: list[tuple[Incoming, uuid.UUID, NewEvent]] = []
        off_catalog: list[tuple[Incoming, uuid.UUID, NewEvent, Rejected]] = []
        for m, p in valid:
            tenant_id = tenant_ids.get(p.tenant)
            if tenant_id is None:
                reason = f"tenant {p.tenant!r} (app_id {m.app_id!r}) does not exist or is disabled"
                refused.append((m, Rejected("unknown_tenant", reason)))
            elif (wrong := await self._check(tenant_id, p.event)) is not None:
                off_catalog.append((m, tenant_id, p.event, wrong))
            else:
                items.append((m, tenant_id, p.event))
        stored_keys: dict[uuid.UUID, set[str]] = {}  # one lookup per tenant with a refusal
        for tenant_id in {t for _, t, _, _ in off_catalog}:
            keys = {e.idempotency_key for _, t, e, _ in off_catalog if t == tenant_id}
            wanted = sorted(k for k in keys if k is not None)
            stored_keys[tenant_id] = (
                await self._store.stored_idempotency_keys(tenant_id, wanted) if wanted else set()
            )
        for m, tenant_id, e, wrong in off_catalog:
            if e.idempotency_key in stored_keys[tenant_id]:
                # Stored already (a redelivery after a crash before the ack) while its type's
                # schema has changed since: a replay, acked as such, not dead-lettered.
                items.append((m, tenant_id, e))
            else:
                refused.append((m, wrong))
        if not items:
            return [], refused
        try:
            outcomes = await self._store.ingest_each(
                [(t, e) for _, t, e in items], self._max_attempts
            )
            self._stats.transactions += 1
            results: list[tuple[Incoming, Outcome | Rejected]] = [
                (m, o) for (m, _, _), o in zip(items, outcomes, strict=True)
            ]
        except StoreUnavailable:
            raise
        except StoreError as exc:
            # One event may have failed the transaction (a text Postgres cannot hold): store
            # them one by one, so that only the offender is refused.
            log.warning("amqp ingest: a batch of %d events failed (%s); storing them one by one",
                        len(items), exc)  # fmt: skip
            results = await self._one_by_one(items)
        stored: list[Incoming] = []
        for m, outcome in results:
            if isinstance(outcome, IngestResult):
                stored.append(m)
                if outcome.created:
                    self._stats.stored += 1
                    self._ingested.inc()
                else:
                    self._stats.replays += 1
            elif isinstance(outcome, IdempotencyConflict | UnknownChannels):
                refused.append((m, Rejected(*refusal(outcome))))
            else:
                refused.append((m, outcome))
        return stored, refused

    async def _check(self, tenant_id: uuid.UUID, event: NewEvent) -> Rejected | None:
        """The refusal of ``event`` by its tenant's event-type catalog (as the HTTP API's:
        ``schema_violation`` naming the path, ``unregistered_event_type``), or None."""
        catalog = await self._catalogs.of(tenant_id)
        if catalog.empty:
            return None
        try:
            catalog.check(event.type, msgspec.json.decode(event.payload))
        except EventRefused as exc:
            return Rejected(exc.code, exc.message)
        return None

    async def _one_by_one(
        self, items: Sequence[tuple[Incoming, uuid.UUID, NewEvent]]
    ) -> list[tuple[Incoming, Outcome | Rejected]]:
        """Each event in a transaction of its own. An event that fails for Postgres (other than
        for its text) is left out of the result (it stays unsettled); once Postgres is
        unreachable, so are all the rest."""
        results: list[tuple[Incoming, Outcome | Rejected]] = []
        for m, tenant_id, event in items:
            try:
                (outcome,) = await self._store.ingest_each([(tenant_id, event)], self._max_attempts)
            except UnstorableText:
                results.append((m, Rejected("validation_error", NUL_MESSAGE)))
                continue
            except StoreUnavailable as exc:
                self._stats.store_failures += 1
                log.warning("amqp ingest: Postgres unavailable: %s", exc)
                break
            except StoreError as exc:
                self._stats.store_failures += 1
                log.error("amqp ingest: storing message %s failed, it goes back to the queue: %s",
                          m.message_id, exc)  # fmt: skip
                continue
            self._stats.transactions += 1
            results.append((m, outcome))
        return results

    async def _dead_letter(
        self, batch: _Batch, refused: Sequence[tuple[Incoming, Rejected]]
    ) -> None:
        """Publish the refused messages to the dead-letter queue, all confirms awaited
        together; ack each one confirmed (the others stay unsettled)."""
        dlq = self._cfg.dead_letter_queue_name
        for m, reason in refused:
            log.warning("amqp ingest: message %s (app_id %r) refused, to %s: %s: %s",
                        m.message_id, m.app_id, dlq, reason.code, reason.message)  # fmt: skip
        copies = [dead_letter_copy(m, r, exchange=dlq, routing_key=self._cfg.queue)
                  for m, r in refused]  # fmt: skip
        confirms = await self._publisher.publish_batch(copies)
        for (m, _), confirm in zip(refused, confirms, strict=True):
            if confirm is Confirm.CONFIRMED:
                batch.settle(m, Settle.ACK)
                self._stats.dead_lettered += 1
            else:
                log.warning("amqp ingest: dead-letter publish of %s %s; it goes back to "
                            "the queue", m.message_id, confirm.value)  # fmt: skip


async def run_amqp_ingest(
    config: Config,
    store: IngestStore,
    stop: Stop,
    *,
    metrics: Metrics | None = None,
    tenant_caches: TenantCaches | None = None,
    task_status: trio.TaskStatus[AmqpIngest] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Consume ``[amqp_ingest] queue`` until ``stop``; ``task_status`` gets
    the ``AmqpIngest`` (for its ``statistics()``) once the queues are declared and consumed.

    Consumes on one AMQP connection and dead-letters on another (a publishing connection can
    be blocked by a broker alarm; acks must not wait behind it). Raises ``BrokerError`` when a
    connection or channel is lost: the supervisor restarts it, and the unacked messages have
    gone back to the queue. On stop, the batch in hand is finished and the channels close.
    """
    cfg, broker = config.amqp_ingest, config.broker
    topology = ingest_topology(cfg.queue, cfg.dead_letter_queue_name, broker.queue_type)
    heartbeat = broker.heartbeat_seconds
    async with (
        open_connection(broker.url, name="amqp_ingest", heartbeat_seconds=heartbeat) as conn,
        open_connection(
            broker.url, name="amqp_ingest.dead", heartbeat_seconds=heartbeat
        ) as publishing,
    ):
        await conn.declare(topology)
        async with (
            publishing.open_publisher(broker.publish_timeout_seconds) as publisher,
            conn.open_consumer(cfg.queue, cfg.prefetch) as consumer,
            trio.open_nursery() as nursery,
        ):
            ingest = AmqpIngest(config, store, publisher, stop, metrics, tenant_caches)
            lost = watch_closing(nursery, {
                "consuming connection": conn.wait_closed,
                "consuming channel": consumer.wait_closed,
                "dead-letter connection": publishing.wait_closed,
                "dead-letter channel": publisher.wait_closed,
            })  # fmt: skip
            task_status.started(ingest)
            log.info("amqp ingest: consuming %s (prefetch %d)", cfg.queue, cfg.prefetch)
            await ingest.run(consumer.receive)
            nursery.cancel_scope.cancel()  # stopped: end the watchers before the channels close
        if lost:
            raise BrokerError(f"amqp ingest: {lost[0]} lost")
