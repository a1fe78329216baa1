"""Postgres access: the trio-flavoured ``Store`` (one class of queries per role, composed in
``pg``), the errors it raises, and ``ApiStore``, what the HTTP API needs of it."""

from notifier.hint import Doorbell
from notifier.store.api import ApiStore
from notifier.store.errors import (
    ConfigChanged,
    IdempotencyConflict,
    NotFound,
    NotReplayable,
    UnknownChannels,
)
from notifier.store.outbox import OutboxClaim
from notifier.store.pg import Store, open_store

__all__ = [
    "ApiStore",
    "ConfigChanged",
    "Doorbell",
    "IdempotencyConflict",
    "NotFound",
    "NotReplayable",
    "OutboxClaim",
    "Store",
    "UnknownChannels",
    "open_store",
]
