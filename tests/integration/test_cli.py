"""The CLI as an operator runs it: `python -m notifier …` in a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from notifier.errors import StoreError
from notifier.store import open_store
from notifier.store.errors import TenantExists
from tests.integration.conftest import PG_ADMIN, sql


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
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'",
            )
        }
        assert tables == {
            "tenants", "channels", "events", "deliveries", "delivery_attempts", "outbox",
            "rate_buckets",
        }  # fmt: skip
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
    assert again.returncode == 1
    assert "already exists" in again.stderr


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
