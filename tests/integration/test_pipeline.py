"""End to end on the real Postgres and RabbitMQ: HTTP in, webhook out."""

from __future__ import annotations

import standardwebhooks
import trio

from notifier.config import Config
from notifier.testing import open_sink
from tests.integration.conftest import (
    count_rows,
    create_tenant,
    poll,
    queue_depths,
    run_notifier,
    scalar,
)


async def wait_until_delivered(url: str, count: int) -> None:
    async def done() -> bool:
        delivered = await scalar(url, "SELECT count(*) FROM deliveries WHERE status = 'DELIVERED'")
        return bool(delivered >= count)

    await poll(done)


async def test_event_posted_over_http_is_delivered_to_the_webhook(
    config: Config, database_url: str, vhost: str
) -> None:
    key = await create_tenant(database_url)
    async with open_sink() as sink, run_notifier(config) as running, running.client(key) as api:
        ch = await api.post(
            "/v1/channels",
            json={"type": "webhook", "config": {"url": sink.url}, "event_types": ["order.*"]},
        )
        assert ch.status_code == 201, ch.text
        resp = await api.post("/v1/events", json={"type": "order.created", "payload": {"n": 1}})
        assert resp.status_code == 202, resp.text
        event = resp.json()
        assert len(event["deliveries"]) == 1
        delivery_id = event["deliveries"][0]["id"]
        with trio.fail_after(20):
            (got,) = await sink.wait_for(1)
            await wait_until_delivered(database_url, 1)
        assert got.headers["webhook-id"] == delivery_id
        secret = ch.json()["config"]["secret"]  # generated, shown once
        assert standardwebhooks.Webhook(secret).verify(got.body, got.headers) == got.json()
        assert got.json() == {
            "type": "order.created",
            "timestamp": event["created_at"],
            "data": {"n": 1},
        }
        detail = (await api.get(f"/v1/deliveries/{delivery_id}")).json()
        assert detail["status"] == "DELIVERED"
        assert detail["attempt"] == 1
        assert [a["outcome"] for a in detail["attempts"]] == ["delivered"]
        assert detail["attempts"][0]["status_code"] == 200
    counts = await count_rows(database_url)
    assert counts["outbox"] == 0
    depths = await trio.to_thread.run_sync(queue_depths, vhost)
    assert depths, "the topology was declared"
    assert all(n == 0 for n in depths.values()), depths
