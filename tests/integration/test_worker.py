"""The worker's per-message rules (docs/architecture.md §4, §5) against the real RabbitMQ and
Postgres: delay-tier retries, the dead-letter queue, rate limits, poison messages and lost
connections."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import aiormq
import httpx
import pytest
import trio

from notifier.adapters.webhook import generate_secret
from notifier.config import Config
from notifier.errors import PermanentError
from notifier.messages import decode_message
from notifier.testing import (
    PacedAdapter,
    Received,
    RecordingAdapter,
    RecordingReporter,
    open_sink,
)
from tests.integration.conftest import create_tenant as create_tenant_key
from tests.integration.conftest import (
    delivery,
    make_config,
    outcomes,
    poll,
    queue_depths,
    rabbitmqctl,
    run_notifier,
    scalar,
    verify_all,
    wait_status,
)

# Every channel signs with this secret, and every webhook a test receives is checked with it.
SECRET = generate_secret()

Responder = Callable[[Received], tuple[int, dict[str, str], bytes]]


def answers(*statuses: int, then: int = 200, headers: dict[str, str] | None = None) -> Responder:
    """A sink responder answering ``statuses`` in turn, then ``then`` for ever."""
    script = iter(statuses)

    def respond(_: Received) -> tuple[int, dict[str, str], bytes]:
        return next(script, then), dict(headers or {}), b"answer"

    return respond


def fast_retries(database_url: str, broker_url: str, **overrides: Any) -> Config:
    retry = {"base_seconds": 1, "max_seconds": 30, "tiers_seconds": [1, 2, 5, 30]}
    retry.update(overrides.pop("retry", {}))
    return make_config(database_url, broker_url, retry=retry, **overrides)


async def create_channel(api: httpx.AsyncClient, url: str, **fields: Any) -> str:
    config = {"url": url, "secret": SECRET}
    body = {"type": "webhook", "config": config, "event_types": ["*"], **fields}
    resp = await api.post("/v1/channels", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


async def post_event(api: httpx.AsyncClient, **fields: Any) -> list[str]:
    """POST one event; return its delivery ids."""
    body = {"type": "order.created", "payload": {"n": 1}, **fields}
    resp = await api.post("/v1/events", json=body)
    assert resp.status_code == 202, resp.text
    return [d["id"] for d in resp.json()["deliveries"]]


async def wait_depth(vhost: str, queue: str, depth: int) -> None:
    async def reached() -> bool:
        return (await trio.to_thread.run_sync(queue_depths, vhost)).get(queue) == depth

    await poll(reached, interval_seconds=0.3)


async def publish_raw(broker_url: str, body: bytes, message_id: str) -> None:
    """Publish straight to the main webhook queue, as a misbehaving producer would."""

    async def run() -> None:
        conn = await aiormq.connect(broker_url)
        try:
            ch = await conn.channel()
            await ch.basic_publish(
                body, exchange="deliveries", routing_key="webhook",
                properties=aiormq.spec.Basic.Properties(delivery_mode=2, message_id=message_id),
            )  # fmt: skip
        finally:
            await conn.close()

    await trio.to_thread.run_sync(asyncio.run, run())


async def get_one(broker_url: str, queue: str) -> tuple[bytes, dict[str, Any]]:
    """Take one message off ``queue`` (acked): its body and headers."""

    async def run() -> tuple[bytes, dict[str, Any]]:
        conn = await aiormq.connect(broker_url)
        try:
            ch = await conn.channel()
            got = await ch.basic_get(queue, no_ack=True)
            return got.body, dict(got.header.properties.headers or {})
        finally:
            await conn.close()

    return await trio.to_thread.run_sync(asyncio.run, run())


async def test_a_receiver_failing_twice_is_delivered_on_the_third_attempt_after_the_tiers(
    database_url: str, broker_url: str
) -> None:
    config = fast_retries(database_url, broker_url)
    key = await create_tenant_key(database_url)
    async with (
        open_sink(answers(500, 500)) as sink,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        await create_channel(api, sink.url)
        (delivery_id,) = await post_event(api)
        with trio.fail_after(30):
            await wait_status(database_url, delivery_id, "DELIVERED")
        first, second, third = sink.received
    assert await outcomes(database_url, delivery_id) == [(1, "retry"), (2, "retry"),
                                                         (3, "delivered")]  # fmt: skip
    assert (await delivery(database_url, delivery_id))["attempt"] == 3
    # Backoff 1·2^0 = 1 s → tier 1 s, then 1·2^1 = 2 s → tier 2 s (with a little broker slack).
    assert 1.0 <= second.at - first.at < 3.0
    assert 2.0 <= third.at - second.at < 4.0
    assert {r.headers["webhook-id"] for r in sink.received} == {delivery_id}
    verify_all(sink.received, SECRET)


async def test_an_always_failing_receiver_ends_dead_with_the_message_in_the_dlq(
    database_url: str, broker_url: str, vhost: str
) -> None:
    config = fast_retries(
        database_url, broker_url,
        workers={"webhook": {"concurrency": 2, "prefetch": 4, "max_attempts": 3,
                             "allow_private_networks": True}},
    )  # fmt: skip
    reporter = RecordingReporter()
    key = await create_tenant_key(database_url)
    async with (
        open_sink(answers(then=503)) as sink,
        run_notifier(config, reporter=reporter) as running,
        running.client(key) as api,
    ):
        await create_channel(api, sink.url)
        (delivery_id,) = await post_event(api)
        with trio.fail_after(30):
            await wait_status(database_url, delivery_id, "DEAD")
            await wait_depth(vhost, "deliveries.webhook.dead", 1)
        assert len(sink.received) == 3
        verify_all(sink.received, SECRET)
    assert await outcomes(database_url, delivery_id) == [(1, "retry"), (2, "retry"), (3, "dead")]
    row = await delivery(database_url, delivery_id)
    assert (row["attempt"], row["last_error"]) == (3, "HTTP 503: answer")
    (report,) = reporter.reports
    assert report.tags["delivery_id"] == delivery_id
    assert (report.tags["channel_type"], report.tags["attempt"]) == ("webhook", "3")
    depths = await trio.to_thread.run_sync(queue_depths, vhost)
    assert depths["deliveries.webhook"] == 0
    assert all(n == 0 for q, n in depths.items() if ".retry." in q), depths
    # What an operator finds in the DLQ: the last attempt's message, and why it is there.
    body, headers = await get_one(broker_url, "deliveries.webhook.dead")
    dead = decode_message(body)
    assert (str(dead.delivery_id), dead.attempt) == (delivery_id, 3)
    deaths = [(d["queue"], d["reason"], d["count"]) for d in headers["x-death"]]
    # Rejected from the main queue, after one pass through a delay tier: the retry copy was a
    # fresh message, so no history from earlier attempts piles up in its headers.
    assert deaths == [
        ("deliveries.webhook", "rejected", 1),
        ("deliveries.webhook.retry.2s", "expired", 1),
    ]


async def test_a_one_second_retry_is_not_held_behind_a_thirty_minute_one(
    database_url: str, broker_url: str, vhost: str
) -> None:
    config = fast_retries(database_url, broker_url, retry={"tiers_seconds": [1, 1800]})
    key = await create_tenant_key(database_url)
    async with (
        open_sink(answers(then=503, headers={"Retry-After": "1800"})) as slow,
        open_sink(answers(500)) as quick,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        await create_channel(api, slow.url, event_types=["slow"])
        await create_channel(api, quick.url, event_types=["quick"])
        (slow_id,) = await post_event(api, type="slow")
        with trio.fail_after(20):
            await wait_status(database_url, slow_id, "RETRYING")
            await wait_depth(vhost, "deliveries.webhook.retry.1800s", 1)
        (quick_id,) = await post_event(api, type="quick")
        with trio.fail_after(10):
            await wait_status(database_url, quick_id, "DELIVERED")
        assert len(quick.received) == 2
        assert 1.0 <= quick.received[1].at - quick.received[0].at < 3.0
        assert len(slow.received) == 1
        assert (await delivery(database_url, slow_id))["status"] == "RETRYING"
        depths = await trio.to_thread.run_sync(queue_depths, vhost)
        assert depths["deliveries.webhook.retry.1800s"] == 1
        verify_all(slow.received + quick.received, SECRET)


async def test_an_undecodable_message_is_dead_lettered_and_the_next_one_delivered(
    database_url: str, broker_url: str, vhost: str
) -> None:
    # One worker task, one message at a time: the task that met the poison handles the next.
    config = fast_retries(
        database_url, broker_url,
        workers={"webhook": {"concurrency": 1, "prefetch": 1, "allow_private_networks": True}},
    )  # fmt: skip
    reporter = RecordingReporter()
    key = await create_tenant_key(database_url)
    async with (
        open_sink() as sink,
        run_notifier(config, reporter=reporter) as running,
        running.client(key) as api,
    ):
        await create_channel(api, sink.url)
        await publish_raw(broker_url, b"{not json", "poison-1")
        await publish_raw(broker_url, b'{"delivery_id": 5}', "poison-2")
        (delivery_id,) = await post_event(api)
        with trio.fail_after(20):
            await wait_status(database_url, delivery_id, "DELIVERED")
            await wait_depth(vhost, "deliveries.webhook.dead", 2)
        assert [r.headers["webhook-id"] for r in sink.received] == [delivery_id]
        verify_all(sink.received, SECRET)
    assert sorted(r.tags["message_id"] for r in reporter.reports) == ["poison-1", "poison-2"]


async def test_a_rate_limited_adapter_delays_messages_without_using_up_attempts(
    database_url: str, broker_url: str
) -> None:
    config = fast_retries(database_url, broker_url)
    adapter = PacedAdapter(interval_seconds=1.5)
    key = await create_tenant_key(database_url)
    async with (
        run_notifier(config, adapters={"webhook": adapter}) as running,
        running.client(key) as api,
    ):
        await create_channel(api, "http://127.0.0.1:9/unused", max_attempts=1)
        ids = list(itertools.chain.from_iterable([await post_event(api) for _ in range(3)]))

        async def all_delivered() -> bool:
            n = await scalar(
                database_url,
                "SELECT count(*) FROM deliveries WHERE status = 'DELIVERED' AND attempt = 1",
            )
            return bool(n == 3)

        with trio.fail_after(30):
            await poll(all_delivered)
    assert sorted(str(m.delivery_id) for m in adapter.messages) == sorted(ids)
    gaps = [b - a for a, b in itertools.pairwise(sorted(adapter.called_at))]
    # the bucket keeps Postgres's time of each take; the call follows it by a moment that varies
    assert all(gap >= 1.45 for gap in gaps), gaps
    limited = await scalar(
        database_url,
        "SELECT count(*) FROM delivery_attempts WHERE outcome = 'rate_limited' AND attempt = 1",
    )
    assert limited >= 2  # at least the 2nd and 3rd waited once
    assert len(adapter.asked) == 3 + limited  # asked once per delivery and per wait


async def test_closing_every_broker_connection_mid_stream_loses_nothing(
    database_url: str, broker_url: str, vhost: str, caplog: pytest.LogCaptureFixture
) -> None:
    events = 150
    config = fast_retries(database_url, broker_url)
    key = await create_tenant_key(database_url)
    # A slow receiver (4 workers, 0.5 s each: 8 deliveries/s) keeps most of the first half
    # undelivered while rabbitmqctl takes its seconds to start on a loaded machine.
    async with (
        open_sink(delay_seconds=0.5) as sink,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        await create_channel(api, sink.url)
        ids: list[str] = []
        for _ in range(events // 2):
            ids += await post_event(api)
        with trio.fail_after(20):
            await sink.wait_for(10)
        await trio.to_thread.run_sync(
            rabbitmqctl, "close_all_connections", "-p", vhost, "fault injection"
        )
        assert len(sink.received) < len(ids), "the fault came mid-stream"
        for _ in range(events - events // 2):
            ids += await post_event(api)

        async def all_delivered() -> bool:
            n = await scalar(database_url, "SELECT count(*) FROM deliveries "
                                           "WHERE status = 'DELIVERED'")  # fmt: skip
            return bool(n == events)

        with trio.fail_after(60):
            await poll(all_delivered, interval_seconds=0.2)
        assert {r.headers["webhook-id"] for r in sink.received} == set(ids)
        verify_all(sink.received, SECRET)
        # the same process goes on delivering
        (after,) = await post_event(api)
        with trio.fail_after(20):
            await wait_status(database_url, after, "DELIVERED")
    assert await scalar(database_url, "SELECT count(*) FROM outbox") == 0
    restarted = {r.getMessage().split()[0] for r in caplog.records if "restarting in" in r.msg}
    assert {"relay", "workers.webhook"} <= restarted, restarted


async def test_a_destination_gone_for_good_disables_its_channel_until_patched(
    database_url: str, broker_url: str
) -> None:
    adapter = RecordingAdapter(
        "webhook", default=PermanentError("HTTP 410: gone", status_code=410, disable_channel=True)
    )
    config = fast_retries(database_url, broker_url)
    key = await create_tenant_key(database_url)
    async with (
        run_notifier(config, adapters={"webhook": adapter}) as running,
        running.client(key) as api,
    ):
        channel_id = await create_channel(api, "http://127.0.0.1:9/gone")
        (delivery_id,) = await post_event(api)
        with trio.fail_after(20):
            await wait_status(database_url, delivery_id, "DEAD")
        channel = (await api.get(f"/v1/channels/{channel_id}")).json()
        assert channel["enabled"] is False
        assert channel["disabled_reason"] == "HTTP 410: gone"
        assert channel["disabled_at"] is not None
        # a disabled channel gets no new deliveries
        assert await post_event(api) == []
        resp = await api.patch(f"/v1/channels/{channel_id}", json={"enabled": True})
        assert resp.status_code == 200, resp.text
        assert (resp.json()["enabled"], resp.json()["disabled_reason"]) == (True, None)
        assert resp.json()["disabled_at"] is None
        assert len(await post_event(api)) == 1
    assert len(adapter.messages) >= 1


async def test_deleted_retry_tiers_are_declared_again_without_a_hot_loop(
    database_url: str, broker_url: str, vhost: str
) -> None:
    # Backoff 2·2^0 = 2 s → tier 2 s, then 2·2^1 = 4 s → tier 5 s; the reconciler runs every
    # second and re-sends a delivery 5 s past due, as it would for a lost message.
    config = fast_retries(
        database_url, broker_url, retry={"base_seconds": 2, "tiers_seconds": [2, 5]},
        workers={"webhook": {"concurrency": 2, "prefetch": 4, "max_attempts": 3,
                             "allow_private_networks": True}},
        maintenance={"interval_seconds": 1, "stuck_after_seconds": 5},
    )  # fmt: skip
    tiers = ["deliveries.webhook.retry.2s", "deliveries.webhook.retry.5s"]
    key = await create_tenant_key(database_url)
    async with (
        open_sink(answers(then=500)) as sink,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        await create_channel(api, sink.url)
        for tier in tiers:  # an operator (or a broker that lost its definitions) removes them
            await trio.to_thread.run_sync(rabbitmqctl, "delete_queue", "-p", vhost, tier)
        assert not set(tiers) & set(await trio.to_thread.run_sync(queue_depths, vhost))
        (delivery_id,) = await post_event(api)
        with trio.fail_after(40):
            await wait_status(database_url, delivery_id, "DEAD")
            await wait_depth(vhost, "deliveries.webhook.dead", 1)
            # the returned retries declared the tiers again; nothing is left in flight
            for queue in [*tiers, "deliveries.webhook"]:
                await wait_depth(vhost, queue, 0)
        calls = list(sink.received)
    # every call of the receiver is an attempt row, and the budget of 3 ends it DEAD
    assert await outcomes(database_url, delivery_id) == [(1, "retry"), (2, "retry"), (3, "dead")]
    assert len(calls) == 3
    row = await delivery(database_url, delivery_id)
    assert (row["status"], row["attempt"]) == ("DEAD", 3)
    # the calls waited out their tiers: no hot loop (with a little broker slack)
    first, second, third = (r.at for r in calls)
    assert 1.5 <= second - first < 4.0
    assert 4.5 <= third - second < 7.0
    verify_all(calls, SECRET)
