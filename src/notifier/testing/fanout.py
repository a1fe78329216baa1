"""The fan-out rule in Python, as the store's SQL implements it (``notifier_type_matches``,
the payload filters of ``notifier.filters`` and the fan-out in ``queries_events.sql``), for the
in-memory fakes."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from notifier import filters
from notifier.store.rows import (
    Channel,
)

# -- fan-out rule -------------------------------------------------------------------------------


def pattern_matches(pattern: str, event_type: str) -> bool:
    """``*`` matches everything, ``a.b.*`` matches ``a.b.<anything>``, else exact: the rule of
    the SQL function ``notifier_type_matches`` (schema.sql), which the store's queries use, for
    the in-memory fakes; a test puts the same cases to both."""
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return event_type.startswith(pattern[:-1])
    return pattern == event_type


def fanout_targets(
    channels: Iterable[Channel],
    *,
    tenant_id: uuid.UUID,
    event_type: str,
    recipient: str | None,
    channel_ids: Sequence[uuid.UUID] | None = None,
    payload: Any = None,
) -> list[Channel]:
    """The channels an event goes to (docs/architecture.md §3): enabled channels of the tenant that
    are named in ``channel_ids``, or, without it, whose recipient equals the event's (both may be
    None) and one of whose patterns matches the event type; either way only those whose payload
    filter, if any, the event's ``payload`` passes (``notifier.filters.matches``)."""
    out = []
    for c in channels:
        if c.tenant_id != tenant_id or not c.enabled:
            continue
        if c.filter is not None and not filters.matches(c.filter, payload):
            continue
        if channel_ids is not None:
            if c.id in channel_ids:
                out.append(c)
        elif c.recipient == recipient and any(
            pattern_matches(p, event_type) for p in c.event_types
        ):
            out.append(c)
    return out
