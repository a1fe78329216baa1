"""Failure alerts for real (README "Failure alerts"): the whole service on the real Postgres and
RabbitMQ sends one signed alert to an operator webhook (a local trio HTTP server) when a
delivery goes DEAD, with its context and a scrubbed payload excerpt, and reports the same
context through the Sentry reporter's interface; the store reads a delivery's attempts from the
partition of an earlier day, in one bounded statement."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import standardwebhooks
import trio

from notifier.adapters.webhook import generate_secret
from notifier.alerts import SENTRY_CONTEXT
from notifier.config import parse_config
from notifier.store import open_store
from notifier.testing import Received, RecordingReporter, open_sink
from tests.integration.conftest import (
    create_tenant,
    poll,
    run_notifier,
    sql,
    verify_all,
    wait_status,
)

pytestmark = pytest.mark.integration

CHANNEL_SECRET = generate_secret()
ALERT_SECRET = generate_secret()
SECRET_ENV = "NOTIFIER_TEST_ALERTS_SECRET"


def unavailable(_: Received) -> tuple[int, dict[str, str], bytes]:
    return 503, {}, b"down for maintenance"


async def test_a_delivery_going_dead_sends_one_signed_alert_with_its_context(
    database_url: str, broker_url: str
) -> None:
    reporter = RecordingReporter()
    key = await create_tenant(database_url)
    async with open_sink(unavailable) as receiver, open_sink() as operator:
        env = {SECRET_ENV: ALERT_SECRET}
        config = parse_config(
            {
                "service": {"shutdown_grace_seconds": 5},
                "database": {"url": database_url, "pool_max_size": 10},
                "broker": {"url": broker_url},
                "ingest": {"bind": "127.0.0.1:0"},
                "relay": {"poll_interval_seconds": 0.5},
                "retry": {"base_seconds": 1, "max_seconds": 30, "tiers_seconds": [1, 2, 5, 30]},
                "workers": {
                    "webhook": {
                        "concurrency": 2, "prefetch": 4, "max_attempts": 2,
                        "allow_private_networks": True,
                    }
                },
                "alerts": {
                    "dead_webhook_url": f"{operator.url}?token=OPERATOR-TOKEN",
                    "dead_webhook_secret_env": SECRET_ENV,
                },
            },
            env=env,
        )  # fmt: skip
        # The channel's URL has a path and a query that must not travel in the alert.
        channel_url = f"http://127.0.0.1:{receiver.port}/hooks/PATH-SECRET?sig=QUERY-SECRET"
        async with (
            run_notifier(config, reporter=reporter, environ=env) as running,
            running.client(key) as api,
        ):
            resp = await api.post("/v1/channels", json={
                "type": "webhook", "name": "orders to billing", "event_types": ["*"],
                "config": {"url": channel_url, "secret": CHANNEL_SECRET},
            })  # fmt: skip
            assert resp.status_code == 201, resp.text
            payload = {"order": 42, "card": {"token": "tok_live_SECRET", "last4": "4242"}}
            resp = await api.post("/v1/events", json={"type": "order.failed", "payload": payload})
            assert resp.status_code == 202, resp.text
            (dead,) = resp.json()["deliveries"]
            with trio.fail_after(30):
                await wait_status(database_url, dead["id"], "DEAD")
                (alert,) = await operator.wait_for(1)
            metrics = (await api.get("/metrics")).text
        assert len(operator.received) == 1  # one alert, also after the drain at stop
        verify_all(receiver.received, CHANNEL_SECRET)

    envelope = standardwebhooks.Webhook(ALERT_SECRET).verify(alert.body, alert.headers)
    assert alert.headers["webhook-id"] == f"dead_{dead['id']}_2"
    assert envelope["type"] == "delivery.dead"
    data: dict[str, Any] = envelope["data"]
    assert data["delivery_id"] == dead["id"]
    assert data["event_type"] == "order.failed"
    assert (data["channel_id"], data["channel_name"]) == (dead["channel_id"], "orders to billing")
    assert data["channel_type"] == "webhook"
    assert data["destination"] == f"http://127.0.0.1:{receiver.port}"
    assert (data["attempt"], data["max_attempts"], data["outcome"]) == (2, 2, "dead")
    history = [(a["attempt"], a["outcome"], a["status_code"]) for a in data["attempts"]]
    assert history == [(2, "dead", 503), (1, "retry", 503)]
    assert all(a["error_class"] == "HTTP 503" for a in data["attempts"])
    assert json.loads(data["payload_excerpt"]) == {
        "order": 42, "card": {"token": "[scrubbed]", "last4": "4242"},
    }  # fmt: skip
    body = alert.body.decode()
    for secret in ("tok_live_SECRET", "PATH-SECRET", "QUERY-SECRET", CHANNEL_SECRET, "OPERATOR"):
        assert secret not in body
    assert alert.path == "/hook?token=OPERATOR-TOKEN"

    # The same context through the Sentry reporter's interface, with the tags to filter by.
    (report,) = reporter.reports
    assert report.tags["event_type"] == "order.failed"
    assert report.tags["destination"] == data["destination"]
    assert report.contexts == {SENTRY_CONTEXT: data}

    assert 'notifier_alerts_sent_total{sink="webhook"} 1.0' in metrics
    assert 'notifier_alerts_sent_total{sink="sentry"} 1.0' in metrics
    assert 'notifier_alerts_dropped_total{reason="failed"} 0.0' in metrics


async def test_the_attempts_of_a_delivery_created_days_ago_are_read_newest_first(
    database_url: str,
) -> None:
    # The attempts live in the partition of the day their delivery was created, however much
    # later they were made.
    created = datetime.now(UTC).replace(microsecond=0) - timedelta(days=3)
    tenant, channel, event, delivery = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await sql(database_url, "SELECT notifier_partitions_ensure($1::date, $1::date)", created.date())
    await sql(
        database_url, "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, $2, 'x')",
        tenant, f"t-{tenant.hex[:8]}",
    )  # fmt: skip
    await sql(
        database_url,
        "INSERT INTO channels (id, tenant_id, type, name, config) VALUES ($1, $2, 'webhook',"
        " 'old hook', '{}')",
        channel, tenant,
    )  # fmt: skip
    await sql(
        database_url,
        "INSERT INTO deliveries (id, event_id, channel_id, tenant_id, channel_type, status,"
        " attempt, max_attempts, created_at) VALUES ($1, $2, $3, $4, 'webhook', 'DEAD', 4, 4, $5)",
        delivery, event, channel, tenant, created,
    )  # fmt: skip
    for attempt in range(1, 5):
        await sql(
            database_url,
            "INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms,"
            " outcome, status_code, error, delivery_created_at)"
            " VALUES ($1, $2, now() - ($3 || ' hours')::interval, 7, $4, 500, 'HTTP 500: x', $5)",
            delivery, attempt, str(10 - attempt), "dead" if attempt == 4 else "retry", created,
        )  # fmt: skip

    async with open_store(database_url) as store:
        found = await store.dead_history(delivery, created, channel, 2)
        assert found.channel_name == "old hook"
        assert [(a.attempt, a.outcome) for a in found.attempts] == [(4, "dead"), (3, "retry")]
        # A wrong day (the message's clock said otherwise) is looked for in every partition.
        wrong_day = await store.dead_history(delivery, datetime.now(UTC), channel, 10)
        assert [a.attempt for a in wrong_day.attempts] == [4, 3, 2, 1]
        # A deleted channel has no name; a delivery without attempts, no history.
        gone = await store.dead_history(uuid.uuid4(), created, uuid.uuid4(), 5)
        assert (gone.channel_name, gone.attempts) == (None, ())


async def test_an_unreachable_operator_webhook_costs_only_the_alert(
    database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    with trio.socket.socket() as closed:  # a port with nothing listening
        await closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    async with open_sink(unavailable) as receiver:
        config = parse_config(
            {
                "database": {"url": database_url},
                "broker": {"url": broker_url},
                "ingest": {"bind": "127.0.0.1:0"},
                "relay": {"poll_interval_seconds": 0.5},
                "workers": {"webhook": {"max_attempts": 1, "allow_private_networks": True}},
                "alerts": {
                    "dead_webhook_url": f"http://127.0.0.1:{port}/alerts", "max_tries": 2,
                    "retry_backoff_seconds": 0.1, "timeout_seconds": 1,
                },
            },
            env={},
        )  # fmt: skip
        async with run_notifier(config, environ={}) as running, running.client(key) as api:
            resp = await api.post("/v1/channels", json={
                "type": "webhook", "event_types": ["*"], "config": {"url": receiver.url},
            })  # fmt: skip
            assert resp.status_code == 201, resp.text
            ids = []
            for n in range(3):
                resp = await api.post("/v1/events", json={"type": "t", "payload": {"n": n}})
                ids.append(resp.json()["deliveries"][0]["id"])
            with trio.fail_after(30):
                for delivery_id in ids:
                    await wait_status(database_url, delivery_id, "DEAD")

                async def dropped() -> bool:
                    text = (await api.get("/metrics")).text
                    return 'notifier_alerts_dropped_total{reason="failed"} 3.0' in text

                await poll(dropped, interval_seconds=0.1)
            # The deliveries were settled as usual: each DEAD once, in the DLQ, nothing pending.
            rows = await sql(
                database_url, "SELECT status, attempt FROM deliveries WHERE id = ANY($1::uuid[])",
                [uuid.UUID(i) for i in ids],
            )  # fmt: skip
            assert sorted((r["status"], r["attempt"]) for r in rows) == [("DEAD", 1)] * 3
