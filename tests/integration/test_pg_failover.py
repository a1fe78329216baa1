"""A Postgres failover under load: a primary and a streaming standby of the test's own (spare
loopback ports, data directories in a temporary directory), notifier as a real process with
``database.url`` naming both hosts and ``target_session_attrs=read-write``, and events POSTed
at a steady rate while the primary is stopped (immediate) and the standby promoted.

What it proves: every request is answered within the client's bound, 202 or 503 (with
``Retry-After``), never 500; the same notifier process answers 202 again once the standby is
the primary; every event answered 202 reaches the receiver. The primary commits synchronously
to the standby (``synchronous_standby_names``), so a 202 from the old primary is on the new one.
A second test fences the primary read-only instead of stopping it: the pooled connections on it
answer 503 and are replaced, on the standby once it is promoted.

Only the servers started here are ever stopped or signalled (``pg_ctl -D`` their own
directory, or the PID their ``postmaster.pid`` names); the machine's own cluster is not touched.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import trio

from notifier.testing import open_sink
from tests.chaos.harness import ServiceProcess, base_config, free_port, wait_ready, write_config
from tests.chaos.ledger import Ledger, State, delivery_ids_of, send_events
from tests.integration.conftest import create_tenant, make_config, migrate, poll, run_notifier, sql
from tests.integration.test_cli import notifier

pytestmark = pytest.mark.slow

PG_BIN = Path("/usr/lib/postgresql/15/bin")
# The servers refuse to run as root; started by root they run as this user.
RUN_AS = "postgres"
STANDBY_NAME = "notifier_standby"  # its cluster_name: the application_name it streams as
DATABASE = "notifier"
START_TIMEOUT_SECONDS = 30
# How long a client waits for an answer: a request the switch holds longer than this is a hang.
CLIENT_TIMEOUT_SECONDS = 10.0
EVENTS = 400
RATE_PER_SECOND = 40.0
HELD_UNTIL_PROMOTED = 100  # the last events go only once the standby is the primary
SWITCH_AFTER_ACCEPTED = 60
DELIVERY_TIMEOUT_SECONDS = 30


def _tool(name: str) -> str:
    path = PG_BIN / name
    return str(path) if path.exists() else shutil.which(name) or name


def _run(*command: str, timeout: float = 60) -> str:
    """Run a Postgres tool (as ``RUN_AS`` when the tests run as root); its stdout."""
    if os.geteuid() == 0:
        command = ("runuser", "-u", RUN_AS, "--", *command)
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr}")
    return done.stdout


class Node:
    """One Postgres server of the test: its data directory, port and log."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.name = name
        self.datadir = workdir / name
        self.port = free_port()
        self.log = workdir / f"{name}.log"
        self.socket_dir = workdir

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.socket_dir} -c cluster_name={self.name}"
        )
        _run(
            _tool("pg_ctl"), "-D", str(self.datadir), "-l", str(self.log), "-o", options,
            "-w", "-t", str(START_TIMEOUT_SECONDS), "start",
        )  # fmt: skip

    def stop_immediate(self) -> None:
        _run(_tool("pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w", "stop")

    def promote(self) -> None:
        _run(_tool("pg_ctl"), "-D", str(self.datadir), "-w", "-t", "30", "promote")

    def pid(self) -> int | None:
        """The postmaster's PID, while its ``postmaster.pid`` is there."""
        try:
            return int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill_leftover(self) -> None:
        """Stop the server if it still runs: ``pg_ctl stop`` (immediate), or else SIGKILL the
        PID its ``postmaster.pid`` names, if that process is this directory's postmaster."""
        pid = self.pid()
        if pid is None:
            return
        try:
            self.stop_immediate()
            return
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        try:
            if str(self.datadir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


PG_HBA = """\
local all all trust
host all all 127.0.0.1/32 trust
local replication all trust
host replication all 127.0.0.1/32 trust
"""

PRIMARY_SETTINGS = """
wal_level = replica
max_wal_senders = 4
hot_standby = on
synchronous_commit = on
max_connections = 60
shared_buffers = 32MB
"""


@contextmanager
def replicated_pair() -> Iterator[tuple[Node, Node]]:
    """A running primary and a streaming standby of it (not yet synchronous), both stopped
    and their directories removed afterwards, whatever happened."""
    workdir = Path(tempfile.mkdtemp(prefix="notifier-pg-failover-"))
    primary, standby = Node(workdir, "notifier_primary"), Node(workdir, STANDBY_NAME)
    try:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(RUN_AS)
            os.chown(workdir, entry.pw_uid, entry.pw_gid)
        _run(
            _tool("initdb"), "-D", str(primary.datadir), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", "--locale=C.UTF-8", "--no-sync",
        )  # fmt: skip
        (primary.datadir / "pg_hba.conf").write_text(PG_HBA)
        with (primary.datadir / "postgresql.conf").open("a") as conf:
            conf.write(PRIMARY_SETTINGS)
        primary.start()
        # -R: standby.signal and primary_conninfo; the standby streams as its cluster_name.
        _run(
            _tool("pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(standby.datadir), "-R", "-X", "stream", "-c", "fast", "--no-sync",
        )  # fmt: skip
        standby.start()
        yield primary, standby
    finally:
        for node in (standby, primary):
            node.kill_leftover()
        shutil.rmtree(workdir, ignore_errors=True)


async def _make_synchronous(primary: Node) -> None:
    """Commit on the primary only once the standby has the commit (``synchronous_commit = on``
    and the standby named in ``synchronous_standby_names``), set on the primary alone — a
    standby promoted with it set would wait for a standby of its own at every commit."""
    await sql(primary.url(), f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
    await sql(primary.url(), "SELECT pg_reload_conf()")

    async def synchronous() -> bool:
        rows = await sql(
            primary.url(),
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1",
            STANDBY_NAME,
        )
        return [r["sync_state"] for r in rows] == ["sync"]

    with trio.fail_after(START_TIMEOUT_SECONDS):
        await poll(synchronous, interval_seconds=0.1)


def _warnings(log: str) -> str:
    """The log's warnings and errors, their first lines (the last 40 of them)."""
    lines = [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line]
    return "\n".join(line[:300] for line in lines[-40:])


@pytest.fixture
def pair() -> Iterator[tuple[Node, Node]]:
    with replicated_pair() as nodes:
        yield nodes


async def test_a_failover_under_load_answers_503_then_202_and_loses_nothing_accepted(
    pair: tuple[Node, Node], tmp_path: Path, broker_url: str
) -> None:
    primary, standby = pair
    await _make_synchronous(primary)
    await sql(primary.url(), f'CREATE DATABASE "{DATABASE}"')
    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    url = f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"
    port = free_port()
    path = write_config(tmp_path / "notifier.toml", base_config(url, broker_url, port))
    migrated = await trio.to_thread.run_sync(
        functools.partial(notifier, "migrate", "--config", str(path))
    )
    assert migrated.returncode == 0, migrated.stderr
    key = await create_tenant(primary.url(DATABASE))

    service = ServiceProcess(path, tmp_path / "notifier.log")
    service.start()
    try:
        base_url = f"http://127.0.0.1:{port}"
        await wait_ready(base_url, START_TIMEOUT_SECONDS)
        async with (
            open_sink() as sink,
            httpx.AsyncClient(
                base_url=base_url, timeout=CLIENT_TIMEOUT_SECONDS,
                headers={"Authorization": f"Bearer {key}"},
            ) as api,
        ):  # fmt: skip
            channel = await api.post(
                "/v1/channels", json={"type": "webhook", "config": {"url": sink.url}}
            )
            assert channel.status_code == 201, channel.text
            ledger = Ledger()
            promoted = trio.Event()
            switch: dict[str, float] = {}

            async def enough_accepted() -> bool:
                return ledger.count(State.ACCEPTED) >= SWITCH_AFTER_ACCEPTED

            async def answered_since_stopped() -> bool:
                return any(o.sent_at >= switch["stopped"] for o in ledger.observations)

            async def fail_over() -> None:
                await poll(enough_accepted)
                switch["stopping"] = trio.current_time()
                await trio.to_thread.run_sync(primary.stop_immediate)
                switch["stopped"] = trio.current_time()
                # Hold the switch until a request has met it: the primary gone, the standby
                # still read-only (refused by target_session_attrs=read-write).
                await poll(answered_since_stopped)
                switch["promoting"] = trio.current_time()
                await trio.to_thread.run_sync(standby.promote)
                switch["promoted"] = trio.current_time()
                promoted.set()

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(fail_over)
                    await send_events(
                        api, ledger, count=EVENTS, rate_per_second=RATE_PER_SECOND,
                        held=HELD_UNTIL_PROMOTED, release=promoted,
                        retry_unknown_for_seconds=20, retry_pause_seconds=0.5,
                    )  # fmt: skip

            observations = ledger.observations
            statuses = sorted({o.status_code or 0 for o in observations})
            summary = f"statuses {statuses}; switch {switch}; log:\n{_warnings(service.log())}"
            # Every request answered (no timeout, no broken connection), and only with 202
            # (200: an idempotency key retried after its event was stored) or 503.
            assert set(statuses) <= {200, 202, 503}, summary
            assert all(o.retry_after for o in observations if o.status_code == 503), summary
            # Between the stop and the promotion nothing can be stored: 503, at once.
            between = [
                o for o in observations
                if switch["stopped"] <= o.sent_at and o.answered_at <= switch["promoting"]
            ]  # fmt: skip
            assert between, summary
            assert {o.status_code for o in between} == {503}, summary
            # The same process, never restarted, accepts events on the promoted standby.
            after = [o for o in observations if o.sent_at >= switch["promoted"]]
            assert any(o.status_code == 202 for o in after), summary
            assert ledger.count(State.ACCEPTED) == EVENTS, summary
            assert service.starts == 1
            assert service.process is not None
            assert service.process.poll() is None, summary

            owed = {d for entry in ledger for d in entry.delivery_ids}
            assert len(owed) == EVENTS

            async def all_delivered() -> bool:
                return owed <= set(delivery_ids_of(sink.received))

            with trio.fail_after(DELIVERY_TIMEOUT_SECONDS):
                await poll(all_delivered, interval_seconds=0.2)
            print(
                f"{len(observations)} requests: "
                f"{ {s: sum(o.status_code == s for o in observations) for s in statuses} }, "
                f"stop and promote took {switch['promoted'] - switch['stopping']:.2f} s, "
                f"Retry-After {sorted({o.retry_after for o in observations if o.retry_after})}, "
                f"{len(sink.received)} webhooks for {len(owed)} deliveries"
            )
    finally:
        await service.stop()


async def test_connections_to_a_primary_turned_read_only_move_to_the_promoted_standby(
    pair: tuple[Node, Node], broker_url: str
) -> None:
    # A primary fenced without stopping it (default_transaction_read_only on): the pooled
    # connections already open on it stay open, and every write on them is refused. They are
    # answered 503 (never 500) and closed, so the pool opens the next ones where writes are
    # taken: on the standby, once it is promoted, with no restart.
    primary, standby = pair
    await sql(primary.url(), f'CREATE DATABASE "{DATABASE}"')
    await trio.to_thread.run_sync(migrate, primary.url(DATABASE))
    key = await create_tenant(primary.url(DATABASE))
    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    url = f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"
    config = make_config(url, broker_url, database={"pool_max_size": 4})
    body = {"type": "t", "payload": {}}
    async with run_notifier(config, roles=("ingest",)) as running, running.client(key) as api:
        # connections in use at once: the pool has several open on the primary
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(functools.partial(api.post, "/v1/events", json=body))
        statuses: list[int] = []

        async def answered(*wanted: int) -> bool:
            statuses.append((await api.post("/v1/events", json=body)).status_code)
            return statuses[-1] in wanted

        await sql(primary.url(), "ALTER SYSTEM SET default_transaction_read_only = on")
        await sql(primary.url(), "SELECT pg_reload_conf()")
        with trio.fail_after(10):
            await poll(functools.partial(answered, 500, 503))
        assert statuses[-1] == 503, statuses
        await trio.to_thread.run_sync(standby.promote)
        with trio.fail_after(10):
            await poll(functools.partial(answered, 202))
        for _ in range(8):
            assert await answered(202), statuses
        assert set(statuses) == {202, 503}, statuses
