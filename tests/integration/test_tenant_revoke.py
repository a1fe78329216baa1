"""A rotated or disabled key stops working at once in every ingest process: two ingest
processes (in this process, each with its store, its LISTEN and its caches) whose tenant caches
keep an entry 60 s, so that only the tenants' NOTIFY can explain a refusal within seconds."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
import trio

from notifier import cli
from notifier.ingest.amqp_messages import ERROR_CODE_HEADER
from notifier.ingest.tenants import TenantCaches, hash_api_key
from notifier.store.listen import CATALOGS_CHANNEL
from tests.integration.conftest import Running, make_config, poll, run_notifier, scalar, sql
from tests.integration.test_amqp_ingest import DLQ, Message, event, ingest_config, publish, take_all

TTL = 60.0  # far longer than any wait below
REFUSED_WITHIN = 5.0  # well under the TTL; the notification takes milliseconds


async def tenant_cli(capsys: pytest.CaptureFixture[str], config: Path, *args: str) -> str:
    """``notifier tenant …`` through the CLI's own function (on a thread: it runs trio itself);
    what it printed."""
    capsys.readouterr()
    code = await trio.to_thread.run_sync(cli.main, ["tenant", *args, "--config", str(config)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@asynccontextmanager
async def two_ingest_processes(database_url: str, broker_url: str) -> AsyncIterator[list[Running]]:
    config = make_config(database_url, broker_url)
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                run_notifier(config, ("ingest",), tenant_caches=TenantCaches(ttl_seconds=TTL))
            )
            for _ in range(2)
        ]


async def post(running: Running, key: str) -> int:
    async with running.client(key) as client:
        resp = await client.post("/v1/events", json={"type": "order.created", "payload": {}})
        return resp.status_code


async def refused_everywhere(fleet: list[Running], key: str) -> float:
    """Seconds until ``key`` answers 401 on every process."""
    started = trio.current_time()

    async def refused() -> bool:
        return [await post(r, key) for r in fleet] == [401] * len(fleet)

    with trio.fail_after(REFUSED_WITHIN * 2):
        await poll(refused, interval_seconds=0.02)
    return trio.current_time() - started


def config_file(tmp_path: Path, database_url: str) -> Path:
    path = tmp_path / "notifier.toml"
    path.write_text(f'[database]\nurl = "{database_url}"\n')
    return path


async def test_a_rotated_or_disabled_key_is_refused_at_once_by_every_ingest_process(
    tmp_path: Path, database_url: str, broker_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config_file(tmp_path, database_url)
    old_key = json.loads(await tenant_cli(capsys, cfg, "create", "acme"))["api_key"]
    async with two_ingest_processes(database_url, broker_url) as fleet:
        assert [await post(r, old_key) for r in fleet] == [202, 202]  # cached for 60 s

        new_key = json.loads(await tenant_cli(capsys, cfg, "rotate-key", "acme"))["api_key"]
        assert await refused_everywhere(fleet, old_key) < REFUSED_WITHIN
        assert [await post(r, new_key) for r in fleet] == [202, 202]

        await tenant_cli(capsys, cfg, "disable", "acme")
        assert await refused_everywhere(fleet, new_key) < REFUSED_WITHIN

        await tenant_cli(capsys, cfg, "enable", "acme")
        assert [await post(r, new_key) for r in fleet] == [202, 202]

        # any tool's change counts: the trigger NOTIFYs, not the CLI
        await sql(database_url, "DELETE FROM tenants WHERE name = 'acme'")
        assert await refused_everywhere(fleet, new_key) < REFUSED_WITHIN


async def test_a_key_tried_before_its_tenant_exists_is_taken_at_once_when_it_is_created(
    database_url: str, broker_url: str
) -> None:
    # A key that matched no tenant is remembered as unknown for 30 s; the INSERT's NOTIFY
    # (migrations/0006) forgets it in every process.
    key = f"nk_test_{uuid.uuid4().hex}"
    async with two_ingest_processes(database_url, broker_url) as fleet:
        assert [await post(r, key) for r in fleet] == [401, 401]
        assert [await post(r, key) for r in fleet] == [401, 401]  # remembered: no lookup
        await sql(
            database_url, "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, $2, $3)",
            uuid.uuid4(), "late", hash_api_key(key),
        )  # fmt: skip
        started = trio.current_time()

        async def taken() -> bool:
            return [await post(r, key) for r in fleet] == [202, 202]

        with trio.fail_after(REFUSED_WITHIN * 2):
            await poll(taken, interval_seconds=0.02)
        assert trio.current_time() - started < REFUSED_WITHIN


async def test_a_lost_listen_is_opened_again_and_then_forgets_at_once_again(
    tmp_path: Path, database_url: str, broker_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config_file(tmp_path, database_url)
    key = json.loads(await tenant_cli(capsys, cfg, "create", "acme"))["api_key"]
    listeners = (  # the tenants' and the catalogs' channels, on one connection: LISTENed last
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        f"AND query = 'LISTEN \"{CATALOGS_CHANNEL}\"'"
    )
    async with two_ingest_processes(database_url, broker_url) as fleet:
        pids: set[int] = set()

        async def both_listen_anew() -> bool:
            """One LISTEN connection per process, none of them one seen before."""
            now = {r[0] for r in await sql(database_url, listeners)}
            if len(now) == 2 and not now & pids:
                pids.update(now)
                return True
            return False

        with trio.fail_after(20):
            await poll(both_listen_anew, interval_seconds=0.1)
        assert [await post(r, key) for r in fleet] == [202, 202]
        await sql(
            database_url, "SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid", list(pids)
        )
        with trio.fail_after(20):
            await poll(both_listen_anew, interval_seconds=0.1)  # listening again
        assert [await post(r, key) for r in fleet] == [202, 202]
        await tenant_cli(capsys, cfg, "disable", "acme")
        assert await refused_everywhere(fleet, key) < REFUSED_WITHIN


async def test_amqp_ingest_refuses_a_disabled_tenant_at_once(
    tmp_path: Path, database_url: str, broker_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config_file(tmp_path, database_url)
    await tenant_cli(capsys, cfg, "create", "billing")
    config = ingest_config(database_url, broker_url, batch_linger_seconds=0.01)
    caches = TenantCaches(ttl_seconds=TTL)
    async with run_notifier(config, ("ingest",), tenant_caches=caches):
        await publish(broker_url, [Message(event(1), message_id="before")])

        async def stored() -> bool:
            return bool(await scalar(database_url, "SELECT count(*) FROM events") == 1)

        with trio.fail_after(20):
            await poll(stored)  # "billing" is now cached by name for 60 s
        await tenant_cli(capsys, cfg, "disable", "billing")
        started = trio.current_time()
        with trio.fail_after(REFUSED_WITHIN * 2):
            while True:
                # each message is refused or stored; once refused, the cache knew at once
                await publish(broker_url, [Message(event(2), message_id=str(uuid.uuid4()))])
                with trio.fail_after(10):
                    dead = await _dead_or_stored(broker_url, database_url)
                if dead:
                    break
        assert trio.current_time() - started < REFUSED_WITHIN
        assert dead[0].headers[ERROR_CODE_HEADER] == "unknown_tenant"


async def _dead_or_stored(broker_url: str, database_url: str) -> list[Message]:
    """Wait for the last message published to be dead-lettered (returned) or stored ([])."""
    count = await scalar(database_url, "SELECT count(*) FROM events")
    dead: list[Message] = []

    async def settled() -> bool:
        dead.extend(await take_all(broker_url, DLQ))  # type: ignore[arg-type]
        return bool(dead) or await scalar(database_url, "SELECT count(*) FROM events") > count

    await poll(settled, interval_seconds=0.02)
    return dead
