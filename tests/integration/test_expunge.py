"""Expunging an event's payload through the HTTP API on the real Postgres
(``DELETE /v1/events/{id}/payload``): the payload and the attempts' response excerpts go, the
event, its deliveries and their attempts stay; refused while a delivery is in flight, for an
unknown or another tenant's event, writing nothing; a second call changes nothing; a delivery of
an expunged event is not replayed, alone or in bulk, nor when the two race.

Like test_api.py, only the ingest role runs, on one database shared by the module: nothing moves
a delivery but the test, which writes what a worker would.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import pytest
import trio

from notifier.store import open_store
from notifier.store.base import Q
from notifier.store.errors import DeliveriesInFlight, NotReplayable
from tests.integration.conftest import PG_BASE, _pg, poll, scalar, sql
from tests.integration.test_api import Api, make_channel, open_api, post_event, refused

pytestmark = pytest.mark.integration

PAYLOAD = {"email": "ada@example.com", "order": {"id": 42}}


@pytest.fixture(scope="module")
def expunge_db(pg_template: str) -> Iterator[str]:
    name = f"notifier_expunge_{uuid.uuid4().hex[:12]}"
    _pg(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield f"{PG_BASE}/{name}"
    _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def api(expunge_db: str) -> AsyncIterator[Api]:
    async with open_api(expunge_db) as running:
        yield running


async def settle(api: Api, delivery_id: str, status: str, excerpt: str | None = None) -> None:
    """What a worker writes: one attempt (with the receiver's answer) and the status."""
    outcome = {"DELIVERED": "delivered", "DEAD": "dead", "RETRYING": "retry"}[status]
    await sql(
        api.db,
        """INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome,
                                          status_code, error, response_excerpt,
                                          delivery_created_at)
           SELECT $1, 1, now(), 7, $2, $3, $4, $5, created_at FROM deliveries WHERE id = $1""",
        uuid.UUID(delivery_id), outcome, 200 if status == "DELIVERED" else 500,
        None if status == "DELIVERED" else "HTTP 500", excerpt,
    )  # fmt: skip
    await sql(
        api.db, "UPDATE deliveries SET status = $2, attempt = 1 WHERE id = $1",
        uuid.UUID(delivery_id), status,
    )  # fmt: skip


async def history(api: Api, event_id: str) -> list[list[Any]]:
    """The event's deliveries and their attempts, every column but the response excerpts."""
    rows = await sql(
        api.db,
        """SELECT d.id, d.status, d.attempt, d.max_attempts, d.last_error, d.updated_at,
                  a.id, a.attempt, a.outcome, a.status_code, a.error, a.duration_ms, a.started_at
           FROM deliveries d LEFT JOIN delivery_attempts a ON a.delivery_id = d.id
           WHERE d.event_id = $1 ORDER BY d.id, a.id""",
        uuid.UUID(event_id),
    )
    return [list(r) for r in rows]


async def excerpts(api: Api, event_id: str) -> list[str | None]:
    rows = await sql(
        api.db,
        """SELECT a.response_excerpt FROM delivery_attempts a
           JOIN deliveries d ON d.id = a.delivery_id WHERE d.event_id = $1 ORDER BY a.id""",
        uuid.UUID(event_id),
    )
    return [r[0] for r in rows]


async def outbox_rows(api: Api, event_id: str) -> int:
    count: int = await scalar(
        api.db,
        """SELECT count(*) FROM outbox o JOIN deliveries d ON d.id = o.delivery_id
           WHERE d.event_id = $1""",
        uuid.UUID(event_id),
    )
    return count


async def finished_event(api: Api) -> dict[str, Any]:
    """An event of tenant A to two channels, one delivery DELIVERED (the receiver answered
    with an excerpt), the other DEAD; its outbox rows are still there (no relay runs)."""
    await make_channel(api.a, name="second")
    event = await post_event(api.a, payload=PAYLOAD)
    first, second = (d["id"] for d in event["deliveries"])
    await settle(api, first, "DELIVERED", '{"received": "ada@example.com"}')
    await settle(api, second, "DEAD")
    return event


async def test_the_payload_and_the_excerpts_go_the_history_stays(api: Api) -> None:
    event = await finished_event(api)
    path = f"/v1/events/{event['id']}"
    before = (await api.a.get(path)).json()
    assert before["payload"] == PAYLOAD
    assert before["payload_expunged_at"] is None
    kept = await history(api, event["id"])
    assert await excerpts(api, event["id"]) == ['{"received": "ada@example.com"}', None]
    assert await outbox_rows(api, event["id"]) == 2
    rows = await api.rows()

    resp = await api.a.delete(f"{path}/payload")
    assert resp.status_code == 200, resp.text
    expunged = resp.json()
    assert expunged["payload"] is None
    assert expunged["payload_expunged_at"] is not None
    rest = {k: v for k, v in expunged.items() if k not in ("payload", "payload_expunged_at")}
    assert rest == {k: v for k, v in before.items() if k not in ("payload", "payload_expunged_at")}
    assert (await api.a.get(path)).json() == expunged

    stored = await sql(
        api.db, "SELECT payload::text, payload_expunged_at FROM events WHERE id = $1",
        uuid.UUID(event["id"]),
    )  # fmt: skip
    assert stored[0][0] == "null"
    assert stored[0][1].isoformat() == expunged["payload_expunged_at"].replace("Z", "+00:00")
    assert await excerpts(api, event["id"]) == [None, None]
    assert await history(api, event["id"]) == kept, "deliveries and attempts as they were"
    # The outbox rows of finished deliveries could do nothing, and carried the payload.
    assert await outbox_rows(api, event["id"]) == 0
    assert await api.rows() == rows | {"outbox": rows["outbox"] - 2}
    detail = (await api.a.get(f"/v1/deliveries/{event['deliveries'][0]['id']}")).json()
    assert [(a["status_code"], a["response_excerpt"]) for a in detail["attempts"]] == [(200, None)]

    # Again: the same answer, and nothing is written.
    xmin = await scalar(api.db, "SELECT xmin::text FROM events WHERE id = $1",
                        uuid.UUID(event["id"]))  # fmt: skip
    again = await api.a.delete(f"{path}/payload")
    assert (again.status_code, again.json()) == (200, expunged)
    assert await scalar(api.db, "SELECT xmin::text FROM events WHERE id = $1",
                        uuid.UUID(event["id"])) == xmin  # fmt: skip
    assert await api.rows() == rows | {"outbox": rows["outbox"] - 2}


@pytest.mark.parametrize("status", ["PENDING", "RETRYING"])
async def test_a_delivery_in_flight_is_409_and_nothing_is_written(api: Api, status: str) -> None:
    await make_channel(api.a, name="second")
    event = await post_event(api.a, payload=PAYLOAD)
    first, second = (d["id"] for d in event["deliveries"])
    await settle(api, first, "DELIVERED", "ok")
    if status == "RETRYING":
        await settle(api, second, "RETRYING", "busy")
    path = f"/v1/events/{event['id']}"
    before = (await api.a.get(path)).json()
    kept = await history(api, event["id"])

    await refused(
        api, 409, "deliveries_in_flight", "1 of the event's deliveries", "PENDING or RETRYING",
        method="DELETE", path=f"{path}/payload",
    )  # fmt: skip
    assert (await api.a.get(path)).json() == before
    assert await history(api, event["id"]) == kept
    assert await excerpts(api, event["id"]) == ["ok"] + (["busy"] if status == "RETRYING" else [])

    # Once it is finished, the payload can go.
    await settle(api, second, "DELIVERED")
    assert (await api.a.delete(f"{path}/payload")).status_code == 200


async def test_an_unknown_or_another_tenants_event_is_404_and_nothing_is_written(
    api: Api, subtests: pytest.Subtests
) -> None:
    b_event = f"/v1/events/{api.b_event['id']}"
    await settle(api, api.b_delivery_id, "DELIVERED", "b's answer")
    owner = (await api.b.get(b_event)).json()
    for name, path in [
        ("unknown", f"/v1/events/{uuid.uuid4()}/payload"),
        ("another tenant's", f"{b_event}/payload"),
        # a malformed id names no event, as for GET /v1/events/{id}
        ("malformed", "/v1/events/not-a-uuid/payload"),
    ]:
        with subtests.test(event=name):
            await refused(api, 404, "not_found", method="DELETE", path=path)
    assert (await api.b.get(b_event)).json() == owner
    assert await excerpts(api, api.b_event["id"]) == ["b's answer"]
    async with api.client() as anonymous:
        await refused(
            api, 401, "unauthorized", client=anonymous, method="DELETE", path=f"{b_event}/payload"
        )
    assert (await api.b.get(b_event)).json() == owner


async def test_a_delivery_of_an_expunged_event_is_not_replayed(api: Api) -> None:
    channel = await make_channel(api.a, name="only", event_types=["replay.*"])
    gone = await post_event(api.a, type="replay.gone", payload=PAYLOAD)
    kept = await post_event(api.a, type="replay.kept", payload={"n": 2})
    (gone_id,), (kept_id,) = (
        [d["id"] for d in e["deliveries"] if d["channel_id"] == channel["id"]] for e in (gone, kept)
    )
    for d in gone["deliveries"] + kept["deliveries"]:  # A's catch-all channel has one too
        await settle(api, d["id"], "DEAD")
    assert (await api.a.delete(f"/v1/events/{gone['id']}/payload")).status_code == 200
    await sql(
        api.db,
        "DELETE FROM outbox USING deliveries d WHERE d.id = delivery_id AND d.event_id = $1",
        uuid.UUID(kept["id"]),
    )  # fmt: skip

    # One: 409, as for a delivery that cannot be replayed, and nothing is written.
    await refused(
        api, 409, "not_replayable", "payload was expunged",
        method="POST", path=f"/v1/deliveries/{gone_id}/retry",
    )  # fmt: skip
    # In bulk: left out, as a delivery of a disabled channel is; the other one is replayed.
    resp = await api.a.post(
        "/v1/deliveries/retry", json={"status": "DEAD", "channel_id": channel["id"]}
    )
    assert resp.status_code == 202, resp.text
    assert resp.json() == {"queued": 1, "more": False, "next_cursor": None}
    statuses = await sql(
        api.db, "SELECT id::text, status FROM deliveries WHERE id = ANY($1::uuid[])",
        [uuid.UUID(gone_id), uuid.UUID(kept_id)],
    )  # fmt: skip
    assert dict(statuses) == {gone_id: "DEAD", kept_id: "PENDING"}
    assert await outbox_rows(api, gone["id"]) == 0
    assert await outbox_rows(api, kept["id"]) == 1
    # The delivery's history stays readable: its status, its attempt, no payload to send.
    detail = (await api.a.get(f"/v1/deliveries/{gone_id}")).json()
    assert (detail["status"], [a["outcome"] for a in detail["attempts"]]) == ("DEAD", ["dead"])


# -- races: an expunge and a replay of the same event's delivery wait for each other -----------


def hold_transaction(
    url: str, steps: list[tuple[str, tuple[Any, ...]]], held: threading.Event,
    release: threading.Event,
) -> None:  # fmt: skip
    """In a thread: run ``steps`` in one transaction, say so (``held``), and commit once
    ``release`` is set."""

    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            async with conn.transaction():
                for query, args in steps:
                    await conn.fetch(query, *args)
                held.set()
                await asyncio.get_running_loop().run_in_executor(None, release.wait)
        finally:
            await conn.close()

    asyncio.run(run())


async def while_held(
    api: Api, steps: list[tuple[str, tuple[Any, ...]]], call: Callable[[], Awaitable[None]]
) -> None:
    """Hold ``steps``' transaction open, run ``call`` until it waits for a lock that
    transaction holds, then commit it and let ``call`` finish."""
    held, release = threading.Event(), threading.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                trio.to_thread.run_sync, hold_transaction, api.db, steps, held, release
            )
            with trio.fail_after(10):
                await poll(lambda: trio.to_thread.run_sync(held.is_set))
                nursery.start_soon(call)
                await poll(lambda: waiting_for_a_lock(api.db))
            release.set()
    finally:
        release.set()


async def waiting_for_a_lock(db: str) -> bool:
    waiting: int = await scalar(
        db,
        """SELECT count(*) FROM pg_stat_activity
           WHERE datname = current_database() AND wait_event_type = 'Lock'""",
    )
    return waiting > 0


async def dead_event(api: Api) -> tuple[uuid.UUID, uuid.UUID]:
    """An event of tenant A and its one delivery, DEAD: the ids of both."""
    event = await post_event(api.a, payload=PAYLOAD)
    (delivery,) = event["deliveries"]
    await settle(api, delivery["id"], "DEAD")
    return uuid.UUID(event["id"]), uuid.UUID(delivery["id"])


async def test_a_replay_waiting_for_an_expunge_finds_the_event_expunged(api: Api) -> None:
    event_id, delivery_id = await dead_event(api)
    tenant = api.tenant_a
    expunge = [
        (Q["expunge_lock_event"], (tenant, event_id)),
        (Q["expunge_lock_deliveries"], (tenant, [event_id])),
        (Q["expunge_events"], (tenant, [event_id])),
    ]
    async with open_store(api.db, max_size=2) as store:

        async def replay() -> None:
            with pytest.raises(NotReplayable):
                await store.replay_delivery(tenant, delivery_id)

        await while_held(api, expunge, replay)
    status = await scalar(api.db, "SELECT status FROM deliveries WHERE id = $1", delivery_id)
    assert status == "DEAD"
    assert await outbox_rows(api, str(event_id)) == 0


async def test_an_expunge_waiting_for_a_replay_finds_the_delivery_in_flight(api: Api) -> None:
    event_id, delivery_id = await dead_event(api)
    tenant = api.tenant_a
    replay = [(Q["replay"], (tenant, "DEAD", delivery_id, None, None, None, None, 1, None, None))]
    async with open_store(api.db, max_size=2) as store:

        async def expunge() -> None:
            with pytest.raises(DeliveriesInFlight):
                await store.expunge_event(tenant, event_id)

        await while_held(api, replay, expunge)
    payload = await scalar(api.db, "SELECT payload FROM events WHERE id = $1", event_id)
    assert payload is not None
    assert "ada@example.com" in payload
