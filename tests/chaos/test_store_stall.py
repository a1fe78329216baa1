"""A stalled Postgres: the TCP path to it holds every byte (the fault proxy's blackhole) while
notifier runs. Ingest must answer ``503`` with ``Retry-After`` within the configured bounds
(never ``202``), ``/readyz`` must answer ``503`` within about a second, and once the path heals
posting works again, every accepted event is stored and the relay drains the outbox.

Only the proxy in front of the machine's Postgres misbehaves; Postgres itself is left alone.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import trio

from tests.chaos.proxy import FaultProxy, open_fault_proxy
from tests.integration.conftest import (
    Running,
    create_tenant,
    make_config,
    poll,
    run_notifier,
    scalar,
    sql,
)

pytestmark = pytest.mark.integration

STATEMENT_TIMEOUT_SECONDS = 1.0
ACQUIRE_TIMEOUT_SECONDS = 1.0
# A store call waits for a connection, then for its statement (the client gives up half a
# second after the server would have); the answer may take a little on top (a loaded machine).
INGEST_BOUND_SECONDS = ACQUIRE_TIMEOUT_SECONDS + STATEMENT_TIMEOUT_SECONDS + 0.5 + 1.0
READYZ_BOUND_SECONDS = 2.5
HEAL_SECONDS = 20


def _through(proxy: FaultProxy, database_url: str) -> str:
    parts = urlsplit(database_url)
    netloc = parts.netloc.rsplit("@", 1)
    userinfo = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{proxy.port}"))


@pytest.fixture
async def proxy(database_url: str) -> AsyncIterator[FaultProxy]:
    port = urlsplit(database_url).port or 5432
    async with open_fault_proxy("127.0.0.1", port) as proxy:
        yield proxy


async def _post(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.post(
        "/v1/events",
        json={"type": "stall.probe", "payload": {"key": key}},
        headers={"Idempotency-Key": key},
    )


async def _post_in_the_stall(client: httpx.AsyncClient, key: str, answers: list[int]) -> None:
    """One post while Postgres is unreachable: a 503 with Retry-After, within the bound."""
    started = trio.current_time()
    with trio.fail_after(INGEST_BOUND_SECONDS):
        response = await _post(client, key)
    answers.append(response.status_code)
    assert response.status_code == 503, (response.status_code, response.text)
    assert int(response.headers["Retry-After"]) >= 1
    assert response.json()["error"]["code"] == "unavailable"
    assert trio.current_time() - started < INGEST_BOUND_SECONDS


async def _post_until_accepted(client: httpx.AsyncClient, key: str) -> int:
    """Send ``key`` until it is accepted (the path heals while the pool reconnects)."""
    while True:
        try:
            response = await _post(client, key)
        except httpx.TimeoutException:
            continue
        if response.status_code in (200, 202):
            return response.status_code
        assert response.status_code == 503, (response.status_code, response.text)
        await poll(functools.partial(_ready, client))  # send again once Postgres answers


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/readyz")).status_code == 200


async def test_a_stalled_postgres_path_answers_503_in_time_and_recovers(
    database_url: str, broker_url: str, proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    api_key = await create_tenant(database_url)
    config = make_config(
        _through(proxy, database_url),
        broker_url,
        database={
            "pool_max_size": 4,
            "statement_timeout_seconds": STATEMENT_TIMEOUT_SECONDS,
            "acquire_timeout_seconds": ACQUIRE_TIMEOUT_SECONDS,
        },
    )
    accepted: set[str] = set()
    refused: list[str] = []
    async with (
        run_notifier(config, ("ingest", "relay")) as running,
        running.client(api_key) as client,
    ):
        before = f"before-{uuid.uuid4().hex}"
        with trio.fail_after(10):
            assert (await _post(client, before)).status_code == 202
        accepted.add(before)

        await proxy.set_mode("blackhole")
        answers: list[int] = []
        for _ in range(3):
            key = f"stalled-{uuid.uuid4().hex}"
            refused.append(key)
            await _post_in_the_stall(client, key, answers)
        # More requests at once than the pool has connections: the ones that wait for a
        # connection are bounded too.
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                key = f"stalled-{uuid.uuid4().hex}"
                refused.append(key)
                nursery.start_soon(_post_in_the_stall, client, key, answers)
        assert answers == [503] * 9

        await _assert_not_ready(running)

        await proxy.set_mode("pass")
        with trio.fail_after(HEAL_SECONDS):
            after = f"after-{uuid.uuid4().hex}"
            assert await _post_until_accepted(client, after) == 202
            accepted.add(after)
            # What was refused was not stored: sent again, each is stored now.
            for key in refused:
                assert await _post_until_accepted(client, key) == 202
                accepted.add(key)
        with trio.fail_after(10):
            response = await client.get("/readyz")
        assert response.status_code == 200, response.text

        async def outbox_empty() -> bool:
            return await scalar(database_url, "SELECT count(*) FROM outbox") == 0

        # The relay waited out the stall (or restarted): nothing it owed is left behind.
        with trio.fail_after(HEAL_SECONDS):
            await poll(outbox_empty)

    stored = await sql(
        database_url,
        "SELECT idempotency_key FROM events WHERE type = 'stall.probe'",
    )
    assert sorted(r["idempotency_key"] for r in stored) == sorted(accepted)
    # No crash: a component restarting after losing its database is all that may be an error.
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert [e for e in errors if "restarting in" not in e or "StoreUnavailable" not in e] == []


async def _assert_not_ready(running: Running) -> None:
    async with running.client() as client:
        for _ in range(2):
            started = trio.current_time()
            with trio.fail_after(READYZ_BOUND_SECONDS):
                response = await client.get("/readyz")
            assert trio.current_time() - started < READYZ_BOUND_SECONDS
            assert response.status_code == 503, response.text
            body = response.json()
            assert body["status"] == "unavailable"
            assert body["checks"]["database"].startswith("unavailable")
