"""A worker message to test with."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from notifier.messages import WorkerMessage

# -- worker messages ----------------------------------------------------------------------------


def worker_message(n: int = 1, **changes: Any) -> WorkerMessage:
    """A ``WorkerMessage`` for tests: delivery ``UUID(int=n)``, fixed other ids and time, a
    webhook channel; ``changes`` replace any field."""
    fields: dict[str, Any] = {
        "delivery_id": uuid.UUID(int=n),
        "event_id": uuid.UUID(int=1000 + n),
        "tenant_id": uuid.UUID(int=7),
        "channel_id": uuid.UUID(int=8),
        "channel_type": "webhook",
        "channel_config": {"url": "https://example.com/hook"},
        "event_type": "order.created",
        "recipient": None,
        "payload": {"n": n},
        "created_at": datetime(2024, 1, 1, tzinfo=UTC),
        "attempt": 1,
        "max_attempts": 5,
    }
    fields.update(changes)
    return WorkerMessage(**fields)
