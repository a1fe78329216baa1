"""The circuit breaker of a destination across the fleet (docs/architecture.md §5): two
``notifier run`` processes against one database and one vhost, a receiver the test controls on
one loopback port.

First the receiver accepts connections and never answers, then it refuses them (nothing
listens), then it answers 200. The circuit opens after the threshold of unreachable attempts,
both processes defer the channel's deliveries (no attempt spent), failed probes back the wait
off, the API, ``/metrics`` and the console show the circuit, and once the receiver answers a
probe closes it and every delivery is delivered, numbered as if the deferrals never happened.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from notifier.testing import open_sink
from tests.chaos.harness import free_port
from tests.integration.conftest import create_tenant, poll, scalar, sql
from tests.integration.test_fleet_limits import notifier_process
from tests.integration.test_shutdown import read_log

pytestmark = pytest.mark.slow

EVENTS = 12
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def sections(database_url: str, broker_url: str) -> dict[str, dict[str, Any]]:
    return {
        "service": {"shutdown_grace_seconds": 3},
        "database": {"url": database_url, "pool_max_size": 10},
        "broker": {"url": broker_url},
        "ingest": {"bind": f"127.0.0.1:{free_port()}"},
        "relay": {"poll_interval_seconds": 0.5},
        "retry": {"base_seconds": 1, "max_seconds": 2, "tiers_seconds": [1, 2, 5]},
        "workers.webhook": {
            "concurrency": 4, "prefetch": 8, "timeout_seconds": 1, "max_attempts": 50,
            "allow_private_networks": True, "circuit_failure_threshold": 3,
            "circuit_probe_base_seconds": 1, "circuit_probe_max_seconds": 2,
        },
        "maintenance": {"interval_seconds": 5},
        "logging": {"format": "console", "level": "INFO"},
    }  # fmt: skip


@asynccontextmanager
async def silent_receiver(port: int) -> AsyncIterator[None]:
    """Accepts connections on ``port`` and never answers; nothing listens once it exits."""
    [listener] = await trio.open_tcp_listeners(port, host="127.0.0.1")
    held: list[trio.SocketStream] = []

    async def accept() -> None:
        while True:
            held.append(await listener.accept())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        yield
        nursery.cancel_scope.cancel()
    for stream in held:
        await stream.aclose()
    await listener.aclose()


async def circuit_row(database_url: str) -> dict[str, Any] | None:
    rows = await sql(database_url, "SELECT * FROM circuits")
    return dict(rows[0]) if rows else None


async def console_channels(base: str, key: str) -> str:
    """The console's channel page, signed in with ``key``."""
    async with httpx.AsyncClient(base_url=base, timeout=10) as browser:
        token = CSRF.search((await browser.get("/console/sign-in")).text)
        assert token
        signed = await browser.post(
            "/console/sign-in", data={"api_key": key, "csrf": token.group(1)}
        )
        assert signed.status_code == 303, signed.text
        return (await browser.get("/console/channels")).text


async def test_a_circuit_opens_defers_probes_and_closes_across_two_processes(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    port = free_port()
    destination = f"http://127.0.0.1:{port}"
    async with AsyncExitStack() as stack:
        procs = [
            await stack.enter_async_context(
                notifier_process(tmp_path, name, sections(database_url, broker_url))
            )
            for name in ("a", "b")
        ]
        (base_a, log_a), (base_b, log_b) = procs
        api = await stack.enter_async_context(
            httpx.AsyncClient(base_url=base_a, headers={"Authorization": f"Bearer {key}"})
        )
        async with silent_receiver(port):
            hook = await api.post(
                "/v1/channels", json={"type": "webhook", "config": {"url": f"{destination}/in"}}
            )
            assert hook.status_code == 201, hook.text
            channel_id = hook.json()["id"]
            assert hook.json()["health"]["circuit"]["state"] == "closed"
            events = [
                {"type": "breaker", "payload": {"n": n}, "channel_ids": [channel_id]}
                for n in range(EVENTS)
            ]
            posted = await api.post("/v1/events/batch", json={"events": events})
            assert posted.status_code == 202, posted.text

            async def opened() -> bool:
                row = await circuit_row(database_url)
                return row is not None and row["state"] != "closed"

            with trio.fail_after(30):
                await poll(opened, interval_seconds=0.1)

            # both processes hold the channel's deliveries back: the circuit is the fleet's
            async def both_defer() -> bool:
                return all(
                    re.search(r"attempt \d+: deferred", read_log(log)) for log in (log_a, log_b)
                )

            with trio.fail_after(30):
                await poll(both_defer, interval_seconds=0.2)

            # the API, /metrics and the console show it
            health = (await api.get(f"/v1/channels/{channel_id}")).json()["health"]["circuit"]
            assert health["destination"] == destination
            assert health["state"] in ("open", "half_open")
            assert health["consecutive_failures"] >= 3
            assert health["opened_at"] is not None
            assert health["next_probe_at"] is not None
            metrics = (await api.get(f"{base_b}/metrics")).text
            series = re.search(
                r'^notifier_destination_circuit_state\{channel_type="webhook",'
                rf'destination="{re.escape(destination)}"\}} (\S+)$', metrics, re.M,
            )  # fmt: skip
            assert series is not None, metrics
            assert float(series.group(1)) in (1.0, 2.0)
            page = await console_channels(base_b, key)
            assert re.search(r'class="circuit circuit-(open|half_open)"', page), page

            # the probes (timeouts) fail: the wait doubles, to the max of 2 s
            async def backed_off() -> bool:
                row = await circuit_row(database_url)
                return row is not None and row["probe_interval_seconds"] == 2.0

            with trio.fail_after(30):
                await poll(backed_off, interval_seconds=0.1)

        # nothing listens now: refused, still open
        refused_after = await scalar(database_url, "SELECT max(id) FROM delivery_attempts")

        async def refused_probe() -> bool:
            errors = await sql(
                database_url,
                "SELECT error FROM delivery_attempts WHERE outcome = 'retry' AND id > $1",
                refused_after,
            )
            return any("connection failed" in (r["error"] or "") for r in errors)

        with trio.fail_after(30):
            await poll(refused_probe, interval_seconds=0.1)
        assert (await circuit_row(database_url) or {}).get("state") != "closed"

        # the receiver answers: a probe closes the circuit, everything is delivered
        async with open_sink(port=port) as sink:

            async def all_delivered() -> bool:
                done = await scalar(
                    database_url, "SELECT count(*) FROM deliveries WHERE status = 'DELIVERED'"
                )
                return bool(done == EVENTS)

            with trio.fail_after(60):
                await poll(all_delivered, interval_seconds=0.2)
            assert len({r.body for r in sink.received}) == EVENTS

        row = await circuit_row(database_url)
        assert row is not None
        assert (row["state"], row["consecutive_failures"]) == ("closed", 0)
        health = (await api.get(f"/v1/channels/{channel_id}")).json()["health"]["circuit"]
        assert health["state"] == "closed"

    logs = read_log(log_a) + read_log(log_b)
    assert f"circuit of webhook {destination}: open after" in logs
    assert f"circuit of webhook {destination}: half-open, probing" in logs
    assert f"circuit of webhook {destination}: closed, the probe reached it" in logs

    # Deferrals spent no attempt: each delivery's attempts are numbered 1, 2, ... over its real
    # calls alone, and its deferrals carry the number of the call that came next.
    rows = await sql(
        database_url,
        "SELECT delivery_id, attempt, outcome FROM delivery_attempts ORDER BY id",
    )
    by_delivery: dict[uuid.UUID, list[tuple[int, str]]] = {}
    for r in rows:
        by_delivery.setdefault(r["delivery_id"], []).append((r["attempt"], r["outcome"]))
    assert len(by_delivery) == EVENTS
    deferred = 0
    for history in by_delivery.values():
        calls = [a for a, outcome in history if outcome != "deferred"]
        assert calls == list(range(1, len(calls) + 1)), history
        assert history[-1][1] == "delivered"
        for i, (attempt, outcome) in enumerate(history):
            if outcome == "deferred":
                deferred += 1
                after = [a for a, o in history[i:] if o != "deferred"]
                assert after[0] == attempt, history
    assert deferred > 0
