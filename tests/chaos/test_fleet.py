"""A fleet, proven: notifier as seven separate processes against one database and one vhost —
two ``ingest`` on two ports, two ``relay``, two ``workers`` and one ``maintenance`` — under the
ledger, with one worker process stopped by SIGTERM mid-stream and not restarted.

Every accepted event must be delivered (lost = 0, nothing unexpected), duplicates stay within
``MAX_DUPLICATES``, and each process of a role must have done a share of the work. Who did what
is read from the processes themselves, not assumed:

- ingest: the load alternates between the two ports, and each port's 202s are counted;
- workers: each worker process logs one line per recorded attempt (``delivery <id> attempt <n>:
  delivered``, with ``delivery_id`` and ``outcome`` as JSON fields), into a log of its own;
- relays: RabbitMQ counts the bytes it received on every connection (``recv_oct``); each
  relay's publishing connection (``notifier relay``) is matched to its process by the
  connection's local port among the process's sockets (``/proc/<pid>/fd``, ``/proc/net/tcp``),
  and what it received between start-up and the drain is what that relay published.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import trio

from notifier.testing import open_sink
from tests.chaos.harness import (
    DRAIN_TIMEOUT_SECONDS,
    SECRET,
    ServiceProcess,
    base_config,
    crash_lines,
    drained,
    final_states,
    free_port,
    queues_empty,
    stored_event_ids,
    wait_ready,
    write_config,
)
from tests.chaos.ledger import Ledger, check, send_events
from tests.integration.conftest import create_tenant, poll, rabbitmqctl

# A killed process leaves the load generator's request body unfinished: the same client-side
# artefact as in test_scenarios (the event is sent again with its key).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings(
        "ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning"
    ),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object ByteStream.__aiter__"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
]

EVENTS = 1000
RATE_PER_SECOND = 150.0
PREFETCH = 64
# The stopped worker finishes its deliveries in flight within the grace and hands back what it
# had not started, so a graceful stop should duplicate nothing; the bound allows for the one
# case that can: a delivery the receiver got whose status write did not finish within the grace
# (at most one worker's prefetch).
MAX_DUPLICATES = PREFETCH
# At least this many messages' worth of bytes must have reached RabbitMQ from each relay.
MIN_PUBLISHES_PER_RELAY = 10
MIN_DELIVERIES_PER_WORKER = 10

FLEET = (
    ("ingest-1", "ingest"),
    ("ingest-2", "ingest"),
    ("relay-1", "relay"),
    ("relay-2", "relay"),
    ("workers-1", "workers"),
    ("workers-2", "workers"),
    ("maintenance", "maintenance"),
)


class AlternatingTransport(httpx.AsyncBaseTransport):
    """Sends each request to the next of ``ports`` in turn (on the request's host) and counts,
    per port, the answers 200/202 — the events that ingest process accepted."""

    def __init__(self, ports: Iterable[int]) -> None:
        self._ports = list(ports)
        self._next = 0
        self._inner = httpx.AsyncHTTPTransport()
        self.accepted: dict[int, int] = dict.fromkeys(self._ports, 0)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        port = self._ports[self._next % len(self._ports)]
        self._next += 1
        request.url = request.url.copy_with(port=port)
        response = await self._inner.handle_async_request(request)
        if response.status_code in (200, 202):
            self.accepted[port] += 1
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Member:
    name: str
    role: str
    process: ServiceProcess
    port: int | None = None  # ingest only

    @property
    def pid(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid


@dataclass
class Fleet:
    members: list[Member] = field(default_factory=list)

    def of(self, role: str) -> list[Member]:
        return [m for m in self.members if m.role == role]

    def start(self) -> None:
        for member in self.members:
            member.process.start()

    async def stop(self) -> None:
        """Every process still running gets one SIGTERM, all at once (a second one would stop
        a process at once), then each is awaited; one still running after 15 s is killed."""
        running = [m.process for m in self.members if m.process.exit_code is None]
        for process in running:
            process.signal(signal.SIGTERM)
        for process in running:
            code = await process.wait_exit(15)
            if code is None and process.process is not None:
                process.process.kill()
                code = await process.wait_exit(10)
            process.exit_code = code


def make_fleet(database_url: str, broker_url: str, tmp_path: Path) -> Fleet:
    fleet = Fleet()
    for name, role in FLEET:
        port = free_port() if role == "ingest" else None
        sections = base_config(database_url, broker_url, port or free_port())
        # seven pools against one shared Postgres: a few connections each are plenty here
        sections["database"]["pool_max_size"] = 4
        sections["logging"]["format"] = "json"  # the worker lines are read back as JSON
        config = write_config(tmp_path / f"{name}.toml", sections)
        process = ServiceProcess(config, tmp_path / f"{name}.log", args=("run", "--role", role))
        fleet.members.append(Member(name, role, process, port))
    return fleet


def delivered_by(log: str) -> list[str]:
    """Pure: the delivery ids a worker process recorded as delivered, from its JSON log."""
    ids = []
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("outcome") == "delivered":
            ids.append(str(record["delivery_id"]))
    return ids


def socket_local_ports(pid: int) -> set[int]:
    """The local TCP ports of the sockets process ``pid`` holds open (Linux ``/proc``)."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[9] in inodes:
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def relay_bytes_received(vhost: str, pids: Iterable[int]) -> dict[int, int]:
    """Per relay process: the bytes RabbitMQ has received on its ``notifier relay``
    connections in ``vhost`` (matched by the connection's peer port, the process's local one)."""
    out = rabbitmqctl(
        "list_connections", "--formatter", "json", "vhost", "client_properties", "peer_port",
        "recv_oct",
    )  # fmt: skip
    by_port: dict[int, int] = {}
    for conn in json.loads(out):
        if conn["vhost"] != vhost or _connection_name(conn["client_properties"]) != (
            "notifier relay"
        ):
            continue
        by_port[int(conn["peer_port"])] = int(conn["recv_oct"])
    received = {}
    for pid in pids:
        ports = socket_local_ports(pid)
        received[pid] = sum(n for port, n in by_port.items() if port in ports)
    return received


def _connection_name(properties: object) -> str | None:
    """``connection_name`` from rabbitmqctl's JSON rendering of client properties (a list of
    ``[key, type, value]`` triples, or an object)."""
    if isinstance(properties, dict):
        value = properties.get("connection_name")
        return None if value is None else str(value)
    if isinstance(properties, list):
        for item in properties:
            if isinstance(item, list) and item and item[0] == "connection_name":
                return str(item[-1])
    return None


async def consumers(vhost: str, queue: str) -> int:
    out = await trio.to_thread.run_sync(
        rabbitmqctl, "list_consumers", "-p", vhost, "queue_name", "--no-table-headers"
    )
    return sum(1 for line in out.splitlines() if line.strip() == queue)


async def test_a_fleet_of_processes_delivers_everything_once(
    database_url: str, broker_url: str, vhost: str, tmp_path: Path
) -> None:
    fleet = make_fleet(database_url, broker_url, tmp_path)
    ingest_ports = [m.port for m in fleet.of("ingest") if m.port is not None]
    relays = fleet.of("relay")
    workers = fleet.of("workers")
    stopped = workers[0]
    began = trio.current_time()
    async with open_sink() as sink:
        fleet.start()
        try:
            with trio.fail_after(60):
                for port in ingest_ports:
                    await wait_ready(f"http://127.0.0.1:{port}", timeout_seconds=60)
                # both worker processes consume, both relays have their connection
                await poll(
                    lambda: _consumers_are(vhost, "deliveries.webhook", len(workers)),
                    interval_seconds=0.5,
                )
                await poll(lambda: _relays_connected(vhost, relays), interval_seconds=0.5)
            pids = [m.pid for m in relays]
            bytes_before = await trio.to_thread.run_sync(relay_bytes_received, vhost, pids)
            started = trio.current_time() - began

            key = await create_tenant(database_url, f"fleet-{uuid.uuid4().hex[:8]}")
            transport = AlternatingTransport(ingest_ports)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{ingest_ports[0]}", transport=transport,
                headers={"Authorization": f"Bearer {key}"}, timeout=5,
            ) as api:  # fmt: skip
                resp = await api.post("/v1/channels", json={
                    "type": "webhook", "config": {"url": sink.url, "secret": SECRET}})  # fmt: skip
                assert resp.status_code == 201, resp.text
                ledger = Ledger()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        lambda: send_events(
                            api, ledger, count=EVENTS, rate_per_second=RATE_PER_SECOND
                        )
                    )
                    # mid-stream, once it has delivered a share: SIGTERM one worker process
                    with trio.fail_after(60):
                        await poll(lambda: _stop_point(ledger, stopped), interval_seconds=0.1)
                    share_at_stop = len(delivered_by(stopped.process.log()))
                    assert len(ledger) < EVENTS, "the load ended before the SIGTERM"
                    stopped.process.signal(signal.SIGTERM)
                    stopped.process.exit_code = await stopped.process.wait_exit(30)
                    assert stopped.process.exit_code == 0, stopped.process.log()[-3000:]

            loaded_at = trio.current_time()
            with trio.fail_after(DRAIN_TIMEOUT_SECONDS):
                await poll(lambda: drained(database_url), interval_seconds=0.25)
                await poll(lambda: queues_empty(vhost), interval_seconds=0.25)
            drain_seconds = trio.current_time() - loaded_at
            bytes_after = await trio.to_thread.run_sync(relay_bytes_received, vhost, pids)
            webhook_ids = [r.headers["webhook-id"] for r in sink.received]
            states = await final_states(database_url)
            report = check(ledger, webhook_ids, states, await stored_event_ids(database_url))
        finally:
            with trio.CancelScope(shield=True):
                await fleet.stop()

    logs = {m.name: m.process.log() for m in fleet.members}
    tails = "".join(f"\n--- {name}\n{log[-1500:]}" for name, log in logs.items())
    published = {pid: bytes_after[pid] - bytes_before[pid] for pid in pids}
    per_worker = {m.name: delivered_by(logs[m.name]) for m in workers}
    # RabbitMQ's byte counts, shared out over the messages published: each relay's share
    per_message = sum(published.values()) / report.deliveries
    shares = {pid: round(sent / per_message) for pid, sent in published.items()}
    counts = {name: len(ids) for name, ids in per_worker.items()}
    print(
        f"\nfleet of {len(fleet.members)} processes (started in {started:.1f} s): "
        f"{report.summary()}; drain {drain_seconds:.1f} s; "
        f"ingest 202s per port {transport.accepted}; deliveries per worker {counts} "
        f"({stopped.name} stopped by SIGTERM after {share_at_stop}); "
        f"bytes published per relay {published} (about {shares} messages)"
    )

    # every accepted event stored and delivered, nothing unexpected, duplicates within the bound
    assert report.accepted == EVENTS, report.summary()
    assert report.unknown_left == 0, report.summary()
    assert report.ok(MAX_DUPLICATES), report.summary() + tails
    assert not [d for d, (status, _) in states.items() if status == "DEAD"], report.summary()

    # each ingest process accepted a share
    assert all(n > 0 for n in transport.accepted.values()), transport.accepted

    # each worker process delivered a share, and together they recorded every delivery
    for name, ids in per_worker.items():
        assert len(ids) >= MIN_DELIVERIES_PER_WORKER, (name, len(ids))
    recorded = [d for ids in per_worker.values() for d in ids]
    assert set(recorded) == {d for d, (status, _) in states.items() if status == "DELIVERED"}
    assert len(recorded) == len(set(recorded)), "a delivery recorded as delivered twice"
    # the worker left standing took over what the stopped one had not finished
    assert len(per_worker[stopped.name]) < report.deliveries // 2, per_worker[stopped.name]

    # each relay published: at least MIN_PUBLISHES_PER_RELAY messages' worth of bytes
    assert all(n >= MIN_PUBLISHES_PER_RELAY for n in shares.values()), (published, shares)

    # no process crashed; each ran to the end and stopped gracefully
    for member in fleet.members:
        assert crash_lines(logs[member.name]) == [], member.name
        assert member.process.exit_code == 0, f"{member.name}: {logs[member.name][-3000:]}"
        assert member.process.starts == 1, member.name


async def _consumers_are(vhost: str, queue: str, count: int) -> bool:
    return await consumers(vhost, queue) == count


async def _relays_connected(vhost: str, relays: list[Member]) -> bool:
    pids = [m.pid for m in relays]
    received = await trio.to_thread.run_sync(relay_bytes_received, vhost, pids)
    return all(received.get(pid, 0) > 0 for pid in pids)


async def _stop_point(ledger: Ledger, worker: Member) -> bool:
    """Half the events sent, and the worker to stop has delivered some of them."""
    await trio.lowlevel.checkpoint()
    return (
        len(ledger) >= EVENTS // 2
        and len(delivered_by(worker.process.log())) >= MIN_DELIVERIES_PER_WORKER
    )
