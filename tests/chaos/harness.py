"""The fault-injection harness: notifier as a child process, a steady load with a ledger, a
webhook sink, and the phases of a scenario — load → fault → heal → drain → check.

notifier runs as ``python -m notifier run`` (so a scenario can signal or kill it) against the
test's own database and vhost; the sink and the load generator run in the test's trio loop.
Everything is on 127.0.0.1 and bounded in count and time.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from notifier.adapters.webhook import generate_secret
from notifier.broker.nodes import node_urls
from notifier.testing import WebhookSink, open_sink
from notifier.testing_smtp import SmtpSink, open_smtp_server
from tests.chaos.ledger import Ledger, Report, check, send_events
from tests.chaos.proxy import FaultProxy, open_fault_proxy
from tests.chaos.services import ROOT
from tests.integration.conftest import create_tenant, poll, queue_depths, sql

SECRET = generate_secret()
AMQP_PORT = 5672
# How long the drain phase may take: every accepted event delivered or dead, the outbox empty,
# the main and retry queues empty.
DRAIN_TIMEOUT_SECONDS = 120.0
# A fault scenario sends its last events only once the fault has healed.
HELD_UNTIL_HEALED = 50


def free_port() -> int:
    """A port nothing listens on right now (loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    """A TOML config of ``{table: {key: value}}`` (tables may be dotted: ``workers.webhook``)."""
    lines: list[str] = []
    for table, values in sections.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def base_config(
    database_url: str, broker_url: str | Sequence[str], port: int
) -> dict[str, dict[str, Any]]:
    """Fast retries and reconciliation, so a scenario heals in seconds, not minutes."""
    return {
        "service": {"shutdown_grace_seconds": 5},
        "database": {"url": database_url, "pool_max_size": 10},
        "broker": {"url": broker_url, "heartbeat_seconds": 10, "publish_timeout_seconds": 5},
        "ingest": {"bind": f"127.0.0.1:{port}"},
        "relay": {"poll_interval_seconds": 0.5},
        "retry": {"base_seconds": 1, "max_seconds": 5, "tiers_seconds": [1, 2, 5]},
        "workers.webhook": {
            "concurrency": 16, "prefetch": 64, "max_attempts": 10, "timeout_seconds": 5,
            "allow_private_networks": True,
        },
        "maintenance": {"interval_seconds": 1, "stuck_after_seconds": 10},
        "logging": {"format": "console", "level": "INFO"},
    }  # fmt: skip


@dataclass
class Timings:
    """Seconds, on the test's clock: from the heal to the first delivery after it, and from
    the end of the load to a drained pipeline."""

    recovery_seconds: float | None = None
    drain_seconds: float = 0.0


class ServiceProcess:
    """``notifier run`` as a child process of the test; only this process is ever signalled.
    ``module`` and ``args`` choose another entry point (``tests.chaos.child``)."""

    def __init__(
        self,
        config_path: Path,
        log_path: Path,
        module: str = "notifier",
        args: tuple[str, ...] = ("run",),
    ) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.command = [sys.executable, "-m", module, *args, "--config", str(config_path)]
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.exit_code: int | None = None  # of the last stop()
        self.timings = Timings()

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts + 1}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=ROOT,
            )  # fmt: skip
        self.starts += 1

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    async def wait_exit(self, timeout_seconds: float) -> int | None:
        """The exit code, or None if it is still running after ``timeout_seconds``."""
        process = self.process
        if process is None:
            return None
        try:  # the child's exit itself, waited for in a thread (bounded by the timeout)
            return await trio.to_thread.run_sync(process.wait, timeout_seconds)
        except subprocess.TimeoutExpired:
            return None

    async def stop(self, grace_seconds: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within ``grace_seconds``."""
        self.signal(signal.SIGTERM)
        code = await self.wait_exit(grace_seconds)
        if code is None and self.process is not None:
            self.process.kill()
            code = await self.wait_exit(10)
        self.exit_code = code
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


async def wait_ready(base_url: str, timeout_seconds: float = 30.0) -> None:
    """Until ``/healthz`` answers (the ingest server listens)."""

    async def up() -> bool:
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                return (await client.get(f"{base_url}/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    with trio.fail_after(timeout_seconds):
        await poll(up, interval_seconds=0.1)


@dataclass
class Context:
    """What a fault sees of the running scenario."""

    service: ServiceProcess
    database_url: str
    broker_url: str
    vhost: str
    base_url: str
    ledger: Ledger
    sink: WebhookSink
    broker_proxy: FaultProxy | None = None  # between notifier and RabbitMQ, when asked for
    # (start, end) on the test's clock of each span in which Postgres was certainly down
    outages: list[tuple[float, float]] = field(default_factory=list)


Fault = Callable[[Context], Awaitable[None]]


@dataclass
class Scenario:
    name: str
    fault: Fault | None = None
    events: int = 1000
    rate_per_second: float = 150.0
    max_duplicates: int = 0
    config: dict[str, dict[str, Any]] = field(default_factory=dict)  # merged over base_config
    broker_via_proxy: bool = False  # notifier reaches RabbitMQ through a FaultProxy
    payload: Callable[[int], dict[str, object]] | None = None  # event n's payload
    email_channel: bool = False  # every event also goes to an email channel (a local SMTP sink)
    # run ``python -m tests.chaos.child <child_args>`` instead of ``notifier run``
    child_args: tuple[str, ...] = ()
    # delivery ids that may end DEAD (with a reason) instead of being received
    expect_dead: Callable[[Outcome], set[str]] | None = None
    touches_services: bool = False  # stops or alters Postgres/RabbitMQ: ensure_services after
    log_has: tuple[str, ...] = ()  # texts notifier's log must contain
    log_lacks: tuple[str, ...] = ()  # ... and must not


@dataclass
class Outcome:
    """What a scenario run left: the report, the process, what the fault saw, and the raw
    material the report was made from."""

    report: Report
    service: ServiceProcess
    context: Context
    webhook_ids: list[str]  # webhook-id of every webhook received, in order
    email_ids: list[str]  # delivery id of every email received, in order
    final_states: dict[str, tuple[str, str | None]]
    delivery_channels: dict[str, str]  # delivery id -> channel type


async def drained(database_url: str) -> bool:
    """The outbox is empty and no delivery is unfinished (in Postgres)."""
    (row,) = await sql(
        database_url,
        "SELECT (SELECT count(*) FROM outbox) AS outbox, (SELECT count(*) FROM deliveries "
        "WHERE status IN ('PENDING', 'RETRYING')) AS open",
    )
    return bool(row["outbox"] == 0 and row["open"] == 0)


ReadDepths = Callable[[str], dict[str, int]]


def busy_queues(vhost: str, read_depths: ReadDepths = queue_depths) -> dict[str, int]:
    """The queues of ``vhost`` that still hold messages (ready or unacked), dead-letter queues
    left out (they keep what died, on purpose). ``read_depths`` reads them from the broker the
    scenario runs on (the machine's, unless it brings its own)."""
    return {q: n for q, n in read_depths(vhost).items() if n and not q.endswith(".dead")}


async def queues_empty(vhost: str, read_depths: ReadDepths = queue_depths) -> bool:
    return not await trio.to_thread.run_sync(busy_queues, vhost, read_depths)


async def final_states(database_url: str) -> dict[str, tuple[str, str | None]]:
    rows = await sql(database_url, "SELECT id::text, status, last_error FROM deliveries")
    return {r["id"]: (r["status"], r["last_error"]) for r in rows}


async def delivery_channels(database_url: str) -> dict[str, str]:
    rows = await sql(database_url, "SELECT id::text, channel_type FROM deliveries")
    return {r["id"]: r["channel_type"] for r in rows}


async def stored_event_ids(database_url: str) -> set[str]:
    return {r["id"] for r in await sql(database_url, "SELECT id::text FROM events")}


_MESSAGE_ID = re.compile(r"<([0-9a-f-]{36})@")


def email_delivery_ids(mails: list[Any]) -> list[str]:
    """The delivery id of each received email, from its ``Message-ID`` (``<delivery id@host>``)."""
    ids = []
    for mail in mails:
        found = _MESSAGE_ID.match(str(mail.message()["Message-ID"]))
        assert found, f"no delivery id in Message-ID {mail.message()['Message-ID']!r}"
        ids.append(found.group(1))
    return ids


# A component may fail and be restarted when its broker or database is lost: that is designed
# (docs/architecture.md §2) and logged as "<name> failed, restarting in … s: BrokerError(…)".
# Anything else that fails a component, and these lines, are crashes.
_RESTARTED = re.compile(r"(\S+) failed, restarting in [\d.]+ s: (\w+)\(")
_EXPECTED_FAILURES = {"BrokerError", "StoreUnavailable"}
_CRASH_MARKERS = (
    "handler failed; rejecting to the DLQ",  # the worker's own code raised
    "recording the panic failed",
    "consumer callback failed",
    "request failed",  # ingest answered 500
    "unexpected failure",  # the process ended on an exception
)


def crash_lines(log: str) -> list[str]:
    """Pure: the lines of a notifier log that show a crash — a component failing with anything
    but a lost broker or database, the worker's handler or consumer callback raising, a 500, or
    the process ending on an exception."""
    found = []
    for line in log.splitlines():
        restarted = _RESTARTED.search(line)
        if restarted:
            if restarted.group(2) not in _EXPECTED_FAILURES:
                found.append(line)
        elif any(marker in line for marker in _CRASH_MARKERS):
            found.append(line)
    return found


async def run_scenario(
    scenario: Scenario,
    *,
    database_url: str,
    broker_url: str | Sequence[str],
    vhost: str,
    tmp_path: Path,
    read_depths: ReadDepths = queue_depths,
) -> Outcome:
    """Trio-flavoured. Load → fault (mid-stream) → heal → drain → check; the service is always
    stopped at the end. ``broker_url`` may name a cluster's nodes (``read_depths`` then reads
    that cluster's queues)."""
    async with open_fault_proxy("127.0.0.1", AMQP_PORT) as proxy:
        if scenario.broker_via_proxy:
            broker_url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/{vhost}"
        return await _run(
            scenario, database_url=database_url, broker_url=broker_url, vhost=vhost,
            tmp_path=tmp_path, proxy=proxy if scenario.broker_via_proxy else None,
            read_depths=read_depths,
        )  # fmt: skip


@asynccontextmanager
async def _receivers(scenario: Scenario) -> AsyncIterator[tuple[WebhookSink, SmtpSink | None]]:
    async with AsyncExitStack() as stack:
        sink = await stack.enter_async_context(open_sink())
        smtp = (
            await stack.enter_async_context(open_smtp_server()) if scenario.email_channel else None
        )
        yield sink, smtp


async def _create_channels(
    api: httpx.AsyncClient, sink: WebhookSink, smtp: SmtpSink | None
) -> None:
    resp = await api.post("/v1/channels", json={
        "type": "webhook", "config": {"url": sink.url, "secret": SECRET}})  # fmt: skip
    assert resp.status_code == 201, resp.text
    if smtp is not None:
        resp = await api.post("/v1/channels", json={
            "type": "email", "config": {"to": "chaos@example.test"}})  # fmt: skip
        assert resp.status_code == 201, resp.text


async def _run(
    scenario: Scenario,
    *,
    database_url: str,
    broker_url: str | Sequence[str],
    vhost: str,
    tmp_path: Path,
    proxy: FaultProxy | None,
    read_depths: ReadDepths,
) -> Outcome:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    async with _receivers(scenario) as (sink, smtp):
        sections = base_config(database_url, broker_url, port)
        if smtp is not None:
            sections["workers.email"] = {
                "smtp_host": "127.0.0.1", "smtp_port": smtp.port, "from": "notifier@chaos.test",
                "concurrency": 16, "prefetch": 64, "max_attempts": 10, "timeout_seconds": 5,
            }  # fmt: skip
        for table, values in scenario.config.items():
            sections.setdefault(table, {}).update(values)
        service = ServiceProcess(
            write_config(tmp_path / "notifier.toml", sections), tmp_path / "notifier.log",
            *(("tests.chaos.child", scenario.child_args) if scenario.child_args else ()),
        )  # fmt: skip
        service.start()
        try:
            await wait_ready(base_url)
            key = await create_tenant(database_url, f"chaos-{uuid.uuid4().hex[:8]}")
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=5) as api:
                await _create_channels(api, sink, smtp)
                ledger = Ledger()
                context = Context(  # a fault that needs every node has them from its cluster
                    service, database_url, node_urls(broker_url)[0], vhost, base_url, ledger,
                    sink, proxy,
                )  # fmt: skip
                # A fault scenario's last events wait for the heal: a quick fault must not
                # outlast the load, or nothing would show the pipeline working after it.
                healed = trio.Event()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        lambda: send_events(
                            api, ledger, count=scenario.events,
                            rate_per_second=scenario.rate_per_second, payload=scenario.payload,
                            held=HELD_UNTIL_HEALED if scenario.fault is not None else 0,
                            release=healed,
                        )
                    )  # fmt: skip
                    healed_at: float | None = None
                    if scenario.fault is not None:
                        with trio.fail_after(120):
                            await poll(lambda: _sent_half(ledger, scenario.events))
                        await scenario.fault(context)
                        healed_at = trio.current_time()
                        healed.set()
            loaded_at = trio.current_time()
            with trio.fail_after(DRAIN_TIMEOUT_SECONDS):
                await poll(lambda: drained(database_url), interval_seconds=0.25)
                # and no copy is left in a main or retry queue (a duplicate still to be acked)
                await poll(lambda: queues_empty(vhost, read_depths), interval_seconds=0.25)
            service.timings.drain_seconds = trio.current_time() - loaded_at
            arrivals = [r.at for r in sink.received] + (
                [m.at for m in smtp.received] if smtp else []
            )
            if healed_at is not None:
                after = [at for at in arrivals if at >= healed_at]
                service.timings.recovery_seconds = min(after) - healed_at if after else None
            webhook_ids = [r.headers["webhook-id"] for r in sink.received]
            email_ids = email_delivery_ids(smtp.received) if smtp else []
            states = await final_states(database_url)
            report = check(
                ledger, webhook_ids + email_ids, states, await stored_event_ids(database_url)
            )
            channels = await delivery_channels(database_url)
        finally:
            with trio.CancelScope(shield=True):  # bounded: SIGTERM, then SIGKILL
                await service.stop()
    return Outcome(report, service, context, webhook_ids, email_ids, states, channels)


async def _sent_half(ledger: Ledger, events: int) -> bool:
    await trio.lowlevel.checkpoint()
    return len(ledger) >= events // 2
