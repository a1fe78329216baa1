"""Racing writes against the real Postgres: batches carrying the same idempotency keys in
opposite order, and PATCHes of one channel racing each other, a secret rotation and the
worker's automatic disable. Database trouble is never a 500, and a write never undoes a
concurrent one it did not name."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from notifier.adapters.webhook import PREVIOUS_SECRET, generate_secret
from notifier.config import Config
from notifier.ingest.events import new_event
from notifier.ingest.models import EventIn
from notifier.store import Store, open_store
from notifier.store.rows import AttemptRecord, IngestResult, NewEvent
from tests.integration.conftest import create_tenant, run_notifier, scalar, sql

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


def renames(api: httpx.AsyncClient, url: str, round: int) -> list[Request]:
    """Four PATCHes naming only the channel's name."""
    return [partial(api.patch, url, json={"name": f"r{round}-{n}"}) for n in range(4)]


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


def amqp_batch(tenants: list[uuid.UUID], round: int) -> list[tuple[uuid.UUID, NewEvent]]:
    """20 keyed events of each tenant, in the order given: the first's keys ascending, the
    second's descending."""
    keys = [range(20), range(19, -1, -1)]
    return [
        (tenant, new_event(EventIn(type="race.amqp", payload={"n": n}), f"{round}-{n}"))
        for tenant, numbers in zip(tenants, keys, strict=True)
        for n in numbers
    ]


async def ingest_into(
    outcomes: list[list[Any]], store: Store, batch: list[tuple[uuid.UUID, NewEvent]]
) -> None:
    outcomes.append(await store.ingest_each(batch, {}))


async def test_amqp_batches_spanning_tenants_in_opposite_order_never_deadlock(
    config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    """AMQP ingest stores a batch of several tenants' events in one transaction: the tenants,
    like the keys, are taken in one order whatever the batch's."""
    caplog.set_level(logging.INFO, logger="notifier.store")
    db = config.database.url
    for name in ("race-a", "race-b"):
        await create_tenant(db, name)
    async with open_store(db, max_size=4) as store:
        tenants = list((await store.tenant_ids_by_names(["race-a", "race-b"])).values())
        with trio.fail_after(120):
            for round in range(ROUNDS):
                outcomes: list[list[Any]] = []
                async with trio.open_nursery() as nursery:
                    for order in ([0, 1], [1, 0]):
                        batch = amqp_batch([tenants[t] for t in order], round)
                        nursery.start_soon(ingest_into, outcomes, store, batch)
                for found in outcomes:
                    assert all(isinstance(o, IngestResult) for o in found), found
    assert not [r.getMessage() for r in caplog.records if r.name == "notifier.store"]
    assert await scalar(db, "SELECT count(*) FROM events") == 2 * 20 * ROUNDS


# -- racing PATCHes -----------------------------------------------------------------------------


async def test_a_patch_naming_other_fields_never_re_enables_a_channel_disabled_meanwhile(
    config: Config,
) -> None:
    async with api_client(config) as (api, _):
        channel = await make_channel(api)
        url = f"/v1/channels/{channel}"
        with trio.fail_after(120):
            for round in range(ROUNDS):
                resp = await api.patch(url, json={"enabled": True})
                assert resp.status_code == 200, resp.text
                answers = await concurrently(
                    *renames(api, url, round),
                    partial(api.patch, url, json={"enabled": False}),
                )
                assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
                resp = await api.get(url)
                assert resp.json()["enabled"] is False, f"re-enabled in round {round}"
                assert resp.json()["disabled_reason"] == "disabled through the API"


async def test_a_patch_never_undoes_a_secret_rotation_racing_it(config: Config) -> None:
    async with api_client(config) as (api, db):
        channel = await make_channel(api)
        url = f"/v1/channels/{channel}"
        with trio.fail_after(120):
            for round in range(ROUNDS):
                secret = generate_secret()
                answers = await concurrently(
                    *renames(api, url, round),
                    partial(api.patch, url, json={
                        "config": {"url": "http://127.0.0.1:9/hook", "secret": secret}}),
                )  # fmt: skip
                assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
                stored = await scalar(
                    db, "SELECT config ->> 'secret' FROM channels WHERE id = $1",
                    uuid.UUID(channel),
                )  # fmt: skip
                assert stored == secret, f"the rotation was undone in round {round}"


async def test_two_rotations_racing_each_keep_the_replaced_secret_signing(
    config: Config,
) -> None:
    """Each rotation is made against the config the other one left: whichever lands last keeps
    the secret it replaced (the other new one) as the previous secret."""
    async with api_client(config) as (api, db):
        channel = await make_channel(api)
        url = f"/v1/channels/{channel}"
        with trio.fail_after(120):
            for round in range(ROUNDS):
                secrets = [generate_secret(), generate_secret()]
                answers = await concurrently(*(
                    partial(api.patch, url, json={
                        "config": {"url": "http://127.0.0.1:9/hook", "secret": s}})
                    for s in secrets
                ))  # fmt: skip
                assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
                (row,) = await sql(
                    db, "SELECT config ->> 'secret', config ->> $2 FROM channels WHERE id = $1",
                    uuid.UUID(channel), PREVIOUS_SECRET,
                )  # fmt: skip
                assert sorted([row[0], row[1]]) == sorted(secrets), f"round {round}"


async def test_a_patch_never_re_enables_a_channel_the_worker_disabled_meanwhile(
    config: Config,
) -> None:
    async with api_client(config) as (api, db), open_store(db, max_size=2) as store:
        channel = await make_channel(api)
        url = f"/v1/channels/{channel}"
        with trio.fail_after(120):
            for round in range(ROUNDS):
                resp = await api.patch(url, json={"enabled": True})
                assert resp.status_code == 200, resp.text
                resp = await api.post("/v1/events", json={"type": "race.gone", "payload": {}})
                assert resp.status_code == 202, resp.text
                (target,) = resp.json()["deliveries"]
                gone = AttemptRecord(
                    delivery_id=uuid.UUID(target["id"]), attempt=1, status="DEAD",
                    outcome="dead", started_at=datetime.now(UTC), duration_ms=1,
                    error="HTTP 410: gone", disable_channel=True,
                )  # fmt: skip

                async def worker_disables(gone: AttemptRecord) -> httpx.Response:
                    assert await store.record_attempts([gone]) == [True]
                    return httpx.Response(200)

                answers = await concurrently(
                    *renames(api, url, round),
                    partial(worker_disables, gone),
                )
                assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
                resp = await api.get(url)
                assert resp.json()["enabled"] is False, f"re-enabled in round {round}"
                assert resp.json()["disabled_reason"] == "HTTP 410: gone"
