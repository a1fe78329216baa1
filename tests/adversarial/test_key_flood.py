"""A flood of made-up API keys against the real service and Postgres: 20,000 requests on 16
connections while one tenant sends 500 events. Every event of the tenant is stored (202), and
the flood costs Postgres little: the test database's committed transactions
(``pg_stat_database.xact_commit``) during it stay far below the number of requests, where
every made-up key used to cost one lookup.

Two floods, so that each defence is seen on its own: keys repeated from a pool with the limit
of 401s per address off (the memory of unknown keys), and keys never repeated from one address
with the limit on (the limit; the tenant sends from the same address)."""

from __future__ import annotations

import secrets
import uuid
from collections import Counter
from collections.abc import Callable

import httpx
import pytest
import trio

from notifier.config import Config
from tests.integration.conftest import create_tenant, make_config, poll, run_notifier, scalar

pytestmark = pytest.mark.integration

REQUESTS = 20_000
CONNECTIONS = 16
TENANT_EVENTS = 500
# Requests on one connection before the flood opens another: below the server's keep-alive
# bound (hypercorn's keep_alive_max_requests, 1000), which would close it between two requests.
REQUESTS_PER_CONNECTION = 500
# What the flood may cost at most: the tenant's events and lookups, the unknown keys looked up
# once each (or the limit's burst and rate over the flood), start and stop. Without the
# defences it is one transaction per request at least (over 20,000).
MAX_TRANSACTIONS = 5_000


class Flooder:
    """HTTP/1.1 over plain trio sockets (a client far cheaper than the server, so the server is
    what the flood measures): each connection sends a request, reads its answer, sends the next."""

    def __init__(self, base_url: str, keys: Callable[[], str], address: str) -> None:
        host, port = base_url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.keys, self.address = keys, address
        self.statuses: Counter[int] = Counter()
        self.codes: Counter[str] = Counter()
        self.retry_after: set[str] = set()

    async def run(self, requests: int, connections: int) -> None:
        share = [requests // connections + (n < requests % connections) for n in range(connections)]
        async with trio.open_nursery() as nursery:
            for count in share:
                nursery.start_soon(self._connection, count)

    async def _connection(self, count: int) -> None:
        while count > 0:
            sent = min(count, REQUESTS_PER_CONNECTION)
            await self._requests(sent)
            count -= sent

    async def _requests(self, count: int) -> None:
        stream = await trio.open_tcp_stream(self.host, self.port, local_address=self.address)
        async with stream:
            buffer = bytearray()
            for _ in range(count):
                await stream.send_all(
                    f"GET /v1/channels HTTP/1.1\r\nHost: {self.host}\r\n"
                    f"Authorization: Bearer {self.keys()}\r\n\r\n".encode()
                )
                while b"\r\n\r\n" not in buffer:
                    buffer += await self._receive(stream)
                head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = dict(line.lower().split(": ", 1) for line in lines[1:])
                length = int(headers["content-length"])
                while len(rest) < length:
                    rest += await self._receive(stream)
                body, buffer = rest[:length], bytearray(rest[length:])
                status = int(lines[0].split()[1])
                self.statuses[status] += 1
                self.codes[httpx.Response(status, content=body).json()["error"]["code"]] += 1
                if "retry-after" in headers:
                    self.retry_after.add(headers["retry-after"])

    @staticmethod
    async def _receive(stream: trio.SocketStream) -> bytes:
        data = await stream.receive_some(65536)
        assert data, "the server closed a flood connection"
        return data


async def transactions(url: str) -> int:
    """The database's committed transactions, once every other session has ended (a session
    reports its counts when it ends at the latest)."""

    async def alone() -> bool:
        return not await scalar(
            url, "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )  # fmt: skip

    await poll(alone)
    return int(await scalar(
        url, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ))  # fmt: skip


async def flood_beside_a_tenant(
    config: Config, keys: Callable[[], str]
) -> tuple[Flooder, list[int], int]:
    """Run notifier (ingest); send one tenant's events from 127.0.0.1 while the flood comes from
    the same address; the flood, the tenant's statuses and the transactions it all cost."""
    url = config.database.url
    key = await create_tenant(url)
    with trio.fail_after(300):
        before = await transactions(url)
        statuses: list[int] = []
        async with run_notifier(config, ("ingest",)) as running:
            flooder = Flooder(running.base_url, keys, "127.0.0.1")
            async with running.client(key) as tenant:

                async def send(n: int) -> None:
                    resp = await tenant.post("/v1/events", json={
                        "type": "flood.survived", "payload": {"n": n}})  # fmt: skip
                    statuses.append(resp.status_code)

                await send(0)  # the tenant was here before the flood

                async def events() -> None:
                    for n in range(1, TENANT_EVENTS):
                        await send(n)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(flooder.run, REQUESTS, CONNECTIONS)
                    nursery.start_soon(events)
        after = await transactions(url)
    events_stored = await scalar(url, "SELECT count(*) FROM events")
    assert events_stored == TENANT_EVENTS
    return flooder, statuses, after - before


async def test_a_flood_of_repeated_unknown_keys_costs_one_lookup_per_key(
    database_url: str, broker_url: str
) -> None:
    config = make_config(
        database_url, broker_url, ingest={"unauthorized_per_address_per_second": 0}
    )
    pool = [f"nk_{uuid.uuid4().hex}" for _ in range(1_000)]
    flooder, statuses, cost = await flood_beside_a_tenant(config, lambda: secrets.choice(pool))
    assert statuses == [202] * TENANT_EVENTS
    assert flooder.statuses == {401: REQUESTS}
    assert cost < MAX_TRANSACTIONS, f"{cost} transactions for {REQUESTS} requests"


async def test_a_flood_of_distinct_unknown_keys_is_limited_per_address(
    database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url)  # 10 a second, bursts of 100
    assert (config.ingest.unauthorized_per_address_per_second,
            config.ingest.unauthorized_burst) == (10, 100)  # fmt: skip
    flooder, statuses, cost = await flood_beside_a_tenant(
        config, lambda: f"nk_{secrets.token_hex(16)}"
    )
    assert statuses == [202] * TENANT_EVENTS
    assert set(flooder.statuses) == {401, 429}
    assert flooder.statuses[429] > REQUESTS * 0.8
    assert flooder.codes["too_many_unauthorized"] == flooder.statuses[429]
    assert flooder.retry_after
    assert all(int(s) >= 1 for s in flooder.retry_after)
    assert cost < MAX_TRANSACTIONS, f"{cost} transactions for {REQUESTS} requests"
