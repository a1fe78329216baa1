"""notifier's benchmark: throughput of each stage and of the whole pipeline, on this machine.

Runs notifier as a separate process (``notifier run --role …``) against a scratch database and
RabbitMQ vhost, drives it from this process (HTTP load generator and webhook sink on trio), and
prints one line per stage. Everything stays on 127.0.0.1 and is bounded in count.

    python bench/bench.py [--events 3000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import trio

from notifier.ingest.tenants import hash_api_key
from notifier.store.pg import SCHEMA_PATH
from notifier.testing import open_sink

PG = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432")
AMQP = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
NAME = f"notifier_bench_{os.getpid()}"


def pg(sql: str, db: str = "postgres") -> list[Any]:
    async def run() -> list[Any]:
        conn = await asyncpg.connect(f"{PG}/{db}")
        try:
            if sql.lstrip().upper().startswith("SELECT"):
                return list(await conn.fetch(sql))
            await conn.execute(sql)  # may hold several statements (the schema)
            return []
        finally:
            await conn.close()

    return asyncio.run(run())


async def apg(sql: str) -> list[Any]:
    return await trio.to_thread.run_sync(pg, sql, NAME)


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


def write_config(path: Path, port: int, concurrency: int) -> None:
    path.write_text(f"""
[service]
shutdown_grace_seconds = 5
[database]
url = "{PG}/{NAME}"
pool_max_size = 20
[broker]
url = "{AMQP}/{NAME}"
[ingest]
bind = "127.0.0.1:{port}"
[relay]
batch_size = 500
poll_interval_seconds = 0.5
[workers.webhook]
concurrency = {concurrency}
prefetch = {concurrency * 4}
allow_private_networks = true
""")


class Notifier:
    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.proc: trio.Process | None = None

    async def start(self, roles: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
        env["NOTIFIER_LOG_LEVEL"] = "WARNING"
        with self.log.open("ab") as out:
            self.proc = await trio.lowlevel.open_process(
                [
                    sys.executable,
                    "-m",
                    "notifier",
                    "run",
                    "--role",
                    roles,
                    "--config",
                    str(self.config),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    async def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            code = await self.proc.wait()
        if code != 0:
            raise SystemExit(f"notifier exited {code}; see {self.log}")


async def until(check: Callable[[], Awaitable[bool]], limit_seconds: float = 300) -> None:
    with trio.fail_after(limit_seconds):
        while not await check():  # noqa: ASYNC110 - external state: poll it
            await trio.sleep(0.02)


async def wait_http(base: str) -> None:
    async with httpx.AsyncClient(base_url=base) as client:

        async def up() -> bool:
            try:
                return (await client.get("/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await until(up, 30)


def report(stage: str, count: int, seconds: float, unit: str) -> None:
    print(
        f"{stage:<44} {count:>6} {unit:<10} {seconds:7.2f} s {count / seconds:9.0f} {unit}/s",
        flush=True,
    )


async def post_events(base: str, key: str, total: int, concurrency: int, batch: int) -> None:
    """``total`` events from ``concurrency`` clients, ``batch`` events per request."""
    headers = {"Authorization": f"Bearer {key}"}
    requests = total // batch
    counter = iter(range(requests))

    async def client() -> None:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as api:
            for i in counter:
                if batch == 1:
                    r = await api.post("/v1/events", json={"type": "bench.x", "payload": {"i": i}})
                else:
                    events = [
                        {"type": "bench.x", "payload": {"i": i, "j": j}} for j in range(batch)
                    ]
                    r = await api.post("/v1/events/batch", json={"events": events})
                if r.status_code != 202:
                    raise SystemExit(f"ingest answered {r.status_code}: {r.text}")

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(client)


async def count(sql: str) -> int:
    return int((await apg(sql))[0][0])


async def bench(events: int, concurrency: int, workers: int) -> None:
    port = 18080 + os.getpid() % 1000
    base = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="notifier-bench-"))
    config, log = tmp / "notifier.toml", tmp / "notifier.log"
    write_config(config, port, workers)
    notifier = Notifier(config, log)
    key = f"nk_bench_{uuid.uuid4().hex}"
    await apg(
        f"INSERT INTO tenants (id, name, api_key_hash) VALUES "
        f"('{uuid.uuid4()}', 'bench', '{hash_api_key(key)}')"
    )

    async with open_sink() as sink:
        await apg(
            "INSERT INTO channels (id, tenant_id, type, config) SELECT "
            f"'{uuid.uuid4()}', id, 'webhook', '{{\"url\": \"{sink.url}\"}}' FROM tenants"
        )
        print(
            f"notifier benchmark: {events} events, {concurrency} HTTP clients, "
            f"{workers} webhook workers; log {log}\n",
            flush=True,
        )

        # 1. ingest alone: HTTP → one transaction per event (then per 100-event batch)
        await notifier.start("ingest")
        await wait_http(base)
        t0 = time.perf_counter()
        await post_events(base, key, events, concurrency, batch=1)
        report("ingest, POST /v1/events", events, time.perf_counter() - t0, "events")
        t0 = time.perf_counter()
        await post_events(base, key, events, max(1, concurrency // 4), batch=100)
        report(
            "ingest, POST /v1/events/batch (100 each)", events, time.perf_counter() - t0, "events"
        )
        await notifier.stop()
        rows = await count("SELECT count(*) FROM outbox")

        # 2. relay alone: the outbox → RabbitMQ, confirmed, rows deleted
        t0 = time.perf_counter()
        await notifier.start("relay")
        await until(lambda: _zero("SELECT count(*) FROM outbox"))
        report("relay, outbox → RabbitMQ (incl. start-up)", rows, time.perf_counter() - t0, "rows")
        await notifier.stop()

        # 3. workers alone: queue → webhook sink → DELIVERED
        t0 = time.perf_counter()
        await notifier.start("workers")
        await until(lambda: _zero("SELECT count(*) FROM deliveries WHERE status <> 'DELIVERED'"))
        report(
            "workers, queue → webhook (incl. start-up)",
            rows,
            time.perf_counter() - t0,
            "deliveries",
        )
        await notifier.stop()

        # 4. the whole pipeline in one process, from the first POST to the last DELIVERED
        await notifier.start("ingest,relay,workers")
        await wait_http(base)
        before = await count("SELECT count(*) FROM deliveries")
        t0 = time.perf_counter()
        await post_events(base, key, events, concurrency, batch=1)
        ingested = time.perf_counter() - t0
        await until(lambda: _zero("SELECT count(*) FROM deliveries WHERE status <> 'DELIVERED'"))
        total = time.perf_counter() - t0
        report("end to end, ingest (while delivering)", events, ingested, "events")
        report("end to end, POST → DELIVERED", events, total, "deliveries")
        await notifier.stop()
        assert await count("SELECT count(*) FROM deliveries") == before + events
    received = len(sink.received)
    print(f"\nsink received {received} webhooks for {before + events} deliveries", flush=True)


async def _zero(sql: str) -> bool:
    return await count(sql) == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16, help="HTTP clients")
    parser.add_argument("--workers", type=int, default=16, help="webhook worker tasks")
    args = parser.parse_args()
    pg(f'DROP DATABASE IF EXISTS "{NAME}"')
    pg(f'CREATE DATABASE "{NAME}"')
    rabbitmqctl("add_vhost", NAME)
    rabbitmqctl("set_permissions", "-p", NAME, "guest", ".*", ".*", ".*")
    try:
        pg(SCHEMA_PATH.read_text(), NAME)
        trio.run(bench, args.events, args.concurrency, args.workers)
    finally:
        pg(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)')
        rabbitmqctl("delete_vhost", NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
