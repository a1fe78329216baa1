"""One receiver's trouble is its own (docs/architecture.md §5, the fair share): the whole service
on the real Postgres and RabbitMQ, with a webhook receiver that accepts connections and never
answers, or answers slowly, beside a healthy one of the same channel type."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from notifier.testing import open_sink
from tests.integration.conftest import create_tenant, make_config, poll, run_notifier, sql

pytestmark = pytest.mark.integration


@asynccontextmanager
async def open_hung_receiver() -> AsyncIterator[str]:
    """A receiver that accepts every connection, reads what comes and never answers; its URL."""

    async def hold(stream: trio.SocketStream) -> None:
        async with stream:
            while await stream.receive_some(65536):
                pass

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, hold, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}/hook"
        nursery.cancel_scope.cancel()


async def channel(api: httpx.AsyncClient, url: str, event_type: str) -> None:
    resp = await api.post(
        "/v1/channels",
        json={"type": "webhook", "config": {"url": url}, "event_types": [event_type]},
    )
    assert resp.status_code == 201, resp.text


async def post_events(api: httpx.AsyncClient, event_type: str, count: int) -> list[uuid.UUID]:
    """Post ``count`` events of ``event_type`` in one batch; their deliveries' ids."""
    events = [{"type": event_type, "payload": {"n": n}} for n in range(count)]
    resp = await api.post("/v1/events/batch", json={"events": events})
    assert resp.status_code == 202, resp.text
    return [uuid.UUID(d["id"]) for e in resp.json()["events"] for d in e["deliveries"]]


async def latencies(url: str, ids: list[uuid.UUID]) -> list[float]:
    """Seconds from each event's acceptance to its delivery, once all are delivered."""

    async def all_delivered() -> bool:
        rows = await sql(
            url, "SELECT count(*) FROM deliveries WHERE id = ANY($1) AND status = 'DELIVERED'", ids
        )
        return bool(rows[0][0] == len(ids))

    with trio.fail_after(30):
        await poll(all_delivered)
    rows = await sql(
        url,
        "SELECT extract(epoch FROM d.delivered_at - e.created_at)::float8 FROM deliveries d "
        "JOIN events e ON e.id = d.event_id WHERE d.id = ANY($1)",
        ids,
    )
    return sorted(r[0] for r in rows)


def p95(values: list[float]) -> float:
    return values[math.ceil(0.95 * len(values)) - 1]


def most_at_once(starts: list[float], seconds: float) -> int:
    """The most requests under way together, each taking ``seconds`` from its start."""
    edges = sorted([(t, 1) for t in starts] + [(t + seconds, -1) for t in starts])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def workers(**webhook: Any) -> dict[str, Any]:
    return {"webhook": {"allow_private_networks": True, **webhook}}


async def test_a_hung_receiver_does_not_hold_up_a_healthy_one(
    database_url: str, broker_url: str
) -> None:
    # The trial's numbers: concurrency 8, timeout 3 s, 40 deliveries to a receiver that never
    # answers, then 40 to a healthy one. Before the fair share these waited 14.5 s each.
    config = make_config(
        database_url, broker_url,
        workers=workers(concurrency=8, prefetch=32, timeout_seconds=3),
    )  # fmt: skip
    key = await create_tenant(database_url)
    async with (
        open_hung_receiver() as hung,
        open_sink() as healthy,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        await channel(api, hung, "stuck.*")
        await channel(api, healthy.url, "fine.*")
        await post_events(api, "stuck.x", 40)
        ids = await post_events(api, "fine.x", 40)
        seconds = await latencies(database_url, ids)
        assert len(healthy.received) >= 40
    assert p95(seconds) < 2.0, seconds
    # nothing was charged to the healthy deliveries: each delivered at its first attempt
    rows = await sql(database_url, "SELECT max(attempt) FROM deliveries WHERE id = ANY($1)", ids)
    assert rows[0][0] == 1


async def test_a_slow_receiver_gets_its_share_and_a_fast_one_is_not_delayed(
    database_url: str, broker_url: str
) -> None:
    config = make_config(
        database_url, broker_url,
        workers=workers(concurrency=8, prefetch=32, timeout_seconds=5),
    )  # fmt: skip
    key = await create_tenant(database_url)
    async with (
        open_sink(delay_seconds=2.0) as slow,
        open_sink() as fast,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        await channel(api, slow.url, "slow.*")
        await channel(api, fast.url, "fast.*")
        slow_ids = await post_events(api, "slow.x", 8)
        fast_ids = await post_events(api, "fast.x", 60)
        fast_seconds = await latencies(database_url, fast_ids)
        slow_seconds = await latencies(database_url, slow_ids)
        starts = [r.at for r in slow.received]
    assert p95(fast_seconds) < 2.0, fast_seconds
    # the slow receiver was kept at its share (a quarter of 8 tasks) and used all of it; each
    # of its deliveries succeeded at its first attempt, none counted as failed
    assert most_at_once(starts, 2.0) == 2
    assert len(slow_seconds) == len(slow_ids)
    rows = await sql(
        database_url,
        "SELECT count(*) FROM delivery_attempts WHERE delivery_id = ANY($1) "
        "AND outcome <> 'delivered'",
        slow_ids,
    )
    assert rows[0][0] == 0
