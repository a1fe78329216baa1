"""What ingest makes of an accepted event: the request hash idempotency compares — the same
bytes as ever (hashes stored by earlier versions keep matching), whatever the order of a body's
keys — and fresh event ids."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import msgspec
import pytest

from notifier.ingest.events import new_event, new_ids, request_hash
from notifier.ingest.models import EventIn

CASES = [
    EventIn(type="a.b", payload={}),
    EventIn(type="order.created", payload={"n": 1}, recipient="user-1"),
    EventIn(
        type="x",
        recipient="r",
        channel_ids=[uuid.UUID(int=1), uuid.UUID(int=2)],
        payload={"z": 1, "a": {"y": [1, {"b": 2, "a": 'é\u2028"'}], "x": None}, "": 1.5},
    ),
]


def as_first_defined(e: EventIn) -> str:
    """The definition: the four fields as one JSON object, every object's keys sorted."""
    fields: dict[str, Any] = {
        "type": e.type, "payload": e.payload, "recipient": e.recipient,
        "channel_ids": e.channel_ids,
    }  # fmt: skip
    return hashlib.sha256(msgspec.json.encode(fields, order="sorted")).hexdigest()


@pytest.mark.parametrize("event", CASES)
def test_the_hash_is_the_canonical_encodings(event: EventIn) -> None:
    assert request_hash(event) == as_first_defined(event)
    assert new_event(event, "k").request_hash == as_first_defined(event)


def test_a_known_hash_is_unchanged() -> None:
    assert request_hash(CASES[1]) == (
        "3d1b39cc38aac64a191595c14fc717a013954f0753837165cc428ebc78d497be"
    )


def test_the_order_of_a_payloads_keys_does_not_change_the_hash() -> None:
    one = EventIn(type="t", payload={"a": 1, "b": {"c": 2, "d": 3}})
    other = EventIn(type="t", payload={"b": {"d": 3, "c": 2}, "a": 1})
    assert request_hash(one) == request_hash(other)
    assert new_event(one, None).payload == new_event(other, None).payload


def test_new_ids_are_distinct_version_4_uuids() -> None:
    ids = new_ids(1000)
    assert len(set(ids)) == 1000
    assert {(i.version, i.variant) for i in ids} == {(4, uuid.RFC_4122)}
    assert new_ids(0) == []
