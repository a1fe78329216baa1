"""The errors the store raises for what a caller asked (besides ``notifier.errors``' store
errors for Postgres itself): the API answers each with its own status."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from notifier.errors import StoreError


class TenantExists(StoreError):
    """A tenant with this name already exists (names are unique)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"a tenant named {name!r} already exists")
        self.name = name


class IdempotencyConflict(StoreError):
    """An idempotency key was reused with a different request body."""

    def __init__(self, key: str) -> None:
        super().__init__(f"idempotency key {key!r} was already used with a different request")
        self.key = key


class UnknownChannels(StoreError):
    """``channel_ids`` named channels that do not exist for this tenant."""

    def __init__(self, ids: Sequence[uuid.UUID]) -> None:
        super().__init__("unknown channel ids: " + ", ".join(str(i) for i in ids))
        self.ids = list(ids)


class ConfigChanged(StoreError):
    """A channel's config changed between the read a new config was made from and its write."""


class NotFound(StoreError):
    """The row does not exist (or belongs to another tenant)."""


class NotReplayable(StoreError):
    """A replay was asked for a delivery that cannot be replayed now; the message says why."""


class DeliveriesInFlight(StoreError):
    """An event's payload cannot be expunged while a delivery of it is PENDING or RETRYING: its
    message, on its way to a worker, carries the payload."""

    def __init__(self, count: int) -> None:
        super().__init__(
            f"{count} of the event's deliveries are PENDING or RETRYING: their messages carry "
            "the payload; expunge it once they are DELIVERED or DEAD"
        )
        self.count = count


class TooManyEventTypes(StoreError):
    """A new event type for a tenant whose catalog is full (``catalog.MAX_EVENT_TYPES``)."""


class CatalogTooLarge(StoreError):
    """A type whose schema would make its tenant's schemas exceed ``catalog.MAX_CATALOG_BYTES``
    in all."""
