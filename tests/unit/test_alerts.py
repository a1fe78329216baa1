"""Failure alerts with fakes passed through their interfaces: the context of a dead delivery
(destination origin, latest attempts, scrubbed payload excerpt), the drop-oldest buffer, the
tries of the operator webhook on a mock clock, its Standard Webhooks signature (checked with the
``standardwebhooks`` package), the ``[alerts]`` config, and the background task end to end with
an ``httpx.MockTransport`` receiver and a recording reporter."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import msgspec
import pytest
import standardwebhooks
import trio
import trio.testing

from notifier.adapters.webhook import generate_secret
from notifier.alerts import (
    SCRUBBED,
    SENTRY_CONTEXT,
    AlertContext,
    AlertNotSent,
    Alerts,
    AttemptRow,
    DeadHistory,
    DropOldest,
    WebhookAlertSink,
    alert_id,
    alert_request,
    build_context,
    destination_origin,
    is_secret_key,
    payload_excerpt,
    scrub,
    send_with_tries,
)
from notifier.config import AlertsConfig, ConfigError, parse_config
from notifier.metrics import Metrics
from notifier.testing import RecordingReporter, worker_message
from notifier.worker.group import outcome_observers
from notifier.worker.observe import Outcome

T0 = datetime(2024, 1, 1, 12, tzinfo=UTC)
SECRET = generate_secret()
CHANNEL = uuid.UUID(int=8)
SECRET_URL = "https://user:pw@hooks.example.com/t/SECRETPATH?key=k"


def dead_outcome(n: int = 1, *, payload: dict[str, Any] | None = None, **changes: Any) -> Outcome:
    message = worker_message(
        n, attempt=3, max_attempts=3, payload=payload or {"order": n},
        channel_config={"url": SECRET_URL, "secret": SECRET},
    )  # fmt: skip
    fields: dict[str, Any] = {
        "channel_type": "webhook", "message_id": str(message.delivery_id), "message": message,
        "outcome": "dead", "finished_at": T0, "status": "DEAD", "recorded": True,
        "duration_ms": 12, "error": "HTTP 503: unavailable",
    }  # fmt: skip
    fields.update(changes)
    return Outcome(**fields)


def history(n: int = 3) -> DeadHistory:
    rows = tuple(
        AttemptRow(
            attempt=i,
            started_at=T0 - timedelta(minutes=10 * (n - i)),
            outcome="dead" if i == n else "retry",
            status_code=503,
            duration_ms=10 + i,
            error="HTTP 503: unavailable",
        )
        for i in range(n, 0, -1)
    )
    return DeadHistory(channel_name="billing hook", attempts=rows)


# -- context ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("password", True),
        ("Password", True),
        ("client_secret", True),
        ("accessToken", True),  # camelCase words
        ("X-Api-Key", True),
        ("api_key", True),  # two words joined
        ("apiKey", True),
        ("Authorization", True),
        ("set-cookie", True),
        ("private_key", True),
        ("session_id", True),
        ("AWS_ACCESS_KEY", True),
        ("pin", True),
        ("tokens", True),  # plurals
        ("passwords", True),
        ("apiKeys", True),
        ("refresh_tokens", True),
        ("privateKeys", True),
        ("client_key", True),
        ("signing-key", True),
        ("jwt", True),
        ("bearer", True),
        ("cookies", True),
        ("author", False),  # contains "auth", is not it
        ("tokenizer", False),
        ("secretary", False),
        ("spinner", False),
        ("order_id", False),
        ("amount", False),
        ("keyboard", False),
        ("keys", False),  # a plain "key" is too common to scrub (README, Failure alerts)
        ("pins_count", True),  # a word of the name is a secret word's plural
        ("options", False),
    ],
)
def test_secret_looking_keys_are_told_from_ordinary_ones(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_scrubbing_replaces_secret_values_at_any_depth_and_keeps_the_rest() -> None:
    payload = {
        "order": {"id": 7, "card": {"pin": "1234", "last4": "4242"}},
        "users": [{"name": "ann", "password": "hunter2"}, {"name": "bob", "token": {"a": 1}}],
        "note": "call me with Bearer abcdefghijklmnop0123456789",
        "api_key": ["k1", "k2"],
    }
    assert scrub(payload) == {
        "order": {"id": 7, "card": {"pin": SCRUBBED, "last4": "4242"}},
        "users": [{"name": "ann", "password": SCRUBBED}, {"name": "bob", "token": SCRUBBED}],
        "note": "call me with Bearer [redacted]",
        "api_key": SCRUBBED,
    }


def test_a_payload_excerpt_is_compact_json_cut_to_its_bytes() -> None:
    assert payload_excerpt({"a": 1, "secret": "x"}, 100) == ('{"a":1,"secret":"[scrubbed]"}', False)
    text, cut = payload_excerpt({"text": "é" * 50}, 12)
    assert cut
    assert len(text.encode()) <= 12
    assert text.startswith('{"text":"é')  # whole characters
    assert payload_excerpt({"a": 1}, 0) == ("", True)


@pytest.mark.parametrize(
    ("channel_type", "config", "origin"),
    [
        ("webhook", {"url": "https://u:p@Hooks.Example.com/x/TOKEN?sig=1#f"}, "https://hooks.example.com:443"),
        ("webhook", {"url": "http://10.0.0.5:8080/hook"}, "http://10.0.0.5:8080"),
        ("webhook", {"url": "http://[::1]/hook"}, "http://[::1]:80"),
        ("webhook", {"url": "ftp://x/y"}, "(invalid url)"),
        ("webhook", {}, "(no url)"),
        ("email", {"to": ["a@Example.com", "b@example.com", "c@other.org"]},
         "email:@example.com,@other.org"),
        ("email", {"to": "ops@example.com"}, "email:@example.com"),
        ("telegram", {"chat_id": "@news"}, "telegram:@news"),
        ("telegram", {"chat_id": -1001234567890}, "telegram:chat …7890"),
        ("sms", {"number": "+15551234"}, f"sms:channel:{CHANNEL}"),
    ],
)  # fmt: skip
def test_the_destination_is_an_origin_without_secrets(
    channel_type: str, config: dict[str, Any], origin: str
) -> None:
    assert destination_origin(channel_type, config, CHANNEL) == origin


def test_the_context_holds_the_delivery_its_latest_attempts_and_a_scrubbed_excerpt() -> None:
    outcome = dead_outcome(payload={"order": 1, "customer": {"password": "hunter2"}})
    context = build_context(outcome, history(5), history_attempts=3, payload_excerpt_bytes=1024)

    message = outcome.message
    assert message is not None
    assert (context.delivery_id, context.event_id, context.tenant_id) == (
        message.delivery_id, message.event_id, message.tenant_id,
    )  # fmt: skip
    assert (context.event_type, context.channel_type, context.channel_name) == (
        "order.created", "webhook", "billing hook",
    )  # fmt: skip
    assert context.destination == "https://hooks.example.com:443"
    assert (context.attempt, context.max_attempts, context.outcome) == (3, 3, "dead")
    assert [a.attempt for a in context.attempts] == [5, 4, 3]  # the latest three, newest first
    assert context.attempts[0].error_class == "HTTP 503"
    assert context.attempts[0].duration_ms == 15
    assert context.payload_excerpt == '{"order":1,"customer":{"password":"[scrubbed]"}}'
    raw = json.dumps(context.as_json())
    for secret in (SECRET, "hunter2", "SECRETPATH", "user:pw", "key=k"):
        assert secret not in raw


def test_long_errors_are_cut_and_scrubbed() -> None:
    long = "HTTP 500: " + "x" * 1000 + " Authorization: Bearer abcdefghijklmnopqrstu"
    rows = (AttemptRow(attempt=1, started_at=T0, outcome="dead", status_code=500, error=long),)
    context = build_context(
        dead_outcome(error=long), DeadHistory(attempts=rows), history_attempts=5,
        payload_excerpt_bytes=10,
    )  # fmt: skip
    error = context.attempts[0].error
    assert error is not None
    assert len(error) == 300
    assert error.endswith("…")
    assert context.error is not None
    assert len(context.error) == 300


# -- buffer -------------------------------------------------------------------------------------


async def test_a_full_buffer_drops_its_oldest_item_without_waiting() -> None:
    dropped: list[int] = []
    buffer = DropOldest[int](3, dropped.append)
    for i in range(5):
        buffer.put_nowait(i)
    assert dropped == [0, 1]
    assert [await buffer.get() for _ in range(3)] == [2, 3, 4]
    buffer.close()
    with pytest.raises(trio.EndOfChannel):
        await buffer.get()


async def test_a_reader_waits_for_the_next_item() -> None:
    buffer = DropOldest[str](2)
    got: list[str] = []

    async def read() -> None:
        got.append(await buffer.get())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        buffer.put_nowait("a")
    assert got == ["a"]


# -- tries and signing --------------------------------------------------------------------------


async def test_tries_back_off_doubling_until_one_succeeds(
    mock_clock: trio.testing.MockClock,
) -> None:
    tried_at: list[float] = []

    async def send() -> None:
        tried_at.append(trio.current_time())
        if len(tried_at) < 3:
            raise AlertNotSent("HTTP 503")

    sent, failure = await send_with_tries(send, max_tries=4, backoff_seconds=2.0)
    assert (sent, failure) == (True, None)
    assert tried_at == [0.0, 2.0, 6.0]


async def test_tries_end_at_max_tries_or_at_a_refusal(mock_clock: trio.testing.MockClock) -> None:
    calls = 0

    async def unavailable() -> None:
        nonlocal calls
        calls += 1
        raise AlertNotSent("HTTP 503")

    assert await send_with_tries(unavailable, max_tries=3, backoff_seconds=1.0) == (
        False, "HTTP 503",
    )  # fmt: skip
    assert calls == 3
    assert trio.current_time() == 3.0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise AlertNotSent("HTTP 404", retriable=False)

    calls = 0
    assert await send_with_tries(refused, max_tries=3, backoff_seconds=1.0) == (False, "HTTP 404")
    assert calls == 1


def test_an_alert_is_signed_as_standard_webhooks_define_it() -> None:
    context = build_context(dead_outcome(), history(), history_attempts=5, payload_excerpt_bytes=64)
    now = int(datetime.now(UTC).timestamp())
    headers, body = alert_request(context, SECRET, now)

    envelope = standardwebhooks.Webhook(SECRET).verify(body, headers)
    assert envelope["type"] == "delivery.dead"
    assert envelope["data"]["delivery_id"] == str(context.delivery_id)
    assert headers["webhook-id"] == alert_id(context) == f"dead_{context.delivery_id}_3"
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(generate_secret()).verify(body, headers)
    unsigned, _ = alert_request(context, None, now)
    assert "webhook-signature" not in unsigned


# -- config -------------------------------------------------------------------------------------


def test_alerts_are_off_by_default_and_keep_sensible_bounds() -> None:
    alerts = parse_config({}, env={}).alerts
    assert alerts == AlertsConfig()
    assert alerts.dead_webhook_url == ""
    assert (alerts.max_tries, alerts.buffer_size, alerts.history_attempts) == (3, 1000, 5)
    assert (alerts.timeout_seconds, alerts.payload_excerpt_bytes) == (5.0, 1024)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"dead_webhook_url": "ftp://ops.example.com/"}, "alerts.dead_webhook_url: must be an"),
        ({"dead_webhook_url": "https://"}, "alerts.dead_webhook_url: no host name"),
        ({"dead_webhook_url": "https://a:b@ops.example.com/"}, "alerts.dead_webhook_url: must not"),
        ({"dead_webhook_url": "https://ops.example.com:99999/"}, "alerts.dead_webhook_url: not a"),
        ({"dead_webhook_secret_env": "X"}, "alerts.dead_webhook_secret_env: set without"),
        ({"max_tries": 0}, "alerts.max_tries"),
        ({"buffer_size": 0}, "alerts.buffer_size"),
        ({"history_attempts": 101}, "alerts.history_attempts"),
        ({"payload_excerpt_bytes": -1}, "alerts.payload_excerpt_bytes"),
        ({"timeout_seconds": 0}, "alerts.timeout_seconds"),
        ({"retry_backoff_seconds": 0}, "alerts.retry_backoff_seconds"),
        ({"dead_webhook": "https://x/"}, "alerts.dead_webhook: unknown key"),
    ],
)  # fmt: skip
def test_bad_alert_settings_are_refused_naming_the_key(
    values: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError, match="^" + problem.replace("(", r"\(")) as info:
        parse_config({"alerts": values}, env={})
    assert "a:b@" not in str(info.value)


def test_the_webhook_url_can_come_from_the_environment() -> None:
    env = {"NOTIFIER_ALERTS_DEAD_WEBHOOK_URL": "https://ops.example.com/alerts"}
    assert parse_config({}, env=env).alerts.dead_webhook_url == "https://ops.example.com/alerts"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "is not set or empty"),
        ("", "is not set or empty"),
        ("plain-password", "must hold a Standard Webhooks secret"),
        ("whsec_!!!notbase64", "must hold a Standard Webhooks secret"),
        ("whsec_c2hvcnQ=", "must hold a Standard Webhooks secret"),  # 5 bytes
    ],
)
def test_the_signing_secret_must_be_there_and_well_formed(value: str | None, problem: str) -> None:
    data = {
        "alerts": {
            "dead_webhook_url": "https://ops.example.com/",
            "dead_webhook_secret_env": "ALERT_KEY",
        }
    }
    env = {} if value is None else {"ALERT_KEY": value}
    with pytest.raises(ConfigError) as info:
        parse_config(data, env=env)
    assert str(info.value).startswith(
        "alerts.dead_webhook_secret_env: the environment variable ALERT_KEY"
    )
    assert problem in str(info.value)
    if value:
        assert value not in str(info.value)
    assert (
        parse_config(data, env={"ALERT_KEY": SECRET}).alerts.dead_webhook_secret_env == "ALERT_KEY"
    )


# -- the background task ------------------------------------------------------------------------


class FakeHistory:
    """The store's ``dead_history`` in memory; ``fail`` makes it raise."""

    def __init__(self, found: DeadHistory, *, fail: bool = False) -> None:
        self.found = found
        self.fail = fail
        self.asked: list[tuple[uuid.UUID, datetime, uuid.UUID, int]] = []

    async def dead_history(
        self, delivery_id: uuid.UUID, created_at: datetime, channel_id: uuid.UUID, limit: int
    ) -> DeadHistory:
        await trio.lowlevel.checkpoint()
        self.asked.append((delivery_id, created_at, channel_id, limit))
        if self.fail:
            raise OSError("store down")
        return self.found


class Receiver:
    """An ``httpx.MockTransport`` handler answering each POST with the next status."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.statuses.pop(0) if self.statuses else 200)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def run_alerts(alerts: Alerts, *outcomes: Outcome) -> None:
    """Tell the alerts' observer of each outcome, wait until each is sent or dropped, then stop
    the task."""
    async with trio.open_nursery() as nursery:
        await nursery.start(alerts.run)
        observers = outcome_observers("webhook", reporter=None, metrics=None, alerts=alerts)
        for outcome in outcomes:
            observers.observe(outcome)
        await alerts.wait_idle()
        await alerts.drain(3600)


def sink_for(receiver: Receiver, settings: AlertsConfig) -> WebhookAlertSink:
    return WebhookAlertSink(
        "https://ops.example.com/alerts?token=OPS", SECRET,
        timeout_seconds=settings.timeout_seconds, transport=httpx.MockTransport(receiver),
    )  # fmt: skip


async def test_a_dead_delivery_is_reported_and_sent_once_with_its_context(
    mock_clock: trio.testing.MockClock,
) -> None:
    settings = AlertsConfig(history_attempts=2, retry_backoff_seconds=1.0)
    receiver, reporter, metrics = Receiver(503, 200), RecordingReporter(), Metrics(environ={})
    store = FakeHistory(history(4))
    alerts = Alerts(
        settings, store, reporter=reporter, sink=sink_for(receiver, settings), metrics=metrics
    )
    outcome = dead_outcome(payload={"order": 9, "token": "tok-123"})
    retried = dead_outcome(2, status="RETRYING", outcome="retry")  # not dead: no alert
    await run_alerts(alerts, outcome, retried)

    message = outcome.message
    assert message is not None
    assert store.asked == [(message.delivery_id, message.created_at, message.channel_id, 2)]
    (report,) = reporter.reports
    assert report.summary == "delivery dead: HTTP 503: unavailable"
    assert report.tags["event_type"] == "order.created"
    assert report.tags["destination"] == "https://hooks.example.com:443"
    assert report.contexts is not None
    context = report.contexts[SENTRY_CONTEXT]
    assert [a["attempt"] for a in context["attempts"]] == [4, 3]
    assert context["payload_excerpt"] == '{"order":9,"token":"[scrubbed]"}'

    first, second = receiver.requests  # a 503, then the same alert again
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    envelope = standardwebhooks.Webhook(SECRET).verify(second.content, dict(second.headers))
    assert envelope["data"] == context
    assert "tok-123" not in second.content.decode()
    assert sample(metrics, "notifier_alerts_sent_total", sink="webhook") == 1
    assert sample(metrics, "notifier_alerts_sent_total", sink="sentry") == 1
    assert sample(metrics, "notifier_alerts_dropped_total", reason="failed") == 0


async def test_an_alert_whose_history_cannot_be_read_goes_out_without_it(
    mock_clock: trio.testing.MockClock,
) -> None:
    reporter = RecordingReporter()
    alerts = Alerts(AlertsConfig(), FakeHistory(history(), fail=True), reporter=reporter)
    await run_alerts(alerts, dead_outcome())
    (report,) = reporter.reports
    assert report.contexts is not None
    assert report.contexts[SENTRY_CONTEXT]["attempts"] == []
    assert report.contexts[SENTRY_CONTEXT]["channel_name"] is None


async def test_a_broken_sink_costs_the_alert_only(mock_clock: trio.testing.MockClock) -> None:
    settings = AlertsConfig(max_tries=3, retry_backoff_seconds=1.0)
    receiver, metrics = Receiver(500, 500, 500, 404), Metrics(environ={})
    alerts = Alerts(
        settings, FakeHistory(history()), sink=sink_for(receiver, settings), metrics=metrics
    )
    await run_alerts(alerts, dead_outcome(1), dead_outcome(2))
    assert len(receiver.requests) == 4  # three tries of the first, one (refused) of the second
    assert sample(metrics, "notifier_alerts_dropped_total", reason="failed") == 2
    assert sample(metrics, "notifier_alerts_sent_total", sink="webhook") == 0


async def test_a_full_buffer_drops_the_oldest_alerts_and_counts_them() -> None:
    metrics = Metrics(environ={})
    alerts = Alerts(AlertsConfig(buffer_size=2), FakeHistory(history()), metrics=metrics)
    observer = alerts.observer()
    for n in range(5):  # nothing takes them: the task is not running
        observer.observe(dead_outcome(n))
    assert sample(metrics, "notifier_alerts_dropped_total", reason="buffer_full") == 3
    alerts.close()
    observer.observe(dead_outcome(9))
    assert sample(metrics, "notifier_alerts_dropped_total", reason="stopped") == 1


def test_with_alerts_the_sentry_observer_leaves_dead_deliveries_to_them() -> None:
    reporter = RecordingReporter()
    alerts = Alerts(AlertsConfig(), FakeHistory(history()), reporter=reporter)
    observers = outcome_observers("webhook", reporter=reporter, metrics=None, alerts=alerts)
    observers.observe(dead_outcome())
    crashed = dead_outcome(2, status=None, recorded=False, handler_failed=True, outcome="panic")
    observers.observe(crashed)
    # the dead one waits in the alerts' buffer; the crash without a record is reported at once
    assert [r.summary for r in reporter.reports] == ["worker handler failed"]


def test_an_alert_context_is_json_for_both_sinks() -> None:
    context = build_context(dead_outcome(), history(), history_attempts=5, payload_excerpt_bytes=8)
    data = context.as_json()
    assert data["dead_at"] == "2024-01-01T12:00:00Z"
    assert data["payload_truncated"] is True
    assert AlertContext.__struct_fields__ == tuple(data)


@pytest.mark.parametrize(
    "payload",
    [
        {"a": 1, "b": [1, 2.5, None, True, "x"], "c": {"password": {"deep": 1}, "ok": 'é\n"q'}},
        {"nested": [[{"token": "t"}], {"apiKey": "k", "name": "n"}], "n": -3, "f": 1e300},
        {},
    ],
)
def test_the_excerpt_is_the_scrubbed_payloads_json(payload: dict[str, Any]) -> None:
    whole = msgspec.json.encode(scrub(payload)).decode()
    assert payload_excerpt(payload, 10_000) == (whole, False)
    assert json.loads(payload_excerpt(payload, 10_000)[0]) == scrub(payload)
    for limit in range(len(whole.encode())):
        text, cut = payload_excerpt(payload, limit)
        assert cut
        assert whole.startswith(text)


def test_a_huge_payload_costs_about_its_excerpt() -> None:
    # A secret right at the cut is still recognised; what lies far beyond is never looked at.
    head = "x" * 90 + " Bearer abcdefghijklmnopqrstuvwxyz0123456789"
    payload = {"note": head + "y" * 1_000_000, "rest": [{"k": i} for i in range(100_000)]}
    text, cut = payload_excerpt(payload, 120)
    assert cut
    assert "abcdefghij" not in text
    assert text.startswith('{"note":"' + "x" * 90 + " Bearer [redacted]")


async def test_at_a_stop_the_alerts_taken_get_one_try_each(
    mock_clock: trio.testing.MockClock,
) -> None:
    settings = AlertsConfig(max_tries=5, retry_backoff_seconds=10.0)
    receiver, metrics = Receiver(503, 503, 503), Metrics(environ={})
    alerts = Alerts(
        settings, FakeHistory(history()), sink=sink_for(receiver, settings), metrics=metrics
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(alerts.run)
        observer = alerts.observer()
        observer.observe(dead_outcome(1))
        observer.observe(dead_outcome(2))
        await alerts.drain(60)
        observer.observe(dead_outcome(3))  # after the stop began: counted, not sent
    assert len(receiver.requests) == 2
    assert trio.current_time() == 0.0  # no backoff was waited
    assert sample(metrics, "notifier_alerts_dropped_total", reason="failed") == 2
    assert sample(metrics, "notifier_alerts_dropped_total", reason="stopped") == 1
