"""The CLI as an operator runs it: `python -m notifier …` in a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest
import trio

from notifier import __version__
from notifier.broker import amqp
from notifier.broker.topology import build_topology
from notifier.config import parse_config
from notifier.errors import StoreError
from notifier.ingest.events import new_event
from notifier.ingest.models import EventIn
from notifier.ingest.tenants import TENANT_CACHE_SECONDS
from notifier.store import open_store
from notifier.store.errors import TenantExists
from notifier.store.versions import LATEST
from tests.integration.conftest import (
    PG_ADMIN,
    PG_BASE,
    _pg,
    make_config,
    poll,
    run_notifier,
    sql,
)


def notifier(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    return subprocess.run(
        [sys.executable, "-m", "notifier", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=base | (env or {}),
    )


def config_file(tmp_path: Path, database_url: str) -> Path:
    path = tmp_path / "notifier.toml"
    path.write_text(f'[database]\nurl = "{database_url}"\n')
    return path


async def test_migrate_is_idempotent_and_creates_every_table(tmp_path: Path) -> None:
    name = f"notifier_cli_{os.getpid()}"
    base = PG_ADMIN.rsplit("/", 1)[0]
    await sql(PG_ADMIN, f'DROP DATABASE IF EXISTS "{name}"')
    await sql(PG_ADMIN, f'CREATE DATABASE "{name}"')
    try:
        cfg = config_file(tmp_path, f"{base}/{name}")
        first = notifier("migrate", "--config", str(cfg))
        second = notifier("migrate", "--config", str(cfg))
        assert first.returncode == 0, first.stderr
        assert second.returncode == 0, second.stderr
        tables = {
            r[0]
            for r in await sql(
                f"{base}/{name}",
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND NOT tablename ~ '_p[0-9]{8}$'",
            )
        }
        assert tables == {
            "tenants", "channels", "events", "event_keys", "deliveries", "delivery_attempts",
            "outbox", "rate_buckets", "schema_migrations", "circuits", "console_sessions",
            "console_signin_failures", "event_types", "fifo_counters",
            "portal_links", "portal_sessions",
        }  # fmt: skip
        # The history's partitions: today's and 7 days ahead, of each of its three tables.
        days = await sql(
            f"{base}/{name}",
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'events'::regclass",
        )
        assert days[0][0] == 8
        assert "applied 0001_initial" in first.stdout
        assert "applied" not in second.stdout
        assert f"schema version {LATEST} (current)" in second.stdout
        indexes = {
            r[0]
            for r in await sql(
                f"{base}/{name}",
                "SELECT indexname FROM pg_indexes WHERE tablename = 'outbox' "
                "AND indexdef LIKE '%WHERE%'",
            )
        }
        assert "outbox_fresh_idx" in indexes  # the partial index behind the claim
    finally:
        await sql(PG_ADMIN, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_tenant_create_prints_the_key_once_and_stores_only_its_hash(
    tmp_path: Path, database_url: str
) -> None:
    cfg = config_file(tmp_path, database_url)
    done = notifier("tenant", "create", "acme", "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) == {"id", "name", "api_key"}
    assert out["name"] == "acme"
    rows = await sql(database_url, "SELECT id::text, api_key_hash FROM tenants WHERE name = 'acme'")
    assert rows[0][0] == out["id"]
    assert rows[0][1] == hashlib.sha256(out["api_key"].encode()).hexdigest()
    dump = await sql(database_url, "SELECT row_to_json(t)::text FROM tenants t")
    assert out["api_key"] not in dump[0][0]

    again = notifier("tenant", "create", "acme", "--config", str(cfg))
    assert again.returncode == 2
    assert "a tenant named 'acme' already exists" in again.stderr


async def test_only_a_taken_name_is_tenant_exists(database_url: str) -> None:
    """What ``tenant create`` reports as "already exists" is the store's ``TenantExists``,
    raised for the name's unique constraint only: another unique violation (an API key hash
    that is taken) stays a plain store error."""
    with trio.fail_after(30):
        async with open_store(database_url, max_size=2) as store:
            await store.create_tenant("acme", "hash-1")
            with pytest.raises(TenantExists) as taken:
                await store.create_tenant("acme", "hash-2")
            assert taken.value.name == "acme"
            assert str(taken.value) == "a tenant named 'acme' already exists"
            with pytest.raises(StoreError) as other:
                await store.create_tenant("other", "hash-1")
            assert not isinstance(other.value, TenantExists)


def test_config_errors_exit_2_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[workers.webhook]\nconcurrency = 'many'\n")
    done = notifier("migrate", "--config", str(bad))
    assert done.returncode == 2
    assert "workers.webhook.concurrency" in done.stderr

    via_env = notifier("migrate", env={"NOTIFIER_CONFIG": str(bad)})
    assert via_env.returncode == 2
    assert "workers.webhook.concurrency" in via_env.stderr


def test_bad_usage_exits_2() -> None:
    assert notifier("frobnicate").returncode == 2
    assert notifier("run", "--role", "ingest,bogus").returncode == 2


def test_unreachable_database_exits_1(tmp_path: Path) -> None:
    cfg = config_file(tmp_path, "postgresql://postgres@127.0.0.1:1/nowhere")
    done = notifier("migrate", "--config", str(cfg))
    assert done.returncode == 1
    assert "Postgres" in done.stderr


def test_version() -> None:
    done = notifier("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"notifier {__version__}")


@pytest.fixture
def unmigrated_url() -> Iterator[str]:
    name = f"notifier_cli_empty_{uuid.uuid4().hex[:12]}"
    _pg(f'CREATE DATABASE "{name}"')
    yield f"{PG_BASE}/{name}"
    _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_run_refuses_a_database_that_was_never_migrated(
    tmp_path: Path, unmigrated_url: str
) -> None:
    cfg = config_file(tmp_path, unmigrated_url)
    for extra in ([], ["--processes", "2"]):
        done = notifier("run", "--config", str(cfg), *extra)
        assert done.returncode == 2, done.stderr
        # once, from the process that was started (a launch's parent checks before any child)
        assert done.stderr.count("run `notifier migrate`") == 1, done.stderr
        assert "notifier running" not in done.stderr


def test_run_refuses_an_older_schema(tmp_path: Path, database_url: str) -> None:
    _pg(f"DELETE FROM schema_migrations WHERE version = {LATEST}", database_url)
    done = notifier("run", "--config", str(config_file(tmp_path, database_url)))
    assert done.returncode == 2
    assert f"older than this code's {LATEST}" in done.stderr
    assert "run `notifier migrate`" in done.stderr


def check_config(tmp_path: Path, database_url: str, broker_urls: list[str]) -> Path:
    path = tmp_path / "check.toml"
    urls = ", ".join(f'"{u}"' for u in broker_urls)
    path.write_text(
        f'[database]\nurl = "{database_url}"\n[broker]\nurl = [{urls}]\n'
        "[workers.webhook]\nconcurrency = 1\n"
    )
    return path


async def test_check_reports_each_check_and_exits_1_until_all_pass(
    tmp_path: Path, database_url: str, unmigrated_url: str, broker_url: str
) -> None:
    cfg = check_config(tmp_path, database_url, [broker_url])
    first = await trio.to_thread.run_sync(notifier, "check", "--config", str(cfg))
    assert first.returncode == 1, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    assert "ok database: Postgres answers" in lines
    assert f"ok schema: schema version {LATEST} (current)" in lines
    (broker,) = [line for line in lines if line.startswith("FAIL broker")]
    # 15 for the work queue, its tiers and DLQ; 20 for FIFO channels' (8 partitions, 10 tiers)
    assert "0/35 exchanges and queues declared; missing exchange deliveries," in broker
    assert "queue deliveries.webhook," in broker

    config = parse_config(tomllib.loads(cfg.read_text()), env={})
    with trio.fail_after(30):
        async with amqp.open_connection(broker_url, name="test") as conn:
            await conn.declare(build_topology(["webhook"], config.retry.tiers_seconds,
                                              config.broker.queue_type,
                                              config.broker.fifo_partitions))  # fmt: skip
    passing = await trio.to_thread.run_sync(notifier, "check", "--config", str(cfg))
    assert passing.returncode == 0, passing.stdout
    assert all(line.startswith("ok ") for line in passing.stdout.splitlines())

    # an unmigrated database, a cluster node that does not answer: a FAIL line each, and no
    # password anywhere
    secret = "s3cret-pw"
    dead = f"amqp://guest:{secret}@127.0.0.1:1/"
    cfg = check_config(tmp_path, unmigrated_url, [broker_url, dead])
    failing = await trio.to_thread.run_sync(notifier, "check", "--config", str(cfg))
    assert failing.returncode == 1
    out = failing.stdout.splitlines()
    assert any(line.startswith("FAIL schema:") and "notifier migrate" in line for line in out)
    assert any(line.startswith("FAIL broker 127.0.0.1:1/") for line in out), out
    assert secret not in failing.stdout + failing.stderr


def test_check_exits_2_on_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[database]\npool_max_size = 'x'\n")
    done = notifier("check", "--config", str(bad))
    assert done.returncode == 2
    assert "database.pool_max_size" in done.stderr


def test_tenant_names_are_validated(tmp_path: Path, database_url: str) -> None:
    cfg = str(config_file(tmp_path, database_url))
    # (the rule itself: tests/unit/test_schema_versions.py)
    done = notifier("tenant", "create", "a b", "--config", cfg)
    assert done.returncode == 2
    assert "invalid tenant name 'a b'" in done.stderr
    assert notifier("tenant", "create", "Acme-1_a.b", "--config", cfg).returncode == 0
    unknown = notifier("tenant", "disable", "nobody", "--config", cfg)
    assert unknown.returncode == 2
    assert "no tenant named 'nobody'" in unknown.stderr


async def test_rotate_disable_and_enable_a_tenant(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    cfg = str(config_file(tmp_path, database_url))

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = await trio.to_thread.run_sync(lambda: notifier(*args, "--config", cfg))
        assert done.returncode == 0, done.stderr
        return done

    first_key = json.loads((await cli("tenant", "create", "acme")).stdout)["api_key"]
    await cli("tenant", "create", "other")
    listed = [json.loads(line) for line in (await cli("tenant", "list")).stdout.splitlines()]
    assert [(t["name"], t["enabled"]) for t in listed] == [("acme", True), ("other", True)]
    assert all(set(t) == {"name", "id", "created_at", "enabled"} for t in listed)

    config = make_config(database_url, broker_url)
    async with run_notifier(config, ("ingest",)) as running:

        async def status(key: str) -> int:
            async with running.client(key) as client:
                return (await client.get("/v1/channels")).status_code

        async def refused(key: str) -> None:
            """401 for ``key`` within the tenant cache's bound (it was just admitted)."""
            started = trio.current_time()
            with trio.fail_after(TENANT_CACHE_SECONDS + 5):
                await poll(lambda: _is(status(key), 401), interval_seconds=0.2)
            assert trio.current_time() - started <= TENANT_CACHE_SECONDS + 1

        assert await status(first_key) == 200
        rotated = json.loads((await cli("tenant", "rotate-key", "acme")).stdout)
        assert set(rotated) == {"name", "api_key"}
        second_key = rotated["api_key"]
        assert await status(second_key) == 200  # the new key works at once
        await refused(first_key)

        await cli("tenant", "disable", "acme")
        # its events fan out to no channel at once, whatever an ingest process cached
        (tenant_id,) = [t["id"] for t in listed if t["name"] == "acme"]
        await sql(
            database_url,
            "INSERT INTO channels (id, tenant_id, type, config) "
            "VALUES (gen_random_uuid(), $1, 'webhook', '{}'::jsonb)",
            uuid.UUID(tenant_id),
        )
        async with open_store(database_url, max_size=2) as store:
            event = new_event(EventIn(type="order.created", payload={}), None)
            (stored,) = await store.ingest(uuid.UUID(tenant_id), [event], {})
            assert stored.event.deliveries == []
            # AMQP ingest finds no disabled tenant: its messages are dead-lettered
            assert set(await store.tenant_ids_by_names(["acme", "other"])) == {"other"}
            await refused(second_key)
            await cli("tenant", "enable", "acme")
            assert await status(second_key) == 200
            later = new_event(EventIn(type="order.created", payload={}), None)
            (again,) = await store.ingest(uuid.UUID(tenant_id), [later], {})
            assert len(again.event.deliveries) == 1


async def _is(status: Awaitable[int], wanted: int) -> bool:
    return await status == wanted


# -- tenant expunge -----------------------------------------------------------------------------


async def add_event(url: str, tenant_id: uuid.UUID, created_at: str, *statuses: str) -> uuid.UUID:
    """An event created at ``created_at`` with one delivery in each of ``statuses``, each with
    an attempt that kept the receiver's answer."""
    event_id = uuid.uuid4()
    await sql(
        url,
        "SELECT notifier_partitions_ensure(d, d) FROM (SELECT "
        "($1::text::timestamptz AT TIME ZONE 'UTC')::date AS d) AS day",
        created_at,
    )
    await sql(
        url,
        """INSERT INTO events (id, tenant_id, type, payload, created_at)
           VALUES ($1, $2, 'order.created', '{"email": "ada@example.com"}',
                   $3::text::timestamptz)""",
        event_id, tenant_id, created_at,
    )  # fmt: skip
    for status in statuses:
        delivery_id = uuid.uuid4()
        await sql(
            url,
            """INSERT INTO deliveries (id, event_id, channel_id, tenant_id, channel_type, status,
                                       attempt, max_attempts, created_at)
               VALUES ($1, $2, gen_random_uuid(), $3, 'webhook', $4, 1, 5,
                       $5::text::timestamptz)""",
            delivery_id, event_id, tenant_id, status, created_at,
        )  # fmt: skip
        await sql(
            url,
            """INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms,
                                              outcome, status_code, response_excerpt,
                                              delivery_created_at)
               SELECT $1, 1, now(), 5, 'delivered', 200, 'thanks, ada', created_at
               FROM deliveries WHERE id = $1""",
            delivery_id,
        )
    return event_id


async def test_tenant_expunge_takes_the_events_before_the_date_in_batches(
    tmp_path: Path, database_url: str
) -> None:
    cfg = str(config_file(tmp_path, database_url))

    async def cli(*args: str) -> dict[str, object] | None:
        """The command's JSON answer (None for a line of text)."""
        done = await trio.to_thread.run_sync(lambda: notifier(*args, "--config", cfg))
        assert done.returncode == 0, done.stderr
        answer: dict[str, object] | None = (
            json.loads(done.stdout) if done.stdout.startswith("{") else None
        )
        return answer

    acme, other = [uuid.UUID(str((await cli("tenant", "create", name) or {})["id"]))
                   for name in ("acme", "other")]  # fmt: skip
    # Before 2026-01-02: three finished, one with a delivery in flight; at and after it: not.
    old = [
        await add_event(database_url, acme, "2026-01-01T10:00Z", "DELIVERED", "DEAD"),
        await add_event(database_url, acme, "2026-01-01T11:00Z"),  # no delivery at all
        await add_event(database_url, acme, "2026-01-01T23:59:59.999999Z", "DELIVERED"),
    ]
    busy = await add_event(database_url, acme, "2026-01-01T12:00Z", "DELIVERED", "RETRYING")
    at_the_date = await add_event(database_url, acme, "2026-01-02T00:00Z", "DELIVERED")
    others = await add_event(database_url, other, "2025-12-01T00:00Z", "DELIVERED")
    await cli("tenant", "disable", "acme")  # a disabled tenant's payloads can be expunged too

    async def expunged() -> set[uuid.UUID]:
        rows = await sql(
            database_url,
            "SELECT id FROM events "
            "WHERE payload = 'null'::jsonb AND payload_expunged_at IS NOT NULL",
        )
        return {r[0] for r in rows}

    async def excerpts_left() -> set[uuid.UUID]:
        rows = await sql(
            database_url,
            """SELECT DISTINCT d.event_id FROM delivery_attempts a
               JOIN deliveries d ON d.id = a.delivery_id WHERE a.response_excerpt IS NOT NULL""",
        )
        return {r[0] for r in rows}

    counts = "SELECT (SELECT count(*) FROM deliveries), (SELECT count(*) FROM delivery_attempts)"
    rows_before = list((await sql(database_url, counts))[0])
    # An offset is taken: this is 2026-01-02T00:00 UTC. Four events before it, two a batch:
    # two full batches, and a third that finds none left.
    done = await cli(
        "tenant", "expunge", "acme", "--before", "2026-01-02T01:00:00+01:00", "--batch-size", "2"
    )
    assert done == {"name": "acme", "before": "2026-01-02T00:00:00+00:00", "expunged": 3,
                    "skipped_in_flight": 1, "batches": 3}  # fmt: skip
    assert await expunged() == set(old)
    assert await excerpts_left() == {busy, at_the_date, others}
    assert list((await sql(database_url, counts))[0]) == rows_before, "the history stays"

    # Again, with a plain date: only the one in flight is left, and it still is.
    again = await cli("tenant", "expunge", "acme", "--before", "2026-01-02")
    assert again == {"name": "acme", "before": "2026-01-02T00:00:00+00:00", "expunged": 0,
                     "skipped_in_flight": 1, "batches": 1}  # fmt: skip
    assert await expunged() == set(old)


def test_tenant_expunge_refuses_a_bad_date_or_an_unknown_tenant(
    tmp_path: Path, database_url: str
) -> None:
    cfg = str(config_file(tmp_path, database_url))
    for value in ["yesterday", "2026-13-01", "2026-01-01T25:00", ""]:
        bad = notifier("tenant", "expunge", "acme", "--before", value, "--config", cfg)
        assert bad.returncode == 2, value
        assert "argument --before: not an ISO date or date and time" in bad.stderr, bad.stderr
    missing = notifier("tenant", "expunge", "acme", "--config", cfg)
    assert missing.returncode == 2
    assert "--before" in missing.stderr
    small = notifier("tenant", "expunge", "acme", "--before", "2026-01-01", "--batch-size", "0",
                     "--config", cfg)  # fmt: skip
    assert small.returncode == 2
    assert "argument --batch-size" in small.stderr
    unknown = notifier("tenant", "expunge", "nobody", "--before", "2026-01-01", "--config", cfg)
    assert unknown.returncode == 2
    assert "no tenant named 'nobody'" in unknown.stderr
