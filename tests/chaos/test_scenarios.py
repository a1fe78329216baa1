"""At-least-once under faults: each scenario sends events at a steady rate, injects its fault
mid-stream, heals it, drains, and checks the ledger against what the receiver got and what
Postgres says: nothing accepted is lost, nothing unexpected arrives, and duplicates stay within
the bound (none on a graceful shutdown).

The README's *Reliability* section holds the table these produce.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from tests.chaos.harness import Context, Scenario, run_scenario, wait_ready
from tests.integration.conftest import rabbitmqctl, sql

# Per fault, at most one relay batch and every worker's prefetch may be delivered twice.
FAULT_DUPLICATES = 500 + 64


async def close_connections_three_times(ctx: Context) -> None:
    for _ in range(3):
        await trio.to_thread.run_sync(
            rabbitmqctl, "close_all_connections", "-p", ctx.vhost, "fault injection"
        )
        await trio.sleep(1)  # pacing between faults, while the load goes on


async def terminate_postgres_backends(ctx: Context) -> None:
    for _ in range(3):
        await sql(
            ctx.database_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        await trio.sleep(1)  # pacing between faults, while the load goes on


async def blackhole_amqp(ctx: Context) -> None:
    assert ctx.broker_proxy is not None
    await ctx.broker_proxy.set_mode("blackhole")
    await trio.sleep(25)  # the fault itself: longer than two heartbeats (10 s)
    await ctx.broker_proxy.set_mode("pass")


async def kill_and_restart(ctx: Context) -> None:
    ctx.service.signal(signal.SIGKILL)
    assert await ctx.service.wait_exit(10) is not None
    ctx.service.start()
    await wait_ready(ctx.base_url)


async def sigterm_and_restart(ctx: Context) -> None:
    ctx.service.signal(signal.SIGTERM)
    assert await ctx.service.wait_exit(30) == 0  # a graceful stop exits 0
    ctx.service.start()
    await wait_ready(ctx.base_url)


SCENARIOS = [
    Scenario("baseline"),
    Scenario("amqp connections closed 3x", close_connections_three_times,
             max_duplicates=3 * FAULT_DUPLICATES),
    Scenario("postgres backends terminated 3x", terminate_postgres_backends,
             max_duplicates=3 * FAULT_DUPLICATES),
    Scenario("amqp blackholed past the heartbeat", blackhole_amqp, broker_via_proxy=True,
             max_duplicates=FAULT_DUPLICATES),
    Scenario("notifier kill -9 and restart", kill_and_restart, max_duplicates=FAULT_DUPLICATES),
    Scenario("notifier SIGTERM and restart", sigterm_and_restart),
]  # fmt: skip


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_no_accepted_event_is_lost(
    scenario: Scenario, database_url: str, broker_url: str, vhost: str, tmp_path: Path
) -> None:
    report, service = await run_scenario(
        scenario, database_url=database_url, broker_url=broker_url, vhost=vhost,
        tmp_path=tmp_path,
    )  # fmt: skip
    t = service.timings
    recovery = "-" if t.recovery_seconds is None else f"{t.recovery_seconds:.2f} s"
    print(f"\n{scenario.name}: {report.summary()}; recovery {recovery}; "
          f"drain {t.drain_seconds:.1f} s")  # fmt: skip
    assert report.accepted == scenario.events, report.summary()
    assert report.unknown_left == 0, report.summary()
    # the receiver always answers 200: a delivery that died, died of the fault
    assert report.dead == 0, report.summary() + "\n" + service.log()[-5000:]
    assert report.ok(scenario.max_duplicates), report.summary() + "\n" + service.log()[-5000:]
    if scenario.fault is not None:  # the first delivery after the heal, without a restart
        assert t.recovery_seconds is not None, "nothing was delivered after the heal"
        assert t.recovery_seconds < 30, t
    # the process never crashed: it was running until the end and stopped gracefully
    assert service.exit_code == 0, service.log()[-5000:]
