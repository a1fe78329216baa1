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
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from notifier.testing import open_sink
from notifier.testing.servers import Received
from tests.chaos.harness import free_port, write_config
from tests.integration.conftest import create_tenant, poll, scalar
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
    # the FIFO partitions were worked by the fleet, not one process alone or twice at once
    fifo_delivered = [
        len(re.findall(r"delivered", read_log(log))) for _, log, _ in procs
    ]  # fmt: skip
    assert sum(fifo_delivered) >= total


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
