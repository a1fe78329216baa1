"""The wire format of queue messages: what a worker needs to deliver, snapshotted at fan-out.

Every outbox body is built by Postgres with the SQL function ``notifier_worker_message``
(schema.sql), with exactly these keys; tests/integration/test_schema_functions.py decodes it with
this type and holds the two to the same fields.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec


class WorkerMessage(msgspec.Struct, frozen=True, kw_only=True):
    delivery_id: uuid.UUID
    event_id: uuid.UUID
    tenant_id: uuid.UUID
    channel_id: uuid.UUID
    channel_type: str
    channel_config: dict[str, Any]
    event_type: str
    recipient: str | None
    payload: dict[str, Any]
    created_at: datetime
    attempt: int  # the number of the attempt this message asks for, 1-based
    # the highest number an attempt may have (the delivery's max_attempts): the budget counted
    # from the delivery's creation or its latest replay, whose entry has a number of its own
    max_attempts: int


_decoder = msgspec.json.Decoder(WorkerMessage)
_encoder = msgspec.json.Encoder()


def decode_message(body: bytes) -> WorkerMessage:
    """Raise ``msgspec.DecodeError`` (or its subclass ``ValidationError``) for a bad body."""
    return _decoder.decode(body)


def encode_message(message: WorkerMessage) -> bytes:
    return _encoder.encode(message)
