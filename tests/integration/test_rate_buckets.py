"""The shared rate-limit buckets in a migrated database: the SQL functions keep the rules of their
Python statements (``notifier.ratelimit.TokenBucket``, ``RefillingBucket``) case by case on
given times; the store's takes are atomic under concurrency (one token is taken once, several
buckets all or none), also through PgBouncer in transaction pooling; maintenance deletes only
buckets full again for a while; ``notifier migrate`` brings a database from before the limits up
to date."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import trio

from notifier.ratelimit import Bucket, RefillingBucket, TokenBucket
from notifier.store import open_store
from tests.integration.conftest import make_pre_versions_database, scalar, sql
from tests.integration.test_cli import config_file, notifier
from tests.pgbouncer import pgbouncer_instance

WINDOWS = {"a": (1, 1.0), "b": (3, 2.0), "c": (30, 1.0)}  # key: (tokens, period)


def _run(database_url: str, scenario: Any) -> Any:
    """Run ``scenario(conn)`` on one asyncpg connection of its own."""

    async def run() -> Any:
        conn = await asyncpg.connect(database_url)
        try:
            return await scenario(conn)
        finally:
            await conn.close()

    return asyncio.run(run())


@pytest.mark.parametrize("seed", range(3))
async def test_window_buckets_in_sql_keep_the_rule_of_token_bucket(
    database_url: str, seed: int
) -> None:
    rng = random.Random(seed)
    model = {key: TokenBucket(tokens, period) for key, (tokens, period) in WINDOWS.items()}
    steps: list[tuple[list[str], float]] = []
    now = 1_000.0
    for _ in range(300):
        now += rng.choice([0.0, 0.01, 0.1, 0.25, 0.5, 1.0])
        steps.append((rng.sample(sorted(WINDOWS), rng.randint(1, 3)), now))

    async def scenario(conn: Any) -> list[float]:
        waits = []
        for keys, at in steps:
            waits.append(await conn.fetchval(
                "SELECT notifier_rate_take($1::text[], $2::integer[], $3::float8[], $4)",
                keys, [WINDOWS[k][0] for k in keys], [WINDOWS[k][1] for k in keys], at,
            ))  # fmt: skip
        return waits

    got = await trio.to_thread.run_sync(_run, database_url, scenario)
    taken = 0
    for (keys, at), wait in zip(steps, got, strict=True):
        expected = max(model[k].wait(at) for k in keys)
        assert wait == pytest.approx(expected, abs=1e-6), (keys, at)
        if expected == 0.0:
            taken += 1
            for k in keys:
                model[k].take(at)
    assert 0 < taken < len(steps)  # the cases took and refused


@pytest.mark.parametrize("seed", range(3))
async def test_refilling_buckets_in_sql_keep_the_rule_of_refilling_bucket(
    database_url: str, seed: int
) -> None:
    rng = random.Random(seed)
    capacity, rate = 5, 2.0
    model = RefillingBucket(capacity, rate)
    steps: list[tuple[int, float]] = []
    now = 1_000.0
    for _ in range(300):
        now += rng.choice([0.0, 0.05, 0.2, 0.5, 1.0, 3.0])
        steps.append((rng.randint(1, capacity), now))

    async def scenario(conn: Any) -> list[float]:
        return [
            await conn.fetchval(
                "SELECT notifier_rate_admit('t', $1, $2, $3, $4)", capacity, rate, n, at
            )
            for n, at in steps
        ]

    got = await trio.to_thread.run_sync(_run, database_url, scenario)
    taken = 0
    for (n, at), wait in zip(steps, got, strict=True):
        expected = model.wait(at, n)
        assert wait == pytest.approx(expected, abs=1e-6), (n, at)
        if expected == 0.0:
            taken += 1
            model.take(at, n)
    assert 0 < taken < len(steps)


async def test_concurrent_takes_of_one_token_take_it_once_and_several_buckets_all_or_none(
    database_url: str,
) -> None:
    chat, bot = Bucket("chat", 1, 60.0), Bucket("bot", 3, 60.0)
    others = [Bucket(f"chat-{n}", 1, 60.0) for n in range(10)]
    async with open_store(database_url, max_size=10) as store:
        waits: list[float] = []

        async def take(buckets: list[Bucket]) -> None:
            waits.append(await store.take_tokens(buckets))

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(take, [chat, bot])
        assert sorted(waits)[:2] == [0.0, pytest.approx(60.0, abs=5)]  # taken once
        assert waits.count(0.0) == 1
        waits.clear()
        async with trio.open_nursery() as nursery:
            for other in others:  # 10 chats, the bot has 2 tokens left: only 2 go
                nursery.start_soon(take, [bot, other])
        assert waits.count(0.0) == 2
        # the refused chats were not taken from: on their own, each still has its token
        spent = await sql(database_url, "SELECT key FROM rate_buckets WHERE spent <> '{}'")
        assert len([r for r in spent if r["key"].startswith("chat-")]) == 2
        assert await store.take_tokens([]) == 0.0


async def test_maintenance_deletes_only_buckets_full_again_for_a_minute(
    database_url: str,
) -> None:
    await sql(
        database_url,
        "SELECT notifier_rate_take(ARRAY['old'], ARRAY[1], ARRAY[1.0],"
        " extract(epoch FROM now())::float8 - 120)",
    )
    await sql(database_url, "SELECT notifier_rate_admit('old-ingest', 5, 1.0, 5, 1000.0)")
    async with open_store(database_url) as store:
        await store.take_tokens([Bucket("busy", 1, 1.0)])
        await store.admit("ingest", 3, capacity=3, rate=0.01)  # full again in 300 s
        assert await store.clean_rate_buckets(limit=1) == 1
        assert await store.clean_rate_buckets(limit=10) == 1
        assert await store.clean_rate_buckets(limit=10) == 0
    kept = {r["key"] for r in await sql(database_url, "SELECT key FROM rate_buckets")}
    assert kept == {"busy", "ingest"}
    assert await scalar(database_url, "SELECT relpersistence::text FROM pg_class"
                        " WHERE relname = 'rate_buckets'") == "u"  # fmt: skip


async def test_a_key_given_twice_in_one_take_is_refused(database_url: str) -> None:
    async with open_store(database_url) as store:
        with pytest.raises(ValueError, match="twice"):
            await store.take_tokens([Bucket("k", 1, 1.0), Bucket("k", 1, 1.0)])


async def test_migrate_adds_the_limits_to_an_older_database(
    tmp_path: Path, database_url: str
) -> None:
    tenant, channel = uuid.uuid4(), uuid.uuid4()
    await make_pre_versions_database(database_url)  # a release before versions were kept
    await sql(database_url, "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, 'a', 'h')",
              tenant)  # fmt: skip
    await sql(
        database_url,
        "INSERT INTO channels (id, tenant_id, type, config) VALUES ($1, $2, 'webhook', $3)",
        channel, tenant, json.dumps({"url": "https://example.com"}),
    )  # fmt: skip
    for statement in (
        "DROP TABLE rate_buckets",
        "DROP FUNCTION notifier_rate_take",
        "DROP FUNCTION notifier_rate_admit",
        "DROP FUNCTION notifier_rate_lock",
        "ALTER TABLE channels DROP COLUMN rate_limit_per_second",
    ):
        await sql(database_url, statement)
    done = notifier("migrate", "--config", str(config_file(tmp_path, database_url)))
    assert done.returncode == 0, done.stderr
    assert await scalar(
        database_url, "SELECT rate_limit_per_second FROM channels WHERE id = $1", channel
    ) is None  # fmt: skip
    assert await scalar(
        database_url, "SELECT notifier_rate_take(ARRAY['k'], ARRAY[1], ARRAY[1.0])"
    ) == 0.0  # fmt: skip


async def test_the_buckets_hold_through_pgbouncer_in_transaction_pooling(
    database_url: str,
) -> None:
    chat = Bucket("chat", 1, 60.0)
    with pgbouncer_instance(pool_size=2) as bouncer:
        await bouncer.start()
        url = bouncer.url(database_url.rsplit("/", 1)[1])
        async with open_store(url, max_size=6, pooler="pgbouncer") as store:
            waits: list[float] = []

            async def take() -> None:
                waits.append(await store.take_tokens([chat, Bucket("bot", 30, 1.0)]))

            async with trio.open_nursery() as nursery:
                for _ in range(12):  # concurrent: on both server connections
                    nursery.start_soon(take)
            assert waits.count(0.0) == 1
            assert await store.admit("ingest", 2, capacity=2, rate=0.01) == 0.0
            assert await store.admit("ingest", 1, capacity=2, rate=0.01) > 90


# -- locking order and bounds ---------------------------------------------------------------------

TAKE = "SELECT notifier_rate_take($1::text[], array_fill(1, ARRAY[cardinality($1)]), " \
    "array_fill(1.0::float8, ARRAY[cardinality($1)]))"  # fmt: skip


async def _waits_for_a_lock(observer: Any, pid: int) -> None:
    """Return once the backend ``pid`` waits for a lock (bounded by the caller)."""
    query = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1"
    while await observer.fetchval(query, pid) != "Lock":  # noqa: ASYNC110 - another backend
        await asyncio.sleep(0.01)


async def test_takes_that_meet_a_new_key_and_an_existing_one_do_not_deadlock(
    database_url: str,
) -> None:
    """`b` exists, `a` does not. One transaction takes `a` (inserting it, uncommitted), then a
    take of `a` and `b` waits for it, then the first takes `b`. Locking the existing `b` first
    and inserting `a` after, the waiting take held `b`: the first waited for it in turn and
    Postgres found a deadlock. Locking every key in key order, it holds nothing while it waits
    for `a`."""

    async def scenario() -> list[float]:
        first, second, observer = [await asyncpg.connect(database_url) for _ in range(3)]
        try:
            await first.execute("INSERT INTO rate_buckets (key) VALUES ('b')")
            first_tx, second_tx = first.transaction(), second.transaction()
            await first_tx.start()
            await first.fetchval(TAKE, ["a"])
            await second_tx.start()
            both = asyncio.ensure_future(second.fetchval(TAKE, ["a", "b"]))
            await asyncio.wait_for(_waits_for_a_lock(observer, second.get_server_pid()), 20)
            took_b = await asyncio.wait_for(first.fetchval(TAKE, ["b"]), 20)
            await first_tx.commit()
            took_both = await asyncio.wait_for(both, 20)
            await second_tx.commit()
            return [took_b, took_both]
        finally:
            for conn in (first, second, observer):
                await conn.close()

    took_b, took_both = await trio.to_thread.run_sync(asyncio.run, scenario())
    assert took_b == 0.0  # the first transaction took `b`'s one token
    assert 0 < took_both <= 1.0  # `a` and `b` are spent: nothing taken, a wait of their period


async def test_buckets_of_a_rate_as_low_as_the_sql_takes_keep_their_times_in_range(
    database_url: str,
) -> None:
    """A rate lower than today's minimum (one allowed once, say) puts a bucket's next full
    time past any timestamp: `full_at` stops in 5138 instead of failing every take."""

    async def scenario(conn: Any) -> list[Any]:
        return [
            await conn.fetchval("SELECT notifier_rate_take(ARRAY['window'], ARRAY[1], "
                                "ARRAY[1e20::float8])"),
            await conn.fetchval("SELECT notifier_rate_admit('refilling', 1, 1e-20, 1)"),
            await conn.fetchval("SELECT min(extract(year FROM full_at)) FROM rate_buckets"),
        ]  # fmt: skip

    taken, admitted, year = await trio.to_thread.run_sync(_run, database_url, scenario)
    assert (taken, admitted) == (0.0, 0.0)
    assert year == 5138


async def test_migrate_raises_a_channel_rate_below_one_an_hour_and_checks_it_from_then_on(
    tmp_path: Path, database_url: str
) -> None:
    tenant = uuid.uuid4()
    slow, fine = uuid.uuid4(), uuid.uuid4()
    add = "INSERT INTO channels (id, tenant_id, type, config, rate_limit_per_second) " \
        "VALUES ($1, $2, 'webhook', '{}', $3)"  # fmt: skip
    await sql(database_url, "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, 'a', 'h')",
              tenant)  # fmt: skip
    with pytest.raises(asyncpg.CheckViolationError):  # a new database refuses it
        await sql(database_url, add, slow, tenant, 1e-20)
    await make_pre_versions_database(database_url)  # a release before versions were kept
    await sql(database_url, "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, 'a', 'h')",
              tenant)  # fmt: skip
    for statement in (  # the check of a database from before the minimum
        "ALTER TABLE channels DROP CONSTRAINT channels_rate_limit_per_second_check",
        "ALTER TABLE channels ADD CONSTRAINT channels_rate_limit_per_second_check"
        " CHECK (rate_limit_per_second IS NULL OR rate_limit_per_second > 0)",
    ):
        await sql(database_url, statement)
    await sql(database_url, add, slow, tenant, 1e-20)
    await sql(database_url, add, fine, tenant, 0.5)
    for _ in range(2):  # and again: nothing changes
        done = notifier("migrate", "--config", str(config_file(tmp_path, database_url)))
        assert done.returncode == 0, done.stderr
        rows = await sql(database_url, "SELECT id, rate_limit_per_second FROM channels")
        rates = {r["id"]: r["rate_limit_per_second"] for r in rows}
        assert rates == {slow: 1 / 3600, fine: 0.5}
        with pytest.raises(asyncpg.CheckViolationError):
            await sql(database_url, add, uuid.uuid4(), tenant, 1 / 3601)
    await sql(database_url, add, uuid.uuid4(), tenant, 1 / 3600)  # the minimum itself is fine
