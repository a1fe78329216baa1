"""From an accepted event body to what the store ingests; shared by the HTTP API and AMQP ingest."""

from __future__ import annotations

import hashlib
import uuid

import msgspec

from notifier.config import Config
from notifier.ingest.models import EventIn
from notifier.store.rows import NewEvent


def max_attempts_by_type(config: Config) -> dict[str, int]:
    """The default ``max_attempts`` of each enabled channel type (fixed into new deliveries)."""
    return {t: w.max_attempts for t, w in config.workers.enabled().items()}


def request_hash(e: EventIn) -> str:
    """What idempotency compares: the event without its key, in a canonical encoding."""
    canonical = msgspec.json.encode(
        {"type": e.type, "payload": e.payload, "recipient": e.recipient,
         "channel_ids": e.channel_ids},
        order="sorted",
    )  # fmt: skip
    return hashlib.sha256(canonical).hexdigest()


def new_event(e: EventIn, key: str | None) -> NewEvent:
    """The event to store, with a fresh id, its payload as JSON and ``key`` as idempotency key."""
    return NewEvent(
        id=uuid.uuid4(), type=e.type, recipient=e.recipient,
        payload=msgspec.Raw(msgspec.json.encode(e.payload)), idempotency_key=key,
        request_hash=request_hash(e), channel_ids=e.channel_ids,
    )  # fmt: skip
