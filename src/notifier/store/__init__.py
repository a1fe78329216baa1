"""Postgres access: the trio-flavoured ``Store`` and the row types it hands out."""

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
