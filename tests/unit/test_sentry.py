"""Sentry through the real sentry-sdk, with a transport that keeps envelopes instead of sending
them: a dead delivery reports one event carrying its ids, and no secret leaves the process."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from notifier.broker.base import Incoming, Settle
from notifier.config import SentryConfig
from notifier.errors import PermanentError
from notifier.messages import WorkerMessage, encode_message
from notifier.observability import SentryReporter, setup_sentry
from notifier.testing import MemoryBroker, MemoryDeliveries, RecordingAdapter
from notifier.worker.decide import RetryPolicy
from notifier.worker.handle import Handler

SECRET = "whsec_c2VjcmV0LXRoYXQtbXVzdC1uZXZlci1sZWF2ZQ=="
PAYLOAD_MARKER = "payload-that-must-not-leave"


class KeepingTransport(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.envelopes: list[Envelope] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)


@pytest.fixture
def transport() -> Iterator[KeepingTransport]:
    kept = KeepingTransport()
    assert setup_sentry(SentryConfig(dsn="https://key@sentry.invalid/1"), transport=kept)
    yield kept
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)


def test_without_a_dsn_sentry_stays_off() -> None:
    assert setup_sentry(SentryConfig(dsn="")) is False
    assert not sentry_sdk.get_client().is_active()


class Sink:
    def __init__(self) -> None:
        self.settled: list[Settle] = []

    def settle(self, delivery_tag: int, how: Settle) -> None:
        self.settled.append(how)


async def test_a_dead_delivery_is_one_event_with_its_ids_and_no_secrets(
    transport: KeepingTransport,
) -> None:
    message = WorkerMessage(
        delivery_id=uuid.uuid4(), event_id=uuid.uuid4(), tenant_id=uuid.uuid4(),
        channel_id=uuid.uuid4(), channel_type="webhook",
        channel_config={"url": "https://example.com/hook", "secret": SECRET},
        event_type="order.created", recipient=None, payload={"note": PAYLOAD_MARKER},
        created_at=datetime.now(UTC), attempt=1, max_attempts=5,
    )  # fmt: skip
    store = MemoryDeliveries()
    store.add(message.delivery_id)
    adapter = RecordingAdapter("webhook", PermanentError("HTTP 404: gone", status_code=404))
    handler = Handler(
        store, adapter, MemoryBroker().publish, timeout_seconds=5,
        policy=RetryPolicy(), reporter=SentryReporter(),
    )  # fmt: skip
    sink = Sink()
    await handler.handle(
        Incoming(encode_message(message), str(message.delivery_id), 1, False, sink)
    )
    sentry_sdk.flush()

    assert sink.settled == [Settle.REJECT]
    (envelope,) = transport.envelopes
    event = envelope.get_event()
    assert event is not None
    assert event["tags"]["delivery_id"] == str(message.delivery_id)
    assert event["tags"]["channel_type"] == "webhook"
    assert event["tags"]["attempt"] == "1"
    assert "HTTP 404" in event["message"]
    raw = envelope.serialize().decode()
    assert SECRET not in raw
    assert PAYLOAD_MARKER not in raw


async def test_an_adapter_crash_reports_the_exception_without_local_variables(
    transport: KeepingTransport,
) -> None:
    message = WorkerMessage(
        delivery_id=uuid.uuid4(), event_id=uuid.uuid4(), tenant_id=uuid.uuid4(),
        channel_id=uuid.uuid4(), channel_type="webhook",
        channel_config={"url": "https://example.com/hook", "secret": SECRET},
        event_type="order.created", recipient=None, payload={},
        created_at=datetime.now(UTC), attempt=1, max_attempts=5,
    )  # fmt: skip
    store = MemoryDeliveries()
    store.add(message.delivery_id)
    adapter = RecordingAdapter("webhook", ZeroDivisionError("adapter bug"))
    handler = Handler(
        store, adapter, MemoryBroker().publish, timeout_seconds=5,
        policy=RetryPolicy(), reporter=SentryReporter(),
    )  # fmt: skip
    sink = Sink()
    await handler.handle(
        Incoming(encode_message(message), str(message.delivery_id), 1, False, sink)
    )
    sentry_sdk.flush()

    assert sink.settled == [Settle.REJECT]
    (envelope,) = transport.envelopes  # one event: the log line is a breadcrumb, not another
    event = envelope.get_event()
    assert event is not None
    (exc,) = event["exception"]["values"]
    assert exc["type"] == "ZeroDivisionError"
    assert event["tags"]["outcome"] == "panic"
    frames = exc["stacktrace"]["frames"]
    assert frames
    assert not any(frame.get("vars") for frame in frames)
    assert SECRET not in envelope.serialize().decode()
