"""Sentry through the real sentry-sdk, with a transport that keeps envelopes instead of sending
them: a dead delivery reports one event carrying its ids, and no secret leaves the process; with
failure alerts, that event carries the delivery's context and a payload excerpt scrubbed of
secrets."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import sentry_sdk
import trio
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from notifier.alerts import Alerts
from notifier.broker.base import Incoming, Settle
from notifier.config import AlertsConfig, SentryConfig
from notifier.errors import PermanentError
from notifier.messages import WorkerMessage, encode_message
from notifier.observability import SentryReporter, setup_sentry
from notifier.testing import (
    MemoryBroker,
    MemoryDeliveries,
    RecordingAdapter,
    SettleRecorder,
    worker_message,
)
from notifier.worker.decide import RetryPolicy
from notifier.worker.group import outcome_observers
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


async def handle_failing(step: Exception) -> tuple[WorkerMessage, list[Settle]]:
    """Handle one message (its config holds a secret, its payload a marker) with an adapter
    raising ``step``, reporting through the real Sentry SDK; return it and its settlement."""
    message = worker_message(
        channel_config={"url": "https://example.com/hook", "secret": SECRET},
        payload={"note": PAYLOAD_MARKER},
    )
    store = MemoryDeliveries()
    store.add(message.delivery_id)
    handler = Handler(
        store, RecordingAdapter("webhook", step), MemoryBroker().publish, timeout_seconds=5,
        policy=RetryPolicy(),
        observer=outcome_observers("webhook", reporter=SentryReporter(), metrics=None),
    )  # fmt: skip
    sink = SettleRecorder()
    await handler.handle(
        Incoming(encode_message(message), str(message.delivery_id), 1, False, sink)
    )
    sentry_sdk.flush()
    return message, sink.settled


async def test_a_dead_delivery_is_one_event_with_its_ids_and_no_secrets(
    transport: KeepingTransport,
) -> None:
    message, settled = await handle_failing(PermanentError("HTTP 404: gone", status_code=404))

    assert settled == [Settle.REJECT]
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
    _, settled = await handle_failing(ZeroDivisionError("adapter bug"))

    assert settled == [Settle.REJECT]
    (envelope,) = transport.envelopes  # one event: the log line is a breadcrumb, not another
    event = envelope.get_event()
    assert event is not None
    (exc,) = event["exception"]["values"]
    assert exc["type"] == "ZeroDivisionError"
    assert event["tags"]["outcome"] == "panic"
    frames = exc["stacktrace"]["frames"]
    assert frames
    assert not any(frame.get("vars") for frame in frames)
    raw = envelope.serialize().decode()
    assert SECRET not in raw
    assert PAYLOAD_MARKER not in raw


async def test_http_requests_leave_no_breadcrumb_with_their_url(
    transport: KeepingTransport,
) -> None:
    # A Bot API URL holds the bot token; httpx's Sentry integration would record it.
    secret_url = "http://bot-api.invalid/bot123456:SECRET-TOKEN/sendMessage"
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(200))
    ) as client:
        await client.post(secret_url)
    sentry_sdk.capture_message("after the request")
    sentry_sdk.flush()

    (envelope,) = transport.envelopes
    assert "SECRET-TOKEN" not in envelope.serialize().decode()


async def test_a_dead_deliverys_alert_carries_its_context_with_the_payload_scrubbed(
    transport: KeepingTransport,
) -> None:
    # The same handler as above, with failure alerts: the Sentry event of the dead delivery is
    # the alert's, built from the store's attempt rows, with tags and a dead_delivery context.
    message = worker_message(
        channel_config={"url": "https://user:pw@example.com/hook/PATHTOKEN?k=1", "secret": SECRET},
        payload={"note": PAYLOAD_MARKER, "password": "hunter2-must-not-leave"},
    )
    store = MemoryDeliveries()
    store.add(message.delivery_id)
    store.channel_names[message.channel_id] = "orders hook"
    alerts = Alerts(AlertsConfig(), store, reporter=SentryReporter())
    handler = Handler(
        store, RecordingAdapter("webhook", PermanentError("HTTP 404: gone", status_code=404)),
        MemoryBroker().publish, timeout_seconds=5, policy=RetryPolicy(),
        observer=outcome_observers(
            "webhook", reporter=SentryReporter(), metrics=None, alerts=alerts
        ),
    )  # fmt: skip
    sink = SettleRecorder()
    async with trio.open_nursery() as nursery:
        await nursery.start(alerts.run)
        await handler.handle(
            Incoming(encode_message(message), str(message.delivery_id), 1, False, sink)
        )
        await alerts.drain(10)
    sentry_sdk.flush()

    assert sink.settled == [Settle.REJECT]  # the alert changed nothing of the settlement
    (envelope,) = transport.envelopes  # one event: the alert's, not a second bare one
    event = envelope.get_event()
    assert event is not None
    tags = event["tags"]
    assert (tags["event_type"], tags["channel_type"]) == ("order.created", "webhook")
    assert tags["destination"] == "https://example.com:443"
    assert tags["delivery_id"] == str(message.delivery_id)
    context = event["contexts"]["dead_delivery"]
    assert context["channel_name"] == "orders hook"
    assert context["delivery_id"] == str(message.delivery_id)
    assert [(a["attempt"], a["outcome"], a["status_code"]) for a in context["attempts"]] == [
        (1, "dead", 404)
    ]
    assert PAYLOAD_MARKER in context["payload_excerpt"]  # the excerpt travels ...
    raw = envelope.serialize().decode()
    for secret in (SECRET, "hunter2-must-not-leave", "PATHTOKEN", "user:pw"):
        assert secret not in raw  # ... its secrets do not
