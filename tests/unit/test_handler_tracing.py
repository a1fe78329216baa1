"""The handler's span per attempt (README, Tracing): a child of the message's ``traceparent``
header, current while the adapter delivers (what the webhook sends), with its attributes and
ids on the attempt row; the retry copy carries the header as it came, so the next attempt is a
sibling; with tracing off the header's context is passed on unchanged."""

from __future__ import annotations

from typing import Any

from notifier.adapters.base import Receipt
from notifier.broker.base import Incoming, Settle
from notifier.errors import RetriableError
from notifier.messages import WorkerMessage, encode_message
from notifier.testing import MemoryDeliveries, RecordingAdapter
from notifier.testing.tracing import TRACE_OF_NEW, RecordingTracing
from notifier.tracing import NO_TRACING, Kind, Tracing, current_traceparent
from notifier.worker.handle import Handler
from tests.unit.test_handler import POLICY, TIMEOUT, SettleLog, message, routed_broker

TRACE = "0af7651916cd43dd8448eb211c80319c"
PUBLISH = f"00-{TRACE}-b7ad6b7169203331-01"


class SeesContext(RecordingAdapter):
    """Notes the trace context current while each message is delivered."""

    def __init__(self, *steps: Any) -> None:
        super().__init__("webhook", *steps)
        self.contexts: list[str | None] = []

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        self.contexts.append(current_traceparent())
        return await super().deliver(message)


def rig(adapter: SeesContext, tracing: Tracing) -> tuple[Handler, MemoryDeliveries, Any, Any]:
    store, broker = MemoryDeliveries(), routed_broker()
    handler = Handler(
        store, adapter, broker.publish, timeout_seconds=TIMEOUT, policy=POLICY, tracing=tracing
    )
    return handler, store, broker, SettleLog(store, broker)


async def handle(
    handler: Handler, sink: SettleLog, m: WorkerMessage, headers: dict[str, Any] | None
) -> Settle:
    incoming = Incoming(encode_message(m), str(m.delivery_id), 1, False, sink, headers=headers)
    await handler.handle(incoming)
    return sink.settled[-1][1]


async def test_each_attempt_is_a_span_under_the_messages_context() -> None:
    adapter = SeesContext(RetriableError("HTTP 503", status_code=503), Receipt(status_code=200))
    tracing = RecordingTracing()
    handler, store, broker, sink = rig(adapter, tracing)
    first = message(1)
    store.add(first.delivery_id)
    assert await handle(handler, sink, first, {"traceparent": PUBLISH}) is Settle.ACK
    (copy,) = broker.published
    assert copy.headers == {"traceparent": PUBLISH}  # the next attempt: a sibling
    second = message(1, attempt=2)
    assert await handle(handler, sink, second, dict(copy.headers)) is Settle.ACK
    spans = tracing.spans
    assert [(s.name, s.kind, s.parent, s.ended) for s in spans] == [
        ("notifier.attempt", Kind.CLIENT, PUBLISH, 1),
    ] * 2
    assert [s.attributes for s in spans] == [
        {"notifier.channel_type": "webhook",
         "notifier.destination_origin": f"channel:{first.channel_id}",
         "notifier.attempt": n, "notifier.delivery_id": str(first.delivery_id),
         "notifier.outcome": outcome, "http.response.status_code": code}
        for n, outcome, code in ((1, "retry", 503), (2, "delivered", 200))
    ]  # fmt: skip
    assert adapter.contexts == [s.traceparent for s in spans]
    assert [(r.trace_id, r.span_id) for r in store.attempts] == [(TRACE, s.span_id) for s in spans]


async def test_a_message_without_context_starts_a_trace_with_tracing_on() -> None:
    adapter, tracing = SeesContext(), RecordingTracing()
    handler, store, _, sink = rig(adapter, tracing)
    m = message(1)
    store.add(m.delivery_id)
    await handle(handler, sink, m, {"traceparent": "not a traceparent"})
    (span,) = tracing.spans
    assert span.parent is None
    assert store.attempts[0].trace_id == TRACE_OF_NEW


async def test_with_tracing_off_the_context_is_passed_on_unchanged() -> None:
    adapter = SeesContext(*[RetriableError("HTTP 503", status_code=503)] * 2)
    handler, store, broker, sink = rig(adapter, NO_TRACING)
    m = message(1)
    store.add(m.delivery_id)
    await handle(handler, sink, m, {"traceparent": PUBLISH.encode()})
    assert adapter.contexts == [PUBLISH]
    assert [(r.trace_id, r.span_id) for r in store.attempts] == [(TRACE, None)]
    assert broker.published[0].headers == {"traceparent": PUBLISH}  # as a str
    untraced = message(2)
    store.add(untraced.delivery_id)
    await handle(handler, sink, untraced, None)
    assert adapter.contexts[-1] is None
    assert store.attempts[-1].trace_id is None
    assert broker.published[-1].headers is None
