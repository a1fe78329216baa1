"""Racing writes against the real Postgres: batches carrying the same idempotency keys in
opposite order. Database trouble is never a 500."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import httpx
import pytest
import trio

from notifier.config import Config
from tests.integration.conftest import create_tenant, run_notifier, scalar

pytestmark = pytest.mark.integration

ROUNDS = 30
Request = Callable[[], Awaitable[httpx.Response]]


@asynccontextmanager
async def api_client(config: Config) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    key = await create_tenant(config.database.url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        yield api, config.database.url


async def make_channel(api: httpx.AsyncClient) -> str:
    resp = await api.post("/v1/channels", json={
        "type": "webhook", "config": {"url": "http://127.0.0.1:9/hook"}})  # fmt: skip
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


async def concurrently(*requests: Request) -> list[httpx.Response]:
    """Send the requests at once; their answers, in order."""
    answers: list[httpx.Response | None] = [None] * len(requests)

    async def send(i: int) -> None:
        answers[i] = await requests[i]()

    async with trio.open_nursery() as nursery:
        for i in range(len(requests)):
            nursery.start_soon(send, i)
    return [a for a in answers if a is not None]


# -- opposite-order batches ---------------------------------------------------------------------


async def test_batches_with_the_same_keys_in_opposite_order_never_deadlock_into_a_500(
    config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="notifier.store")
    async with api_client(config) as (api, db):
        await make_channel(api)
        with trio.fail_after(120):
            for round in range(ROUNDS):
                events = [
                    {"type": "race.batch", "payload": {"n": n}, "idempotency_key": f"{round}-{n}"}
                    for n in range(40)
                ]
                forward, backward = events, events[::-1]
                answers = await concurrently(
                    partial(api.post, "/v1/events/batch", json={"events": forward}),
                    partial(api.post, "/v1/events/batch", json={"events": backward}),
                )
                statuses = sorted(a.status_code for a in answers)
                assert statuses in ([200, 202], [202, 202]), [a.text for a in answers]
                ids = [{e["id"] for e in a.json()["events"]} for a in answers]
                assert ids[0] == ids[1]  # the same 40 events, stored once, in either answer
        # The keys are locked in one order whatever the batch's: not even a retried deadlock.
        assert not [r.getMessage() for r in caplog.records if r.name == "notifier.store"]
        stored = await scalar(db, "SELECT count(*) FROM events")
        assert stored == 40 * ROUNDS
        assert await scalar(db, "SELECT count(*) FROM deliveries") == stored
