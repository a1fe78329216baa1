"""A delivery whose channel is disabled or deleted is not attempted: it ends DEAD saying why
(README, "Channel health"), and the adapter is never called."""

from __future__ import annotations

import pytest

from notifier.broker.base import Settle
from notifier.testing import MemoryDeliveries, RecordingAdapter
from tests.unit.test_handler import Rig, message


@pytest.mark.parametrize(
    ("channel_state", "reason", "error"),
    [
        ("disabled", "HTTP 410: gone", "channel disabled: HTTP 410: gone"),
        ("disabled", None, "channel disabled"),
        ("deleted", None, "channel deleted"),
    ],
)
async def test_a_delivery_of_a_channel_that_is_not_enabled_ends_dead_unattempted(
    channel_state: str, reason: str | None, error: str
) -> None:
    store = MemoryDeliveries()
    adapter = RecordingAdapter()
    rig = Rig(adapter, store)
    m = message(1)
    store.add(m.delivery_id, channel_state=channel_state, channel_reason=reason)

    assert await rig.handle(m) is Settle.REJECT
    assert adapter.messages == []
    assert store.state(m.delivery_id).status == "DEAD"  # type: ignore[union-attr]
    [row] = store.attempts
    assert (row.outcome, row.error, row.attempt) == ("dead", error, 1)


async def test_an_enabled_channel_is_attempted() -> None:
    store = MemoryDeliveries()
    adapter = RecordingAdapter()
    rig = Rig(adapter, store)
    m = message(1)
    store.add(m.delivery_id, channel_state="enabled")

    assert await rig.handle(m) is Settle.ACK
    assert [d.delivery_id for d in adapter.messages] == [m.delivery_id]
