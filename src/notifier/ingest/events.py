"""From an accepted event body to what the store ingests; shared by the HTTP API and AMQP ingest."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import msgspec

from notifier.config import Config
from notifier.errors import StoreError, StoreUnavailable
from notifier.ingest.models import EventIn
from notifier.store.errors import IdempotencyConflict, UnknownChannels
from notifier.store.rows import IngestResult, NewEvent


def max_attempts_by_type(config: Config) -> dict[str, int]:
    """The default ``max_attempts`` of each enabled channel type (fixed into new deliveries)."""
    return {t: w.max_attempts for t, w in config.workers.enabled().items()}


def request_hash(e: EventIn, payload: bytes | None = None) -> str:
    """What idempotency compares: the event without its key, in a canonical encoding — the
    JSON object of its fields with every object's keys sorted. ``payload``, when given, is
    ``e.payload`` already encoded that way (``new_event`` stores the same bytes)."""
    if payload is None:
        payload = msgspec.json.encode(e.payload, order="sorted")
    canonical = msgspec.json.encode(
        {"type": e.type, "payload": msgspec.Raw(payload), "recipient": e.recipient,
         "channel_ids": e.channel_ids},
        order="sorted",
    )  # fmt: skip
    return hashlib.sha256(canonical).hexdigest()


def new_ids(count: int) -> list[uuid.UUID]:
    """``count`` random (version 4) UUIDs, as ``uuid.uuid4`` makes them, from one read of the
    system's random source for all of them (``uuid4`` reads it once per id)."""
    data = os.urandom(16 * count)
    return [uuid.UUID(bytes=data[i : i + 16], version=4) for i in range(0, 16 * count, 16)]


def new_event(
    e: EventIn, key: str | None, event_id: uuid.UUID | None = None,
    traceparent: str | None = None,
) -> NewEvent:  # fmt: skip
    """The event to store, with ``event_id`` (by default a fresh one), its payload as JSON,
    ``key`` as idempotency key and the trace context it was ingested under. The payload's keys
    are sorted, as in the request hash: ``jsonb`` keeps no key order."""
    payload = msgspec.json.encode(e.payload, order="sorted")
    return NewEvent(
        id=event_id or uuid.uuid4(), type=e.type, recipient=e.recipient,
        payload=msgspec.Raw(payload), idempotency_key=key,
        request_hash=request_hash(e, payload), channel_ids=e.channel_ids,
        traceparent=traceparent,
    )  # fmt: skip


Outcome = IngestResult | IdempotencyConflict | UnknownChannels


def refusal(exc: IdempotencyConflict | UnknownChannels) -> tuple[str, str]:
    """The error code and message an event the store refused is answered with, over HTTP
    (409 and 422) and over AMQP (the dead-lettered message's reason)."""
    if isinstance(exc, IdempotencyConflict):
        return "idempotency_conflict", str(exc)
    return "validation_error", f"channel_ids: {exc}"


Pair = tuple[uuid.UUID, NewEvent]  # a tenant id and one of its events


class EachStore(Protocol):
    async def ingest_each(
        self, events: Sequence[Pair], max_attempts: Mapping[str, int]
    ) -> list[Outcome]: ...


def store_each(
    store: EachStore, max_attempts: Mapping[str, int]
) -> Callable[[Sequence[Pair]], Awaitable[list[Outcome | StoreError]]]:
    """The batch function of the group commit of single events (``groupcommit.GroupCommit``):
    the events of concurrent requests, of any tenants, stored together, each on its own — one
    outcome per event (its result, its idempotency conflict, its unknown channels), so that one
    request's refusal is not another's.

    Postgres unavailable fails the whole batch (every request answers 503, as alone). Any other
    store error fails the batch's statement for all, though one event may be the cause (a text
    Postgres cannot hold): the events are then stored one by one, so that only the offender gets
    the error, as its outcome."""

    async def run(events: Sequence[Pair]) -> list[Outcome | StoreError]:
        try:
            return list(await store.ingest_each(events, max_attempts))
        except StoreUnavailable:
            raise
        except StoreError:
            if len(events) == 1:
                raise
        outcomes: list[Outcome | StoreError] = []
        for pair in events:
            try:
                outcomes.extend(await store.ingest_each([pair], max_attempts))
            except StoreUnavailable as exc:
                outcomes.extend([exc] * (len(events) - len(outcomes)))  # and the rest too
                break
            except StoreError as exc:
                outcomes.append(exc)
        return outcomes

    return run
