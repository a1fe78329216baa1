"""The relay carries each row's trace context as the AMQP header ``traceparent``; with
tracing on, a publish span per traced row, a child of its ingest span, ended whatever the
broker did (also when publishing raises)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest

from notifier.broker.base import Confirm, Outgoing
from notifier.errors import BrokerError
from notifier.relay.relay import relay_once
from notifier.testing import MemoryBroker, MemoryOutbox
from notifier.testing.tracing import RecordingTracing
from notifier.tracing import Kind

INGEST = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def broker() -> MemoryBroker:
    b = MemoryBroker()
    b.bind("deliveries", "webhook", "deliveries.webhook")
    return b


class Raising(MemoryBroker):
    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        raise BrokerError("the channel broke")


async def test_with_tracing_off_the_header_is_the_rows_traceparent() -> None:
    outbox, mq = MemoryOutbox(), broker()
    outbox.add(uuid.UUID(int=1), "webhook", b"one", traceparent=INGEST)
    outbox.add(uuid.UUID(int=2), "webhook", b"two")
    assert await relay_once(outbox, mq, batch_size=10) == 2
    assert [m.headers for m in mq.published] == [{"traceparent": INGEST}, None]


async def test_with_tracing_on_each_traced_row_has_a_publish_span() -> None:
    outbox, mq, tracing = MemoryOutbox(), broker(), RecordingTracing()
    outbox.add(uuid.UUID(int=1), "webhook", b"one", traceparent=INGEST)
    outbox.add(uuid.UUID(int=2), "webhook", b"two")  # ingested untraced: no span
    outbox.add(uuid.UUID(int=3), "nowhere", b"three", traceparent=INGEST)  # returned
    assert await relay_once(outbox, mq, batch_size=10, tracing=tracing) == 3
    first, returned = tracing.spans
    assert (first.name, first.kind, first.parent) == ("notifier.publish", Kind.PRODUCER, INGEST)
    assert first.attributes["notifier.confirm"] == "confirmed"
    assert returned.attributes["notifier.confirm"] == "returned"
    assert [(s.ended, s.error) for s in tracing.spans] == [(1, None), (1, None)]
    headers = [m.headers for m in mq.published]
    assert headers == [
        {"traceparent": first.traceparent},
        None,
        {"traceparent": returned.traceparent},
    ]


async def test_publish_spans_end_when_publishing_raises() -> None:
    outbox, tracing = MemoryOutbox(), RecordingTracing()
    outbox.add(uuid.UUID(int=1), "webhook", b"one", traceparent=INGEST)
    with pytest.raises(BrokerError):
        await relay_once(outbox, Raising(), batch_size=10, tracing=tracing)
    (span,) = tracing.spans
    assert span.ended == 1
    assert isinstance(span.error, BrokerError)
    assert len(outbox.rows) == 1  # the row stays
