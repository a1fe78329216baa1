"""FIFO channels across a fleet (README "Ordered delivery (FIFO)"): ``notifier run`` processes
(every role) against one database and one vhost, a webhook receiver in the test process that
fails some requests.

- three processes, two FIFO channels and two ordinary ones under load: each FIFO receiver sees
  its events in acceptance order with no gap (a failed request is tried again before the next
  event, so duplicates are adjacent); the ordinary channels are not held behind them;
- two processes, the one whose consumer is active for the FIFO channel killed mid-stream
  (SIGKILL): the other takes the partition over and the order holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

from notifier.messages import decode_message
from notifier.store.pg import open_store
from notifier.store.rows import NewEvent
from notifier.testing import open_sink
from notifier.testing.servers import Received
from tests.chaos.harness import free_port, write_config
from tests.integration.conftest import create_tenant, poll, scalar, sql
from tests.integration.test_shutdown import read_log, wait_ready

pytestmark = pytest.mark.slow

FIFO_EVENTS = 40  # per FIFO channel
ORDINARY_EVENTS = 80  # per ordinary channel


def sections(database_url: str, broker_url: str, port: int) -> dict[str, dict[str, Any]]:
    return {
        "service": {"shutdown_grace_seconds": 5},
        "database": {"url": database_url, "pool_max_size": 10},
        "broker": {"url": broker_url, "fifo_partitions": 4},
        "ingest": {"bind": f"127.0.0.1:{port}"},
        "relay": {"poll_interval_seconds": 0.5},
        "retry": {"base_seconds": 1, "max_seconds": 2, "tiers_seconds": [1, 2, 5]},
        "workers.webhook": {"concurrency": 8, "prefetch": 16, "allow_private_networks": True},
        "maintenance": {"interval_seconds": 5},
        "logging": {"format": "console", "level": "INFO"},
    }  # fmt: skip


@asynccontextmanager
async def notifier_process(
    tmp_path: Path, name: str, config: dict[str, dict[str, Any]], *, killed: set[str]
) -> AsyncIterator[tuple[str, Path, trio.Process]]:
    """``notifier run`` as a child process: its base URL, log and process. SIGTERM on exit,
    and the exit must be clean unless the test killed it (its name in ``killed``)."""
    path = write_config(tmp_path / f"{name}.toml", config)
    log = tmp_path / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    with log.open("ab") as out:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "notifier", "run", "--config", str(path)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    base = f"http://{config['ingest']['bind']}"
    try:
        await wait_ready(base, process, log)
        yield base, log, process
    finally:
        if process.returncode is None:
            process.terminate()
        with trio.move_on_after(30):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
    if name not in killed:
        assert process.returncode == 0, read_log(log)


class FailsSome:
    """The receiver's answers: every seventh event fails its first request (503)."""

    def __init__(self) -> None:
        self.tries: dict[tuple[str, int], int] = {}

    def __call__(self, received: Received) -> tuple[int, dict[str, str], bytes]:
        key = (received.path, int(received.json()["data"]["n"]))
        self.tries[key] = self.tries.get(key, 0) + 1
        if key[1] % 7 == 3 and self.tries[key] == 1:
            return 503, {}, b"busy"
        return 200, {}, b"ok"


def sequence(received: Sequence[Received], path: str) -> list[int]:
    """The event numbers one channel's receiver saw, in arrival order, failed requests too."""
    return [int(r.json()["data"]["n"]) for r in received if r.path == f"/hook{path}"]


def assert_in_order(seen: list[int], count: int) -> None:
    """Acceptance order, no gap: with adjacent repeats (a retry, an at-least-once duplicate)
    collapsed, exactly 0 .. count-1."""
    collapsed = [n for i, n in enumerate(seen) if i == 0 or seen[i - 1] != n]
    assert collapsed == list(range(count)), seen


async def make_channel(api: httpx.AsyncClient, url: str, ordering: str) -> str:
    made = await api.post(
        "/v1/channels",
        json={"type": "webhook", "config": {"url": url}, "ordering": ordering, "max_attempts": 5},
    )
    assert made.status_code == 201, made.text
    assert made.json()["ordering"] == ordering
    return str(made.json()["id"])


async def post_events(api: httpx.AsyncClient, plan: list[tuple[str, int]]) -> None:
    """The events of ``plan`` (channel, number), in batches of 20, one batch after another: the
    order of acceptance is the plan's."""
    for start in range(0, len(plan), 20):
        events = [
            {"type": "fifo.test", "payload": {"n": n}, "channel_ids": [channel]}
            for channel, n in plan[start : start + 20]
        ]
        posted = await api.post("/v1/events/batch", json={"events": events})
        assert posted.status_code == 202, posted.text


async def all_delivered(database_url: str, count: int) -> None:
    async def done() -> bool:
        got = await scalar(
            database_url, "SELECT count(*) FROM deliveries WHERE status = 'DELIVERED'"
        )
        return bool(got == count)

    await poll(done, interval_seconds=0.25)


async def test_three_processes_keep_each_fifo_channel_in_order(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    async with open_sink(FailsSome()) as sink, AsyncExitStack() as stack:
        procs = [
            await stack.enter_async_context(notifier_process(
                tmp_path, name, sections(database_url, broker_url, free_port()), killed=set()
            ))
            for name in ("a", "b", "c")
        ]  # fmt: skip
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=procs[0][0], headers=headers, timeout=30) as api:
            fifo = [await make_channel(api, f"{sink.url}/fifo{i}", "fifo") for i in (0, 1)]
            plain = [await make_channel(api, f"{sink.url}/plain{i}", "none") for i in (0, 1)]
            # interleaved, as a producer would send them
            plan = [(c, n) for n in range(ORDINARY_EVENTS) for c in plain] + [
                (c, n) for n in range(FIFO_EVENTS) for c in fifo
            ]
            plan.sort(key=lambda cn: cn[1])
            started = trio.current_time()
            await post_events(api, plan)
        total = 2 * FIFO_EVENTS + 2 * ORDINARY_EVENTS
        with trio.fail_after(60):
            await all_delivered(database_url, total)

    for i in (0, 1):
        assert_in_order(sequence(sink.received, f"/fifo{i}"), FIFO_EVENTS)
    # every ordinary event arrived (a failed one again, later: no order is kept there) ...
    for i in (0, 1):
        assert sorted(set(sequence(sink.received, f"/plain{i}"))) == list(range(ORDINARY_EVENTS))
    # ... and not behind the FIFO lines: the ordinary channels, with twice the events, were
    # done before the FIFO ones, which wait for each of their failures in turn
    last = {
        p: max(r.at for r in sink.received if r.path == f"/hook{p}")
        for p in ("/fifo0", "/fifo1", "/plain0", "/plain1")
    }
    assert max(last["/plain0"], last["/plain1"]) < min(last["/fifo0"], last["/fifo1"]), last
    plain_rate = 2 * ORDINARY_EVENTS / (max(last["/plain0"], last["/plain1"]) - started)
    fifo_rate = 2 * FIFO_EVENTS / (max(last["/fifo0"], last["/fifo1"]) - started)
    print(f"ordinary channels: {plain_rate:.1f}/s; FIFO channels: {fifo_rate:.1f}/s")


async def test_the_order_holds_when_the_active_consumer_is_killed(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    killed: set[str] = set()
    count = 60
    async with open_sink(delay_seconds=0.05) as sink, AsyncExitStack() as stack:
        procs = {
            name: await stack.enter_async_context(notifier_process(
                tmp_path, name, sections(database_url, broker_url, free_port()), killed=killed
            ))
            for name in ("a", "b")
        }  # fmt: skip
        headers = {"Authorization": f"Bearer {key}"}
        base = procs["a"][0]
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as api:
            channel = await make_channel(api, f"{sink.url}/line", "fifo")
            await post_events(api, [(channel, n) for n in range(count)])
        with trio.fail_after(30):
            await sink.wait_for(count // 4)
        # the process delivering the line is its partition's active consumer: kill it
        active = [
            name for name, (_, log, _) in procs.items() if "attempt 1: delivered" in read_log(log)
        ]
        assert len(active) == 1, active
        killed.add(active[0])
        procs[active[0]][2].send_signal(signal.SIGKILL)
        with trio.fail_after(45):
            await all_delivered(database_url, count)
        survivor = next(name for name in procs if name not in killed)
        assert "attempt 1: delivered" in read_log(procs[survivor][1])

    assert_in_order(sequence(sink.received, "/line"), count)


async def test_the_store_numbers_reads_and_renumbers_a_fifo_line(database_url: str) -> None:
    """Against Postgres: the fan-out numbers a FIFO channel's deliveries in acceptance order
    (batch order, then later batches; concurrent batches take turns) and routes them to
    ``<type>.fifo``; ``fifo_head`` reads the lowest unfinished one; a replay takes a new number
    at the end; the console's and /metrics' reads see the line. An ordinary channel gets no
    number and no counter row."""
    await create_tenant(database_url)
    tenant_id = await scalar(database_url, "SELECT id FROM tenants LIMIT 1")
    async with open_store(database_url) as store:
        fifo = await store.create_channel(
            tenant_id, type="webhook", name="", config={"url": "https://x.example/in"},
            recipient=None, event_types=["*"], enabled=True, max_attempts=None, ordering="fifo",
        )  # fmt: skip
        plain = await store.create_channel(
            tenant_id, type="webhook", name="", config={"url": "https://x.example/in"},
            recipient=None, event_types=["*"], enabled=True, max_attempts=None,
        )  # fmt: skip
        assert (fifo.ordering, plain.ordering) == ("fifo", "none")

        def event(n: int) -> NewEvent:
            return NewEvent(
                id=uuid.uuid4(), type="t", recipient=None, payload=msgspec.Raw(b'{"n": %d}' % n),
                idempotency_key=None, request_hash=str(n), channel_ids=[fifo.id, plain.id],
            )  # fmt: skip

        await store.ingest(tenant_id, [event(n) for n in range(3)], {})
        async with trio.open_nursery() as nursery:  # concurrent batches: numbers never repeat
            for start in (3, 6, 9):
                nursery.start_soon(
                    store.ingest, tenant_id, [event(n) for n in range(start, start + 3)], {}
                )
        rows = await sql(
            database_url,
            "SELECT d.channel_id, d.fifo_seq, (e.payload ->> 'n')::int AS n, o.routing_key "
            "FROM deliveries d JOIN events e ON e.id = d.event_id "
            "JOIN outbox o ON o.delivery_id = d.id ORDER BY d.fifo_seq",
        )
        line = [r for r in rows if r["channel_id"] == fifo.id]
        assert [r["fifo_seq"] for r in line] == list(range(1, 13))
        assert [r["n"] for r in line[:3]] == [0, 1, 2]  # the batch's order
        for start in (3, 6, 9):  # each concurrent batch in one piece, in its order
            first = next(i for i, r in enumerate(line) if r["n"] == start)
            assert [r["n"] for r in line[first : first + 3]] == [start, start + 1, start + 2]
        assert {r["routing_key"] for r in line} == {"webhook.fifo"}
        others = [r for r in rows if r["channel_id"] == plain.id]
        assert {(r["fifo_seq"], r["routing_key"]) for r in others} == {(None, "webhook")}
        assert await scalar(database_url, "SELECT count(*) FROM fifo_counters") == 1

        head = await store.fifo_head(fifo.id)
        assert head is not None
        assert head.fifo_seq == 1
        assert head.wait_seconds == 0
        assert decode_message(head.body).attempt == 1
        assert await store.fifo_head(plain.id) is None

        lines = await store.fifo_lines(tenant_id, [fifo.id, plain.id])
        assert set(lines) == {fifo.id}
        assert lines[fifo.id].backlog == 12
        snapshot = await store.metrics_snapshot()
        assert [(t, c, b) for t, c, b, _ in snapshot.fifo_lines] == [("webhook", str(fifo.id), 12)]

        # the head dies; its replay goes to the end of the line
        await sql(
            database_url, "UPDATE deliveries SET status = 'DEAD', attempt = 1 WHERE id = $1",
            head.delivery_id,
        )  # fmt: skip
        after = await store.fifo_head(fifo.id)
        assert after is not None
        assert after.fifo_seq == 2
        await store.replay_delivery(tenant_id, head.delivery_id)
        assert (
            await scalar(
                database_url, "SELECT fifo_seq FROM deliveries WHERE id = $1", head.delivery_id
            )
            == 13
        )
        assert await scalar(
            database_url, "SELECT routing_key FROM outbox WHERE delivery_id = $1 ORDER BY id DESC "
            "LIMIT 1", head.delivery_id,
        ) == "webhook.fifo"  # fmt: skip
