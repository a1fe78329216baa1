"""Operations against the real Postgres and RabbitMQ: replay (one delivery and by filter),
channel health (automatic disabling, re-enabling), the reconciler delivering what the broker
lost, retention, outbox hygiene and the per-key ingest rate limit."""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import msgspec
import trio

from notifier.adapters.webhook import generate_secret
from notifier.config import Config
from notifier.maintenance import maintenance_pass
from notifier.messages import decode_message
from notifier.store import Store, open_store
from notifier.store.rows import AttemptRecord
from notifier.testing import Received, open_sink
from tests.integration.conftest import (
    count_rows,
    create_tenant,
    delivery,
    make_config,
    outcomes,
    poll,
    queue_depths,
    rabbitmqctl,
    run_notifier,
    scalar,
    sql,
    verify_all,
    wait_status,
)

SECRET = generate_secret()
RETRY = {"base_seconds": 1, "max_seconds": 30, "tiers_seconds": [1, 2, 5, 30]}


async def create_channel(api: httpx.AsyncClient, url: str, **fields: Any) -> str:
    body = {"type": "webhook", "config": {"url": url, "secret": SECRET}, **fields}
    resp = await api.post("/v1/channels", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


async def post_event(
    api: httpx.AsyncClient, type: str = "order.created", **fields: Any
) -> list[str]:
    resp = await api.post("/v1/events", json={"type": type, "payload": {"n": 1}, **fields})
    assert resp.status_code == 202, resp.text
    return [d["id"] for d in resp.json()["deliveries"]]


class Answers:
    """A sink responder whose status can be changed while it runs."""

    def __init__(self, status: int) -> None:
        self.status = status

    def __call__(self, _: Received) -> tuple[int, dict[str, str], bytes]:
        return self.status, {}, b"answer"


@asynccontextmanager
async def connected(database_url: str) -> AsyncIterator[Store]:
    async with open_store(database_url, max_size=2) as store:
        yield store


# -- replay -------------------------------------------------------------------------------------


async def test_a_replayed_dead_delivery_is_delivered_with_a_fresh_budget(
    database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url, retry=RETRY)
    key = await create_tenant(database_url)
    receiver = Answers(500)
    async with (
        open_sink(receiver) as sink,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        await create_channel(api, sink.url, max_attempts=2)
        (delivery_id,) = await post_event(api)
        with trio.fail_after(20):
            await wait_status(database_url, delivery_id, "DEAD")

        # the receiver still fails: the replay has a budget of 2 attempts of its own, numbered on
        resp = await api.post(f"/v1/deliveries/{delivery_id}/retry")
        assert resp.status_code == 202, resp.text
        replayed = resp.json()
        assert (
            replayed["status"], replayed["attempt"], replayed["max_attempts"],
            replayed["last_error"],
        ) == ("PENDING", 3, 5, None)  # fmt: skip
        assert [(a["attempt"], a["outcome"], a["error"]) for a in replayed["attempts"]] == [
            (1, "retry", "HTTP 500: answer"), (2, "dead", "HTTP 500: answer"),
            (3, "replayed", None),
        ]  # fmt: skip
        with trio.fail_after(20):
            await wait_status(database_url, delivery_id, "DEAD")

        receiver.status = 200  # the receiver is fixed; the operator replays again
        resp = await api.post(f"/v1/deliveries/{delivery_id}/retry")
        assert (resp.json()["attempt"], resp.json()["max_attempts"]) == (6, 8)
        with trio.fail_after(20):
            await wait_status(database_url, delivery_id, "DELIVERED")
        after = (await api.get(f"/v1/deliveries/{delivery_id}")).json()
    assert (after["attempt"], after["last_error"]) == (7, None)
    assert await outcomes(database_url, delivery_id) == [
        (1, "retry"), (2, "dead"), (3, "replayed"), (4, "retry"), (5, "dead"), (6, "replayed"),
        (7, "delivered"),
    ]  # fmt: skip
    assert [r.headers["webhook-id"] for r in sink.received] == [delivery_id] * 5
    verify_all(sink.received, SECRET)
    assert await scalar(database_url, "SELECT count(*) FROM outbox") == 0


async def test_a_replay_recorded_before_the_numbers_kept_increasing_keeps_the_full_budget(
    database_url: str, broker_url: str
) -> None:
    # Only ingest runs: the delivery stays where the test puts it.
    config = make_config(database_url, broker_url)
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        await create_channel(api, "http://127.0.0.1:9/hook", max_attempts=3)
        (delivery_id,) = await post_event(api)
        # a history written before: the replay's row numbered with the attempts before it, a
        # note in its error, and the attempts after it numbered from 1 again
        await sql(database_url, "DELETE FROM outbox")
        await sql(database_url, "UPDATE deliveries SET status = 'DEAD', attempt = 3")
        await sql(database_url, """
            INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome,
                                           error, delivery_created_at)
            SELECT $1, n, now(), 0, outcome, error,
                   (SELECT created_at FROM deliveries WHERE id = $1)
            FROM unnest(ARRAY[1, 2, 3, 3, 1, 2, 3],
                        ARRAY['retry', 'retry', 'dead', 'replayed', 'retry', 'retry', 'dead'],
                        ARRAY['HTTP 500', 'HTTP 500', 'HTTP 500',
                              'replayed: enqueued again with a fresh attempt budget',
                              'HTTP 500', 'HTTP 500', 'HTTP 500'])
                AS t(n, outcome, error)""", uuid.UUID(delivery_id))  # fmt: skip

        resp = await api.post(f"/v1/deliveries/{delivery_id}/retry")
        assert resp.status_code == 202, resp.text
    # numbered after the highest entry; the old row is no replay's number: 3 attempts are left
    assert (resp.json()["attempt"], resp.json()["max_attempts"]) == (4, 7)
    rows = await sql(database_url, "SELECT body FROM outbox")
    assert [
        (m.attempt, m.max_attempts) for m in map(decode_message, (r["body"] for r in rows))
    ] == [(5, 7)]


async def test_replaying_one_delivery_is_refused_with_the_reason(
    database_url: str, broker_url: str
) -> None:
    # Only ingest runs: deliveries stay where the test puts them.
    config = make_config(database_url, broker_url)
    key, other = await create_tenant(database_url), await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        channel_id = await create_channel(api, "http://127.0.0.1:9/hook")
        (pending,) = await post_event(api)
        (dead,) = await post_event(api)
        await sql(database_url, "UPDATE deliveries SET status = 'DEAD' WHERE id = $1",
                  uuid.UUID(dead))  # fmt: skip
        before = await count_rows(database_url)

        resp = await api.post(f"/v1/deliveries/{pending}/retry")
        assert (resp.status_code, resp.json()["error"]["code"]) == (409, "not_replayable")
        assert "PENDING" in resp.json()["error"]["message"]

        resp = await api.post(f"/v1/deliveries/{uuid.uuid4()}/retry")
        assert (resp.status_code, resp.json()["error"]["code"]) == (404, "not_found")
        async with running.client(other) as api_b:
            resp = await api_b.post(f"/v1/deliveries/{dead}/retry")
            assert resp.status_code == 404  # another tenant's delivery

        resp = await api.post(f"/v1/deliveries/{dead}/retry", json={"x": 1})
        assert (resp.status_code, resp.json()["error"]["message"]) == (422, "x: unknown key")

        await api.patch(f"/v1/channels/{channel_id}", json={"enabled": False})
        resp = await api.post(f"/v1/deliveries/{dead}/retry")
        assert resp.status_code == 409
        assert "disabled; enable it first" in resp.json()["error"]["message"]
        assert await count_rows(database_url) == before  # nothing was written

        await api.patch(f"/v1/channels/{channel_id}", json={"enabled": True})
        resp = await api.post(f"/v1/deliveries/{dead}/retry")
        assert resp.status_code == 202, resp.text
        await api.delete(f"/v1/channels/{channel_id}")
        await sql(database_url, "UPDATE deliveries SET status = 'DEAD' WHERE id = $1",
                  uuid.UUID(dead))  # fmt: skip
        resp = await api.post(f"/v1/deliveries/{dead}/retry")
        assert resp.status_code == 409
        assert "deleted" in resp.json()["error"]["message"]


async def test_replay_by_filter_enqueues_the_matching_deliveries_with_the_current_config(
    database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url)
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        first = await create_channel(api, "http://127.0.0.1:9/a")
        second = await create_channel(api, "http://127.0.0.1:9/b")
        for type in ("order.created", "order.paid", "user.signup"):
            await post_event(api, type=type)
        await sql(database_url, "UPDATE deliveries SET status = 'DEAD', attempt = 5")
        await sql(database_url, "DELETE FROM outbox")
        # the operator fixes the first channel's receiver, then replays its dead deliveries
        resp = await api.patch(f"/v1/channels/{first}", json={
            "config": {"url": "http://127.0.0.1:9/fixed"}})  # fmt: skip
        assert resp.status_code == 200, resp.text

        async def replay(**body: Any) -> dict[str, Any]:
            resp = await api.post("/v1/deliveries/retry", json=body)
            assert resp.status_code == 202, resp.text
            answer = dict(resp.json())
            assert (answer.pop("next_cursor") is not None) == answer["more"], answer
            return answer

        assert await replay(channel_id=first, event_type="order.*", limit=1) == {
            "queued": 1, "more": True}  # fmt: skip
        assert await replay(channel_id=first, event_type="order.*") == {"queued": 1, "more": False}
        assert await replay(status="DELIVERED") == {"queued": 0, "more": False}
        past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
        assert await replay(created_before=past) == {"queued": 0, "more": False}

        rows = await sql(database_url, "SELECT body FROM outbox ORDER BY id")
        messages = [decode_message(r["body"]) for r in rows]
        assert [(str(m.channel_id), m.event_type) for m in messages] == [
            (first, "order.created"), (first, "order.paid")]  # fmt: skip
        # a replay's entry (6) follows the 5 attempts made; the budget of 5 is counted from it
        assert {(m.attempt, m.max_attempts) for m in messages} == {(7, 11)}
        assert {m.channel_config["url"] for m in messages} == {"http://127.0.0.1:9/fixed"}
        assert {m.channel_config["secret"] for m in messages} == {SECRET}
        states = await sql(database_url, "SELECT channel_id, status, attempt FROM deliveries")
        assert sorted((str(r[0]) == first, r[1], r[2]) for r in states) == [
            (False, "DEAD", 5), (False, "DEAD", 5), (False, "DEAD", 5),
            (True, "DEAD", 5), (True, "PENDING", 6), (True, "PENDING", 6)]  # fmt: skip

        assert await replay(channel_id=second, limit=1000) == {"queued": 3, "more": False}
        resp = await api.post("/v1/deliveries/retry", json={"status": "PENDING"})
        assert resp.status_code == 422
        resp = await api.post("/v1/deliveries/retry", json={"limit": 0})
        assert resp.status_code == 422


async def test_a_bulk_replay_walks_every_matching_delivery_once_with_its_cursor(
    database_url: str, broker_url: str
) -> None:
    """Replayed DELIVERED deliveries are DELIVERED again before the next call: only the cursor
    says where the previous call stopped."""
    config = make_config(database_url, broker_url)
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        await create_channel(api, "http://127.0.0.1:9/a")
        for batch in range(3):
            resp = await api.post("/v1/events/batch", json={"events": [
                {"type": "order.created", "payload": {"n": batch * 100 + n}}
                for n in range(100)]})  # fmt: skip
            assert resp.status_code == 202, resp.text
        await post_event(api, type="user.signup")  # matches no filter below
        await sql(database_url, "UPDATE deliveries SET status = 'DELIVERED', attempt = 1")
        await sql(database_url, "DELETE FROM outbox")

        answers = []
        body: dict[str, Any] = {"status": "DELIVERED", "event_type": "order.*", "limit": 100}
        with trio.fail_after(60):
            while True:
                resp = await api.post("/v1/deliveries/retry", json=body)
                assert resp.status_code == 202, resp.text
                answer = resp.json()
                answers.append((answer["queued"], answer["more"]))
                # the workers deliver what was replayed before the operator calls again
                await sql(database_url, "UPDATE deliveries SET status = 'DELIVERED' "
                          "WHERE status = 'PENDING'")  # fmt: skip
                if not answer["more"]:
                    assert answer["next_cursor"] is None
                    break
                body["cursor"] = answer["next_cursor"]
                assert len(answers) < 10, answers
        assert answers == [(100, True), (100, True), (100, False)]
        replays = await sql(database_url, """
            SELECT e.type, count(a.id) AS replays
            FROM deliveries d JOIN events e ON e.id = d.event_id
            LEFT JOIN delivery_attempts a ON a.delivery_id = d.id AND a.outcome = 'replayed'
            GROUP BY d.id, e.type""")  # fmt: skip
        assert sorted((r["type"], r["replays"]) for r in replays) == sorted(
            [("order.created", 1)] * 300 + [("user.signup", 0)]
        )
        assert await scalar(database_url, "SELECT count(*) FROM outbox") == 300


async def test_a_malformed_bulk_replay_cursor_is_422_and_replays_nothing(
    database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url)
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        await create_channel(api, "http://127.0.0.1:9/a")
        await post_event(api)
        await sql(database_url, "UPDATE deliveries SET status = 'DEAD'")
        await sql(database_url, "DELETE FROM outbox")
        before = await count_rows(database_url)
        no_offset = base64.urlsafe_b64encode(f"2026-01-01T00:00:00|{uuid.uuid4()}".encode())
        for cursor, code in [
            ("not a cursor", "invalid_cursor"),
            ("%%%%", "invalid_cursor"),
            (base64.urlsafe_b64encode(b"\xff\xfe").decode(), "invalid_cursor"),
            (base64.urlsafe_b64encode(b"2026-01-01T00:00:00+00:00").decode(), "invalid_cursor"),
            (base64.urlsafe_b64encode(b"yesterday|nobody").decode(), "invalid_cursor"),
            (no_offset.decode(), "invalid_cursor"),
            ("", "validation_error"),
            ("x" * 201, "validation_error"),
        ]:
            resp = await api.post("/v1/deliveries/retry", json={"cursor": cursor})
            assert resp.status_code == 422, (cursor, resp.text)
            assert resp.json()["error"]["code"] == code, (cursor, resp.text)
        resp = await api.post("/v1/deliveries/retry", json={"cursor": 42})
        assert resp.status_code == 422, resp.text
        assert await count_rows(database_url) == before
        assert (
            await scalar(database_url, "SELECT count(*) FROM deliveries WHERE status = 'DEAD'") == 1
        )


# -- channel health -----------------------------------------------------------------------------


def attempt(delivery_id: str, outcome: str, at: datetime) -> AttemptRecord:
    status = {"delivered": "DELIVERED", "retry": "RETRYING", "dead": "DEAD"}[outcome]
    return AttemptRecord(
        delivery_id=uuid.UUID(delivery_id), attempt=1, status=status, outcome=outcome,
        started_at=at, duration_ms=5, error=None if outcome == "delivered" else "HTTP 500",
    )  # fmt: skip


async def test_channel_health_counts_failures_and_disables_a_channel_failing_too_long(
    database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url)
    key = await create_tenant(database_url)
    now = datetime.now(UTC)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        failing = await create_channel(api, "http://127.0.0.1:9/a", event_types=["a"])
        flaky = await create_channel(api, "http://127.0.0.1:9/b", event_types=["b"])
        a = [(await post_event(api, type="a"))[0] for _ in range(3)]
        b = [(await post_event(api, type="b"))[0] for _ in range(3)]
        async with connected(database_url) as store:
            window = 60.0
            # an hour-old failure while automatic disabling is off (0): counted, nothing more
            await store.record_attempts(
                [attempt(a[0], "retry", now - timedelta(hours=1))], disable_after_failing_seconds=0
            )
            channel = (await api.get(f"/v1/channels/{failing}")).json()
            assert channel["enabled"] is True
            assert channel["health"]["consecutive_failures"] == 1
            # more failures with a 60 s window: failing for an hour without a success
            await store.record_attempts(
                [attempt(a[1], "retry", now), attempt(a[2], "dead", now)],
                disable_after_failing_seconds=window,
            )
            # failure, success, failure (one batch, in time order): one failure since the success
            await store.record_attempts(
                [attempt(b[0], "retry", now - timedelta(hours=2)),
                 attempt(b[1], "delivered", now - timedelta(hours=1)),
                 attempt(b[2], "retry", now)],
                disable_after_failing_seconds=window,
            )  # fmt: skip

        channel = (await api.get(f"/v1/channels/{failing}")).json()
        assert channel["enabled"] is False
        assert channel["disabled_reason"].startswith("failing without a success since ")
        assert "(3 consecutive failures)" in channel["disabled_reason"]
        assert channel["health"]["consecutive_failures"] == 3
        assert channel["health"]["last_success_at"] is None
        other = (await api.get(f"/v1/channels/{flaky}")).json()
        assert other["enabled"] is True
        assert other["health"]["consecutive_failures"] == 1
        assert other["health"]["last_success_at"] is not None
        assert datetime.fromisoformat(other["health"]["failing_since"]) == now

        resp = await api.patch(f"/v1/channels/{failing}", json={"enabled": True})
        health = resp.json()["health"]
        assert (resp.json()["disabled_reason"], health["consecutive_failures"]) == (None, 0)
        assert health["failing_since"] is None


async def test_the_workers_reads_take_the_day_their_messages_name_and_a_wrong_one_costs_nothing(
    database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url)
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        await create_channel(api, "http://127.0.0.1:9/hook")
        today, old = (await post_event(api))[0], (await post_event(api))[0]
    await move_to_day(database_url, old, 3)
    created = {
        str(r[0]): r[1] for r in await sql(database_url, "SELECT id, created_at FROM deliveries")
    }
    wrong = created[today] - timedelta(days=5)  # a day that holds neither
    async with connected(database_url) as store:
        keys = [(uuid.UUID(today), created[today]), (uuid.UUID(old), created[old])]
        states = await store.delivery_states(keys)
        assert [s.status if s else None for s in states] == ["PENDING", "PENDING"]
        # A day that does not hold the delivery: found all the same, in every partition.
        states = await store.delivery_states([(uuid.UUID(today), wrong), (uuid.UUID(old), None)])
        assert [s.status if s else None for s in states] == ["PENDING", "PENDING"]
        assert await store.delivery_states([(uuid.uuid4(), wrong)]) == [None]
        rec = attempt(today, "delivered", datetime.now(UTC))
        moved = await store.record_attempts([
            msgspec.structs.replace(rec, created_at=wrong),
            msgspec.structs.replace(attempt(old, "retry", datetime.now(UTC)),
                                    created_at=created[old]),
        ])  # fmt: skip
        assert moved == [True, True]
    rows = await sql(database_url, "SELECT d.id::text, d.status, a.outcome, a.delivery_created_at"
                                   " FROM deliveries d JOIN delivery_attempts a ON a.delivery_id ="
                                   " d.id ORDER BY d.created_at")  # fmt: skip
    assert [tuple(r) for r in rows] == [
        (old, "RETRYING", "retry", created[old]),
        (today, "DELIVERED", "delivered", created[today]),
    ]


async def test_deliveries_of_a_channel_disabled_for_failing_end_dead_without_an_attempt(
    database_url: str, broker_url: str
) -> None:
    config = make_config(
        database_url, broker_url, retry=RETRY, channel_health={"disable_after_failing_seconds": 1}
    )
    key = await create_tenant(database_url)
    async with (
        open_sink(Answers(500)) as sink,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        channel_id = await create_channel(api, sink.url, max_attempts=10)
        (delivery_id,) = await post_event(api)
        with trio.fail_after(30):
            await wait_status(database_url, delivery_id, "DEAD")
        channel = (await api.get(f"/v1/channels/{channel_id}")).json()
    assert channel["enabled"] is False
    assert channel["disabled_reason"].startswith("failing without a success since")
    final = await delivery(database_url, delivery_id)
    assert final["last_error"].startswith("channel disabled: failing without a success since")
    made = await outcomes(database_url, delivery_id)
    # the attempts that reached the receiver failed; the one after the channel was disabled
    # ended the delivery without reaching it
    assert made[-1][1] == "dead"
    assert [o for _, o in made[:-1]] == ["retry"] * (len(made) - 1)
    assert len(sink.received) == len(made) - 1 >= 2


# -- maintenance --------------------------------------------------------------------------------


async def test_the_reconciler_delivers_what_the_broker_lost(
    database_url: str, broker_url: str, vhost: str
) -> None:
    events = 20
    key = await create_tenant(database_url)
    async with open_sink() as sink:
        # 1. Accepted and relayed, but no worker runs: the messages wait in the main queue.
        config = make_config(database_url, broker_url)
        async with run_notifier(config, ("ingest", "relay")) as running, running.client(key) as api:
            await create_channel(api, sink.url)
            for _ in range(events):
                await post_event(api)

            async def relayed() -> bool:
                outbox = await scalar(database_url, "SELECT count(*) FROM outbox")
                return outbox == 0 and queue_depths(vhost).get("deliveries.webhook") == events

            with trio.fail_after(20):
                await poll(relayed)
        # 2. The queue is deleted with everything in it.
        rabbitmqctl("delete_queue", "-p", vhost, "deliveries.webhook")
        # 3. The service comes back as separate processes' roles (the workers declare the
        # queue again, empty); the maintenance role's reconciler finds the stuck deliveries
        # and enqueues them again, and the relay of the first process publishes them.
        config = make_config(
            database_url, broker_url,
            maintenance={"interval_seconds": 0.5, "stuck_after_seconds": 1},
        )  # fmt: skip
        async with (
            run_notifier(config, ("ingest", "relay", "workers")),
            run_notifier(config, ("maintenance",)),
        ):
            with trio.fail_after(30):
                await sink.wait_for(events)

            async def all_delivered() -> bool:
                return (
                    await scalar(
                        database_url, "SELECT count(*) FROM deliveries WHERE status = 'DELIVERED'"
                    )
                    == events
                )

            with trio.fail_after(20):
                await poll(all_delivered)
    assert len({r.headers["webhook-id"] for r in sink.received}) == events
    verify_all(sink.received, SECRET)


async def move_to_day(url: str, delivery_id: str, days_ago: int) -> None:
    """Move a delivery, its event, its attempts and its event's key to noon (UTC) ``days_ago``
    days back, into that day's partitions (made first): as if it had been accepted then."""
    await sql(url, "SELECT notifier_partitions_ensure($1::date, $1::date)",
              datetime.now(UTC).date() - timedelta(days=days_ago))  # fmt: skip
    at = datetime.combine(
        datetime.now(UTC).date() - timedelta(days=days_ago), datetime.min.time(), UTC
    ) + timedelta(hours=12)
    (event_id,) = (await sql(url, "SELECT event_id FROM deliveries WHERE id = $1",
                             uuid.UUID(delivery_id)))[0]  # fmt: skip
    await sql(url, "UPDATE delivery_attempts SET delivery_created_at = $2 WHERE delivery_id IN "
                   "(SELECT id FROM deliveries WHERE event_id = $1)", event_id, at)  # fmt: skip
    await sql(url, "UPDATE deliveries SET created_at = $2 WHERE event_id = $1", event_id, at)
    await sql(url, "UPDATE events SET created_at = $2 WHERE id = $1", event_id, at)
    await sql(url, "UPDATE event_keys SET created_at = $2 WHERE event_id = $1", event_id, at)


def day_suffix(days_ago: int) -> str:
    return (datetime.now(UTC).date() - timedelta(days=days_ago)).strftime("_p%Y%m%d")


async def test_retention_drops_old_finished_days_only_and_hygiene_cleans_the_outbox(
    database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url, maintenance={"retention_days": 30})
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        await create_channel(api, "http://127.0.0.1:9/hook")
        (old_done,) = await post_event(api, idempotency_key="k-old")
        (old_open,) = await post_event(api)
        (new_done,) = await post_event(api)
    for d in (old_done, new_done):
        await sql(database_url, "UPDATE deliveries SET status = 'DELIVERED' WHERE id = $1",
                  uuid.UUID(d))  # fmt: skip
    await sql(
        database_url,
        """
        INSERT INTO delivery_attempts
            (delivery_id, attempt, started_at, duration_ms, outcome, delivery_created_at)
        SELECT id, 1, now(), 1, 'delivered', created_at FROM deliveries
        WHERE status = 'DELIVERED'""",
    )
    await move_to_day(database_url, old_done, 32)
    await move_to_day(database_url, old_open, 31)
    await sql(database_url, "UPDATE outbox SET created_at = now() - interval '2 minutes'")

    async with connected(database_url) as store:
        assert (await store.metrics_snapshot(30)).history_days_overdue == 2
        result = await maintenance_pass(config.maintenance, store)
        # The day of the finished delivery is dropped whole; the day of the unfinished one is
        # kept, however old, and said to be overdue.
        assert (result.days_dropped, result.days_kept, result.reenqueued) == (1, 1, 0)
        assert (await store.metrics_snapshot(30)).history_days_overdue == 1
    tables = {
        r[0]
        for r in await sql(
            database_url, "SELECT relname::text FROM pg_class WHERE relname ~ '_p[0-9]{8}$'"
        )
    }
    history = ("events", "deliveries", "delivery_attempts")
    assert not {f"{t}{day_suffix(32)}" for t in history} & tables
    assert f"deliveries{day_suffix(31)}" in tables
    remaining = {str(r[0]) for r in await sql(database_url, "SELECT id FROM deliveries")}
    assert remaining == {old_open, new_done}
    assert await scalar(database_url, "SELECT count(*) FROM delivery_attempts") == 1
    assert await scalar(database_url, "SELECT count(*) FROM events") == 2
    # The dropped event's idempotency key went after it: the key is free again.
    assert result.keys_expired == 1
    assert await scalar(database_url, "SELECT count(*) FROM event_keys") == 0
    # the outbox rows of the dropped and of the finished delivery are gone; the open one stays
    assert result.outbox_cleaned == 2
    kept = [str(r[0]) for r in await sql(database_url, "SELECT delivery_id FROM outbox")]
    assert kept == [old_open]

    # Once the old delivery is finished, its day goes on the next pass.
    await sql(database_url, "UPDATE deliveries SET status = 'DEAD' WHERE id = $1",
              uuid.UUID(old_open))  # fmt: skip
    async with connected(database_url) as store:
        result = await maintenance_pass(config.maintenance, store)
        assert (result.days_dropped, result.days_kept) == (1, 0)
        assert (await store.metrics_snapshot(30)).history_days_overdue == 0
    assert {str(r[0]) for r in await sql(database_url, "SELECT id FROM deliveries")} == {new_done}


# -- ingest rate limit ----------------------------------------------------------------------------


async def test_the_ingest_rate_limit_is_per_key_and_writes_nothing_when_it_refuses(
    database_url: str, broker_url: str
) -> None:
    config: Config = make_config(
        database_url, broker_url,
        ingest={"rate_limit_per_second": 0.01, "rate_limit_burst": 3, "max_batch_events": 3},
    )  # fmt: skip
    key, other = await create_tenant(database_url), await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        await create_channel(api, "http://127.0.0.1:9/hook")
        await post_event(api)
        batch = {"events": [{"type": "a", "payload": {}}, {"type": "b", "payload": {}}]}
        assert (await api.post("/v1/events/batch", json=batch)).status_code == 202
        before = await count_rows(database_url)
        resp = await api.post("/v1/events", json={"type": "a", "payload": {}})
        assert resp.status_code == 429
        assert resp.json()["error"]["code"] == "rate_limited"
        assert resp.headers["Retry-After"] == "100"  # one event back every 100 s
        assert await count_rows(database_url) == before
        assert (await api.get("/v1/channels")).status_code == 200  # reads are not limited
        async with running.client(other) as api_b:
            resp = await api_b.post("/v1/events", json={"type": "a", "payload": {}})
            assert resp.status_code == 202  # another key has its own budget
