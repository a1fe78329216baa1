"""``GET /metrics`` of a real service on the real Postgres and RabbitMQ."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from notifier.config import Config, parse_config
from notifier.testing import open_sink
from tests.chaos.harness import free_port
from tests.integration.conftest import create_tenant, make_config, poll, run_notifier, sql

N = 3
WEBHOOK = {"channel_type": "webhook"}
MAIN = {"channel_type": "webhook", "queue": "deliveries.webhook", "kind": "main"}
DEAD = {"channel_type": "webhook", "queue": "deliveries.webhook.dead", "kind": "dead"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(api: httpx.AsyncClient) -> Samples:
    """``GET /metrics`` (no API key), parsed: (sample name, labels) → value."""
    resp = await api.get("/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def scrape_until(
    api: httpx.AsyncClient, ready: Callable[[Samples], bool]
) -> Samples:  # fmt: skip
    """Scrape until ``ready`` holds for the answer (bound it with ``trio.fail_after``)."""
    last: Samples = {}

    async def check() -> bool:
        nonlocal last
        last = await scrape(api)
        return ready(last)

    await poll(check, interval_seconds=0.1)
    return last


async def post_events(api: httpx.AsyncClient, sink_url: str) -> None:
    ch = await api.post("/v1/channels", json={"type": "webhook", "config": {"url": sink_url}})
    assert ch.status_code == 201, ch.text
    for n in range(N):
        resp = await api.post("/v1/events", json={"type": "order.created", "payload": {"n": n}})
        assert resp.status_code == 202, resp.text


async def test_metrics_after_events_are_delivered(config: Config, database_url: str) -> None:
    key = await create_tenant(database_url)
    async with open_sink() as sink, run_notifier(config) as running, running.client(key) as api:
        await post_events(api, sink.url)
        with trio.fail_after(30):
            await sink.wait_for(N)

            def settled(s: Samples) -> bool:
                return (
                    get(s, "notifier_delivery_attempts_total", **WEBHOOK, outcome="delivered") == N
                    and get(s, "notifier_worker_in_flight", **WEBHOOK) == 0
                    and get(s, "notifier_outbox_depth") == 0
                    and get(s, "notifier_open_deliveries", status="PENDING") == 0
                    and get(s, "notifier_queue_messages", **MAIN) == 0
                )

            got = await scrape_until(api, settled)

    assert get(got, "notifier_events_ingested_total", source="http") == N
    assert get(got, "notifier_delivery_attempts_total", **WEBHOOK, outcome="retry") == 0
    assert get(got, "notifier_deliveries_dead_total", **WEBHOOK) == 0
    assert get(got, "notifier_delivery_attempt_duration_seconds_count", **WEBHOOK) == N
    assert get(got, "notifier_delivery_latency_seconds_count", **WEBHOOK) == N
    assert get(got, "notifier_relay_rows_published_total") == N
    assert get(got, "notifier_relay_lag_seconds_count") == N
    batches = get(got, "notifier_relay_batch_size_count")
    assert batches is not None
    assert 1 <= batches <= N
    assert get(got, "notifier_relay_batch_size_sum") == N
    assert get(got, "notifier_open_deliveries", status="RETRYING") == 0
    assert get(got, "notifier_oldest_open_delivery_age_seconds") == 0
    assert get(got, "notifier_broker_up") == 1
    assert get(got, "notifier_queue_messages", **DEAD) == 0
    tiers = [k for k in got if k[0] == "notifier_queue_messages" and ("kind", "retry") in k[1]]
    assert len(tiers) == len(config.retry.tiers_seconds)  # one series per delay tier
    # the worker group consumes its work queue; nothing consumes a tier or the dead letters
    assert get(got, "notifier_queue_consumers", **MAIN) == 1
    assert get(got, "notifier_queue_consumers", **DEAD) == 0
    assert get(got, "notifier_ready") == 1
    assert get(got, "notifier_database_up") == 1
    timed = {"route": "/v1/events", "status": "202"}
    assert get(got, "notifier_ingest_request_duration_seconds_count", **timed) == N
    assert not [k for k in got if k[0] == "notifier_channels_auto_disabled"]


async def test_channels_notifier_disabled_are_counted_by_type_and_a_patch_is_not(
    config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        ids = []
        for n in range(3):
            url = f"https://receiver-{n}.example/hook"
            ch = await api.post("/v1/channels", json={"type": "webhook", "config": {"url": url}})
            assert ch.status_code == 201, ch.text
            ids.append(ch.json()["id"])
        # one disabled by a worker (its receiver answered 410), one by a PATCH
        await sql(
            database_url,
            "UPDATE channels SET enabled = false, disabled_at = now(), "
            "disabled_reason = 'the receiver answered 410 Gone' WHERE id = $1",
            ids[0],
        )
        patched = await api.patch(f"/v1/channels/{ids[1]}", json={"enabled": False})
        assert patched.status_code == 200, patched.text
        got = await scrape(api)

    assert get(got, "notifier_channels_auto_disabled", **WEBHOOK) == 1


async def test_without_workers_the_queue_fills_and_open_deliveries_are_reported(
    config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    roles = ("ingest", "relay")
    async with (
        open_sink() as sink,
        run_notifier(config, roles) as running,
        running.client(key) as api,
    ):
        await post_events(api, sink.url)
        with trio.fail_after(30):
            got = await scrape_until(
                api,
                lambda s: (
                    get(s, "notifier_queue_messages", **MAIN) == N
                    and get(s, "notifier_outbox_depth") == 0
                ),
            )
        assert sink.received == []

    assert get(got, "notifier_open_deliveries", status="PENDING") == N
    assert get(got, "notifier_open_deliveries", status="RETRYING") == 0
    age = get(got, "notifier_oldest_open_delivery_age_seconds")
    assert age is not None
    assert age >= 0
    assert get(got, "notifier_relay_rows_published_total") == N
    assert get(got, "notifier_queue_messages", **DEAD) == 0
    assert get(got, "notifier_queue_consumers", **MAIN) == 0  # no worker group consumes it
    # no worker group in this process: no attempt series
    assert not [k for k in got if k[0] == "notifier_delivery_attempts_total"]


async def test_ingest_alone_reports_the_outbox_and_leaves_undeclared_queues_out(
    config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with (
        open_sink() as sink,
        run_notifier(config, ("ingest",)) as running,
        running.client(key) as api,
    ):
        await post_events(api, sink.url)
        got = await scrape(api)

    assert get(got, "notifier_outbox_depth") == N
    assert get(got, "notifier_open_deliveries", status="PENDING") == N
    assert get(got, "notifier_broker_up") == 1  # it answered; the queues just do not exist yet
    assert not [k for k in got if k[0] == "notifier_queue_messages"]
    # the standard process metrics of the one process, without a pid label
    assert (get(got, "process_resident_memory_bytes") or 0) > 0
    assert (get(got, "process_open_fds") or 0) > 0
    assert get(got, "process_cpu_seconds_total") is not None


async def test_an_unreachable_broker_is_broker_up_zero(database_url: str) -> None:
    config = make_config(database_url, "amqp://guest:guest@127.0.0.1:1/")
    async with run_notifier(config, ("ingest",)) as running, running.client() as api:
        with trio.fail_after(20):
            got = await scrape(api)

    assert get(got, "notifier_broker_up") == 0
    assert not [k for k in got if k[0] == "notifier_queue_messages"]
    assert not [k for k in got if k[0] == "notifier_queue_consumers"]
    assert get(got, "notifier_outbox_depth") == 0  # Postgres is still read
    assert get(got, "notifier_database_up") == 1
    assert get(got, "notifier_ready") == 0  # /readyz would say unavailable: RabbitMQ


TOKEN = "scrape-token-0123456789abcdef"
TOKEN_ENV = {"NOTIFIER_METRICS_TOKEN": TOKEN}


async def raw_get(port: int, path: str, headers: list[tuple[str, str]]) -> tuple[int, bytes, bytes]:
    """``GET path`` on a real socket, headers as given (twice the same name if so): status,
    head and body."""
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    request = "\r\n".join([*lines, *(f"{n}: {v}" for n, v in headers), "", ""]).encode()
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(request)
            answer = b""
            while chunk := await stream.receive_some(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body


def port_of(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1])


async def test_with_a_token_metrics_need_it_and_two_authorization_headers_are_refused(
    database_url: str, broker_url: str
) -> None:
    config = parse_config(
        {"database": {"url": database_url}, "broker": {"url": broker_url},
         "ingest": {"bind": "127.0.0.1:0", "metrics_token_env": "NOTIFIER_METRICS_TOKEN"}},
        env=TOKEN_ENV,
    )  # fmt: skip
    async with run_notifier(config, ("ingest",), environ=TOKEN_ENV) as running:
        port = port_of(running.base_url)
        status, head, body = await raw_get(port, "/metrics", [])
        assert status == 401
        assert re.search(rb"(?im)^www-authenticate: bearer\b", head), head
        assert json.loads(body)["error"]["code"] == "unauthorized"
        status, _, body = await raw_get(port, "/metrics", [("Authorization", "Bearer wrong")])
        assert status == 401
        assert json.loads(body)["error"]["code"] == "unauthorized"
        status, _, body = await raw_get(port, "/metrics", [("Authorization", f"Bearer {TOKEN}")])
        assert status == 200
        assert b"notifier_events_ingested_total" in body
        twice = [("Authorization", f"Bearer {TOKEN}")] * 2
        status, _, body = await raw_get(port, "/metrics", twice)
        assert status == 400
        assert json.loads(body)["error"]["code"] == "invalid_authorization"
        assert TOKEN.encode() not in body


async def test_a_metrics_bind_serves_metrics_and_the_ingest_port_answers_404(
    database_url: str, broker_url: str
) -> None:
    metrics_port = free_port()
    config = make_config(
        database_url, broker_url, ingest={"metrics_bind": f"127.0.0.1:{metrics_port}"}
    )
    async with run_notifier(config, ("ingest",)) as running:
        ingest_port = port_of(running.base_url)
        status, _, body = await raw_get(ingest_port, "/metrics", [])
        assert status == 404
        assert json.loads(body)["error"]["code"] == "not_found"
        assert (await raw_get(ingest_port, "/healthz", []))[0] == 200  # the rest as before
        status, head, body = await raw_get(metrics_port, "/metrics", [])
        assert status == 200
        assert b"text/plain; version=0.0.4" in head
        assert b"notifier_outbox_depth" in body
        status, _, body = await raw_get(metrics_port, "/v1/events", [])
        assert status == 404  # the metrics address serves /metrics only
    # stopped with the service: nothing listens there any more
    with pytest.raises(OSError, match="connect"):
        await trio.open_tcp_stream("127.0.0.1", metrics_port)
