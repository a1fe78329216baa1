"""Postgres access: the trio-flavoured ``Store`` (one class of queries per role, composed in
``pg``), the errors it raises, and ``ApiStore``, what the HTTP API needs of it."""

from notifier.store.api import ApiStore
from notifier.store.pg import (
    ConfigChanged,
    Doorbell,
    IdempotencyConflict,
    NotFound,
    NotReplayable,
    OutboxClaim,
    Store,
    UnknownChannels,
    open_store,
)

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
