"""Integration fixtures: a fresh Postgres database (from a migrated template) and a fresh
RabbitMQ vhost per test, both removed afterwards; an in-process notifier and an API client."""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest
import standardwebhooks
import trio

from notifier import service
from notifier.config import Config, parse_config
from notifier.ingest.tenants import hash_api_key
from notifier.lifecycle import Stop
from notifier.store.versions import MIGRATIONS, apply_missing
from notifier.testing import Received

PG_ADMIN = os.environ.get("TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_BASE = PG_ADMIN.rsplit("/", 1)[0]
AMQP_BASE = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
TEMPLATE = f"notifier_test_tmpl_{os.getpid()}"

pytestmark = pytest.mark.integration


def _pg(sql: str, url: str = PG_ADMIN) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def migrate(url: str) -> None:
    """Apply every migration to the database ``url``, as ``notifier migrate`` does."""

    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            await apply_missing(conn)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    # Unique per instance: another test directory's conftest may import this fixture, and
    # pytest then makes one instance of it there too.
    name = f"{TEMPLATE}_{uuid.uuid4().hex[:6]}"
    _pg(f'CREATE DATABASE "{name}"')
    migrate(f"{PG_BASE}/{name}")
    yield name
    _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(pg_template: str) -> Iterator[str]:
    name = f"notifier_test_{uuid.uuid4().hex[:12]}"
    _pg(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield f"{PG_BASE}/{name}"
    _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(
        ["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True, timeout=60
    ).stdout


@pytest.fixture
def vhost() -> Iterator[str]:
    name = f"notifier_test_{uuid.uuid4().hex[:12]}"
    rabbitmqctl("add_vhost", name)
    rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    yield name
    rabbitmqctl("delete_vhost", name)


@pytest.fixture
def broker_url(vhost: str) -> str:
    return f"{AMQP_BASE}/{vhost}"


def queue_depths(vhost: str) -> dict[str, int]:
    out = rabbitmqctl("list_queues", "-p", vhost, "name", "messages", "--no-table-headers")
    depths = {}
    for line in out.splitlines():
        if line.strip():
            name, count = line.split()
            depths[name] = int(count)
    return depths


def make_config(database_url: str, broker_url: str, **overrides: Any) -> Config:
    data: dict[str, Any] = {
        "service": {"shutdown_grace_seconds": 5},
        "database": {"url": database_url, "pool_max_size": 10},
        "broker": {"url": broker_url},
        "ingest": {"bind": "127.0.0.1:0"},
        "relay": {"poll_interval_seconds": 0.5},
        "workers": {"webhook": {"concurrency": 4, "prefetch": 8, "allow_private_networks": True}},
    }
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    return parse_config(data, env={})


@pytest.fixture
def config(database_url: str, broker_url: str) -> Config:
    return make_config(database_url, broker_url)


async def sql(url: str, query: str, *args: Any) -> list[Any]:
    """Run a query on a thread of its own (plain asyncio, no bridge) and return the rows."""

    async def run() -> list[Any]:
        conn = await asyncpg.connect(url)
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return await trio.to_thread.run_sync(asyncio.run, run())


async def make_pre_versions_database(url: str) -> None:
    """Turn the database at ``url`` into one of a release from before schema versions were
    recorded: what migrations/0001_initial.sql makes, nothing else (no schema_migrations)."""
    for statement in ("DROP SCHEMA public CASCADE", "CREATE SCHEMA public", MIGRATIONS[0].sql):
        await trio.to_thread.run_sync(_pg, statement, url)


async def poll(check: Callable[[], Awaitable[bool]], *, interval_seconds: float = 0.05) -> None:
    """Wait until ``check()`` is true. For state outside this process (Postgres, RabbitMQ),
    which has no trio event to wait on; callers bound it with ``trio.fail_after``."""
    while not await check():  # noqa: ASYNC110
        await trio.sleep(interval_seconds)


async def scalar(url: str, query: str, *args: Any) -> Any:
    return (await sql(url, query, *args))[0][0]


async def delivery(url: str, delivery_id: str) -> dict[str, Any]:
    """A delivery's ``status``, ``attempt`` and ``last_error``."""
    (row,) = await sql(
        url, "SELECT status, attempt, last_error FROM deliveries WHERE id = $1",
        uuid.UUID(delivery_id),
    )  # fmt: skip
    return dict(row)


async def outcomes(url: str, delivery_id: str) -> list[tuple[int, str]]:
    """A delivery's attempt rows as ``(attempt, outcome)``, in order."""
    rows = await sql(
        url, "SELECT attempt, outcome FROM delivery_attempts WHERE delivery_id = $1 ORDER BY id",
        uuid.UUID(delivery_id),
    )  # fmt: skip
    return [(r["attempt"], r["outcome"]) for r in rows]


async def wait_status(url: str, delivery_id: str, *statuses: str) -> None:
    """Wait until the delivery has one of ``statuses`` (bound it with ``trio.fail_after``)."""

    async def reached() -> bool:
        return (await delivery(url, delivery_id))["status"] in statuses

    await poll(reached)


async def count_rows(url: str) -> dict[str, int]:
    tables = ["events", "deliveries", "delivery_attempts", "outbox", "channels"]
    rows = await sql(url, " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in tables))
    return {r[0]: r[1] for r in rows}


async def create_tenant(url: str, name: str | None = None) -> str:
    """Create a tenant straight in the database; return its API key."""
    key = f"nk_test_{uuid.uuid4().hex}"
    await sql(
        url,
        "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, $2, $3)",
        uuid.uuid4(),
        name or f"tenant-{uuid.uuid4().hex[:8]}",
        hash_api_key(key),
    )
    return key


def verify(received: Received, secret: str) -> Any:
    """Check a received webhook with the ``standardwebhooks`` package (raises
    ``WebhookVerificationError`` when it does not verify); return the parsed envelope."""
    return standardwebhooks.Webhook(secret).verify(received.body, received.headers)


def verify_all(received: list[Received], secret: str) -> None:
    """Every webhook a receiver got is signed with ``secret``, as a receiver would check it."""
    assert received, "nothing to verify"
    for got in received:
        envelope = verify(got, secret)
        assert set(envelope) == {"type", "timestamp", "data"}, envelope


@dataclass
class Running:
    base_url: str
    stop: Stop

    def client(self, api_key: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=10)


@asynccontextmanager
async def run_notifier(
    config: Config, roles: tuple[str, ...] = service.ROLES, **options: Any
) -> AsyncIterator[Running]:
    """Run notifier in this process; stop it gracefully on exit. ``options`` go to
    ``service.run`` (``adapters=``, ``validators=``, ``reporter=``)."""
    stop = Stop()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            functools.partial(service.run, config, roles, stop=stop, **options)
        )
        base = binds[0] if binds else ""
        yield Running(base, stop)
        stop.set()


async def tls_server(
    context: ssl.SSLContext,
    backend_port: int,
    peers: list[str],
    *,
    task_status: trio.TaskStatus[int],
) -> None:
    """Terminate TLS with ``context`` on 127.0.0.1 and pass the bytes to a plain server; the
    common name of each client certificate presented is appended to ``peers``."""
    listeners = await trio.open_ssl_over_tcp_listeners(
        0, context, host="127.0.0.1", https_compatible=True
    )
    task_status.started(listeners[0].transport_listener.socket.getsockname()[1])

    async def pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
        async for data in source:
            await sink.send_all(data)

    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            await stream.do_handshake()
            cert = stream.getpeercert()
            if cert:
                peers.extend(v for rdn in cert["subject"] for k, v in rdn if k == "commonName")
            plain = await trio.open_tcp_stream("127.0.0.1", backend_port)
            async with stream, plain, trio.open_nursery() as nursery:
                nursery.start_soon(pump, plain, stream)
                await pump(stream, plain)
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # a failed handshake: the certificate refused, one way or the other

    await trio.serve_listeners(handle, listeners)
