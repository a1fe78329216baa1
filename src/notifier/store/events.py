"""The store's queries for events: ingest over HTTP (a batch stored whole or not at all) and
over AMQP (a batch of any tenants' events, each on its own), and reading an event back."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any, cast

from notifier.store.base import Conn, Q, Row, crossing, transaction
from notifier.store.errors import IdempotencyConflict, UnknownChannels
from notifier.store.pool import Queries
from notifier.store.rows import DeliverySummary, Event, IngestResult, NewEvent


def _summaries(items: list[dict[str, Any]]) -> list[DeliverySummary]:
    return [
        DeliverySummary(
            id=uuid.UUID(d["id"]),
            channel_id=uuid.UUID(d["channel_id"]),
            channel_type=d["channel_type"],
            status=d["status"],
        )
        for d in items
    ]


def _event(
    row: Row, idempotency_key: str | None, deliveries: list[DeliverySummary] | None = None
) -> Event:
    """The event of ``row``, with ``deliveries`` (by default: the row's ``deliveries``)."""
    return Event(
        id=row["id"],
        type=row["type"],
        recipient=row["recipient"],
        payload=row["payload"],
        idempotency_key=idempotency_key,
        created_at=row["created_at"],
        deliveries=_summaries(row["deliveries"]) if deliveries is None else deliveries,
        payload_expunged_at=row.get("payload_expunged_at"),  # event_get's (queries_events.sql)
    )


def _created(row: Row, idempotency_key: str | None) -> Event:
    """An event ``insert_events`` has just stored, its deliveries PENDING."""
    return _event(row, idempotency_key, [
        DeliverySummary(id=d, channel_id=c, channel_type=t, status="PENDING")
        for d, c, t in zip(
            row["delivery_ids"], row["channel_ids"], row["channel_types"], strict=True
        )
    ])  # fmt: skip


def _all_or_conflict(outcomes: list[IngestResult | IdempotencyConflict]) -> list[IngestResult]:
    """The results of a batch that is stored whole, or the first conflict in it, raised."""
    for outcome in outcomes:
        if isinstance(outcome, IdempotencyConflict):
            raise outcome
    return cast(list[IngestResult], outcomes)


class EventQueries(Queries):
    """Events in, each with its fan-out deliveries and their outbox rows, in one transaction."""

    @transaction
    async def ingest(
        self,
        tenant_id: uuid.UUID,
        events: Sequence[NewEvent],
        max_attempts: Mapping[str, int],
    ) -> list[IngestResult]:
        """Store events, their deliveries and outbox rows atomically, in the order given.

        Raises ``IdempotencyConflict`` or ``UnknownChannels`` having written nothing.
        """
        named = {cid for e in events for cid in (e.channel_ids or ())}
        async with self._pool.acquire() as conn:
            if named:
                owned = {r["id"] for r in await conn.fetch(Q["channels_owned"], tenant_id, named)}
                if missing := sorted(named - owned):
                    raise UnknownChannels(missing)
            # One statement without an explicit transaction is a single round trip, atomic on
            # its own; only a key can make it skip an event, and one event skipped for a
            # conflict writes nothing. With several keys, a conflict anywhere must roll the
            # whole batch back.
            alone = len(events) == 1 or all(e.idempotency_key is None for e in events)
            async with nullcontext() if alone else conn.transaction():
                outcomes = await self._ingest_group(conn, tenant_id, events, max_attempts)
                return _all_or_conflict(outcomes)

    @crossing
    async def get_event(self, tenant_id: uuid.UUID, event_id: uuid.UUID) -> Event | None:
        row = await self._pool.fetchrow(Q["event_get"], tenant_id, event_id)
        return _event(row, row["idempotency_key"]) if row else None

    @crossing
    async def tenant_ids_by_names(self, names: Sequence[str]) -> dict[str, uuid.UUID]:
        """Name → id of those of the tenants ``names`` that exist."""
        rows = await self._pool.fetch(Q["amqp_tenants_by_names"], list(names))
        return {r["name"]: r["id"] for r in rows}

    @transaction
    async def ingest_each(
        self,
        events: Sequence[tuple[uuid.UUID, NewEvent]],
        max_attempts: Mapping[str, int],
    ) -> list[IngestResult | IdempotencyConflict | UnknownChannels]:
        """Store ``(tenant id, event)`` pairs, of any tenants, in one transaction (one statement
        for one tenant's), each event on its own: one outcome per event, in order — its
        ``IngestResult`` (``created`` False for a replay: same key, same body), or the error
        that kept it out (its idempotency key used with another body, its ``channel_ids``
        naming channels its tenant does not have) while the others are stored.

        Raises, having written nothing, only what fails the transaction as a whole
        (``StoreUnavailable``, ``UnstorableText`` ...).
        """
        outcomes: dict[int, IngestResult | IdempotencyConflict | UnknownChannels] = {}
        named = {cid for _, e in events for cid in (e.channel_ids or ())}
        async with self._pool.acquire() as conn:
            owned: set[tuple[uuid.UUID, uuid.UUID]] = set()
            if named:
                rows = await conn.fetch(Q["amqp_channels_owned"], list(named))
                owned = {(r["tenant_id"], r["id"]) for r in rows}
            groups: dict[uuid.UUID, list[int]] = {}
            for i, (tenant_id, e) in enumerate(events):
                missing = {c for c in e.channel_ids or () if (tenant_id, c) not in owned}
                if missing:
                    outcomes[i] = UnknownChannels(sorted(missing))
                else:
                    groups.setdefault(tenant_id, []).append(i)
            # One tenant's events go in with one statement, atomic on its own, and the replays
            # are read after it: no BEGIN and COMMIT, two round trips fewer.
            async with nullcontext() if len(groups) <= 1 else conn.transaction():
                await self._ingest_groups(conn, events, groups, max_attempts, outcomes)
        return [outcomes[i] for i in range(len(events))]

    @classmethod
    async def _ingest_groups(
        cls,
        conn: Conn,
        events: Sequence[tuple[uuid.UUID, NewEvent]],
        groups: dict[uuid.UUID, list[int]],
        max_attempts: Mapping[str, int],
        outcomes: dict[int, IngestResult | IdempotencyConflict | UnknownChannels],
    ) -> None:
        """Asyncio-flavoured. Each tenant's events of ``events`` (by index, in ``groups``), their
        outcomes put in ``outcomes``. Tenants in id order, like the keys within each (see
        insert_events): two batches holding the same tenants' keys in other orders cannot
        deadlock."""
        for tenant_id, indexes in sorted(groups.items()):
            group = [events[i][1] for i in indexes]
            found = await cls._ingest_group(conn, tenant_id, group, max_attempts)
            outcomes.update(zip(indexes, found, strict=True))

    @staticmethod
    async def _ingest_group(
        conn: Conn,
        tenant_id: uuid.UUID,
        events: Sequence[NewEvent],
        max_attempts: Mapping[str, int],
    ) -> list[IngestResult | IdempotencyConflict]:
        """Asyncio-flavoured. The events of one tenant, each on its own: one outcome per event
        (its ``IngestResult``, or the ``IdempotencyConflict`` that kept it out), in two
        statements at most. ``ingest`` raises the first conflict; ``ingest_each`` keeps the
        others."""
        payload = [
            {"id": e.id, "type": e.type, "recipient": e.recipient, "payload": e.payload,
             "idempotency_key": e.idempotency_key, "request_hash": e.request_hash,
             "channel_ids": e.channel_ids, "traceparent": e.traceparent, "ord": i}
            for i, e in enumerate(events)
        ]  # fmt: skip
        rows = await conn.fetch(Q["insert_events"], tenant_id, payload, max_attempts)
        created = {r["id"]: r for r in rows}
        earlier: dict[str, Row] = {}
        if skipped := [e.idempotency_key for e in events if e.id not in created]:
            for r in await conn.fetch(Q["events_by_keys"], tenant_id, skipped):
                earlier[r["idempotency_key"]] = r
        outcomes: list[IngestResult | IdempotencyConflict] = []
        for e in events:
            key = e.idempotency_key
            if e.id in created:
                outcomes.append(IngestResult(event=_created(created[e.id], key), created=True))
                continue
            assert key is not None  # only a key makes an insert skip an event
            prior = earlier.get(key)
            if prior is None or prior["request_hash"] != e.request_hash:
                outcomes.append(IdempotencyConflict(key))
            else:
                outcomes.append(IngestResult(event=_event(prior, key), created=False))
        return outcomes
