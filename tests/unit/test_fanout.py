"""The fan-out rule (docs/architecture.md §3) as ``notifier.testing`` states it in Python."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from notifier.store.rows import Channel
from notifier.testing import fanout_targets, pattern_matches

TENANT = uuid.UUID(int=1)
OTHER_TENANT = uuid.UUID(int=2)
NOW = datetime(2024, 1, 1, tzinfo=UTC)


def channel(
    name: str,
    *,
    event_types: list[str] | None = None,
    recipient: str | None = None,
    enabled: bool = True,
    tenant_id: uuid.UUID = TENANT,
) -> Channel:
    return Channel(
        id=uuid.uuid5(uuid.NAMESPACE_OID, name),
        tenant_id=tenant_id,
        type="webhook",
        name=name,
        config={"url": "https://example.com/hook"},
        recipient=recipient,
        event_types=event_types if event_types is not None else ["*"],
        enabled=enabled,
        max_attempts=None,
        created_at=NOW,
        updated_at=NOW,
    )


# (pattern, event type, whether it matches): the rule's cases, which
# tests/integration/test_schema_functions.py also puts to the SQL function notifier_type_matches.
PATTERN_CASES = [
    ("*", "order.created", True),  # "*" matches every type
    ("*", "x", True),  # ... including single-word ones
    ("order.*", "order.created", True),  # a prefix pattern matches one more word
    ("order.*", "order.a.b", True),  # ... or several
    ("order.*", "order.", True),  # ... or an empty one after the dot
    ("order.*", "order", False),  # ... but not the bare prefix
    ("order.*", "orderx.created", False),  # ... nor a longer first word
    ("order.*", "shop.order.created", False),  # ... nor the prefix further in
    ("order.*", "Order.created", False),  # ... nor another case
    ("order", "order.created", False),  # a pattern without ".*" is no prefix
    ("order.created", "order.created", True),  # exact
    ("order.created", "order.created.v2", False),  # exact means exact
    ("order.created", "order.deleted", False),  # exact, different
    ("order.created", "Order.Created", False),  # case matters
    ("order*", "order.created", False),  # "*" is special only alone or after a dot
    ("order.*", "order.*", True),  # a type may itself end in ".*"
    ("or_er.*", "order.created", False),  # "_" and "%" are plain characters, not wildcards
    ("%.*", "order.created", False),
    ("", "", True),  # the empty pattern matches only the empty type
    ("", "order", False),
]


@pytest.mark.parametrize(("pattern", "event_type", "matches"), PATTERN_CASES)
def test_pattern_matches(pattern: str, event_type: str, matches: bool) -> None:
    assert pattern_matches(pattern, event_type) is matches


ALL = channel("all")
ORDERS = channel("orders", event_types=["order.*"])
EXACT = channel("exact", event_types=["user.signed_up", "user.deleted"])
FOR_ALICE = channel("alice", recipient="alice")
FOR_BOB = channel("bob", recipient="bob")
DISABLED = channel("disabled", enabled=False)
FOREIGN = channel("foreign", tenant_id=OTHER_TENANT)
FOREIGN_ORDERS = channel("foreign-orders", event_types=["order.*"], tenant_id=OTHER_TENANT)
CHANNELS = [ALL, ORDERS, EXACT, FOR_ALICE, FOR_BOB, DISABLED, FOREIGN, FOREIGN_ORDERS]


@pytest.mark.parametrize(
    ("event_type", "recipient", "channel_ids", "expected"),
    [
        # no recipient: only channels without one; patterns decide; disabled and foreign never
        ("order.created", None, None, [ALL, ORDERS]),
        # an exact pattern among several
        ("user.deleted", None, None, [ALL, EXACT]),
        # no pattern matches but "*"
        ("invoice.paid", None, None, [ALL]),
        # a recipient: only that recipient's channels (None does not match "alice")
        ("order.created", "alice", None, [FOR_ALICE]),
        # a recipient nobody subscribes for: nothing, which is not an error
        ("order.created", "carol", None, []),
        # explicit ids select exactly those, whatever their patterns and recipients
        ("invoice.paid", None, [ORDERS.id, FOR_BOB.id], [ORDERS, FOR_BOB]),
        # ... but a disabled one or another tenant's one is still left out
        ("order.created", None, [ALL.id, DISABLED.id, FOREIGN.id], [ALL]),
        # ... and an empty list selects nothing
        ("order.created", None, [], []),
        # ... and an unknown id selects nothing
        ("order.created", None, [uuid.UUID(int=99)], []),
    ],
)
def test_fanout_targets(
    event_type: str,
    recipient: str | None,
    channel_ids: list[uuid.UUID] | None,
    expected: list[Channel],
) -> None:
    got = fanout_targets(
        CHANNELS,
        tenant_id=TENANT,
        event_type=event_type,
        recipient=recipient,
        channel_ids=channel_ids,
    )
    assert [c.name for c in got] == [c.name for c in expected]


def test_the_other_tenant_sees_only_its_own_channels() -> None:
    got = fanout_targets(CHANNELS, tenant_id=OTHER_TENANT, event_type="order.paid", recipient=None)
    assert got == [FOREIGN, FOREIGN_ORDERS]


@pytest.mark.parametrize(
    ("channel_recipient", "event_recipient", "matches"),
    [
        (None, None, True),  # both absent: IS NOT DISTINCT FROM
        ("alice", "alice", True),  # equal
        ("alice", None, False),  # a recipient channel does not get recipient-less events
        (None, "alice", False),  # a recipient-less channel does not get recipient events
        ("alice", "Alice", False),  # compared exactly
    ],
)
def test_recipient_must_be_equal(
    channel_recipient: str | None, event_recipient: str | None, matches: bool
) -> None:
    c = channel("c", recipient=channel_recipient)
    got = fanout_targets([c], tenant_id=TENANT, event_type="a.b", recipient=event_recipient)
    assert got == ([c] if matches else [])
