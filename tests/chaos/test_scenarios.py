"""At-least-once under faults: each scenario sends events at a steady rate, injects its fault
mid-stream, heals it, drains, and checks the ledger against what the receiver got and what
Postgres says: nothing accepted is lost, nothing unexpected arrives, and duplicates stay within
the bound (none on a graceful shutdown).

The README's *Reliability* section holds the table these produce.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import aiormq
import aiormq.abc
import pytest
import trio

from tests.chaos import services
from tests.chaos.harness import Context, Outcome, Scenario, crash_lines, run_scenario, wait_ready
from tests.chaos.ledger import answered_during, outage_violations
from tests.integration.conftest import poll, rabbitmqctl, sql

T = TypeVar("T")

# When notifier is killed while the load generator is sending a request body, httpx leaves the
# body's async generator unfinished and trio warns when it is collected: an artefact of the
# client side of a broken connection (the event is then sent again with its key), not of
# notifier. Only that warning is let through.
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning"
    ),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object ByteStream.__aiter__"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
]

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


POISON = [b"not json", b'{"delivery_id": "nope"}', b"[]", b'{"attempt": "x"}', b"\xff\xfe"]


def _amqp(url: str, work: Callable[[aiormq.abc.AbstractChannel], Awaitable[T]]) -> T:
    """Run ``work`` on a channel of a plain asyncio connection (in a thread of its own)."""

    async def run() -> T:
        conn = await aiormq.connect(url)
        try:
            return await work(await conn.channel())
        finally:
            await conn.close()

    return asyncio.run(run())


async def publish_poison(ctx: Context) -> None:
    async def publish(ch: aiormq.abc.AbstractChannel) -> None:
        await ch.confirm_delivery()
        for i, body in enumerate(POISON):
            await ch.basic_publish(
                body, exchange="deliveries", routing_key="webhook",
                properties=aiormq.spec.Basic.Properties(message_id=f"poison-{i}", delivery_mode=2),
            )  # fmt: skip

    await trio.to_thread.run_sync(_amqp, ctx.broker_url, publish)


async def dead_letter_depth(broker_url: str) -> int:
    async def depth(ch: aiormq.abc.AbstractChannel) -> int:
        ok = await ch.queue_declare("deliveries.webhook.dead", passive=True)
        return int(ok.message_count or 0)

    return await trio.to_thread.run_sync(_amqp, broker_url, depth)


async def delete_main_queue(ctx: Context) -> None:
    await trio.to_thread.run_sync(
        rabbitmqctl, "delete_queue", "-p", ctx.vhost, "deliveries.webhook"
    )


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


# -- faults of the shared services: each restores what it changed in ``finally`` -------------------


async def _thread(fn: Callable[..., object], *args: str) -> None:
    await trio.to_thread.run_sync(fn, *args)


async def _restoring(fn: Callable[..., object], *args: str) -> None:
    """A restoring step in ``finally``: shielded, so a failing scenario still restores."""
    with trio.CancelScope(shield=True):
        await _thread(fn, *args)


async def rabbitmq_stop_app(ctx: Context) -> None:
    try:
        await _thread(rabbitmqctl, "stop_app")
        await trio.sleep(10)  # the fault itself: the broker is down while the load goes on
    finally:
        await _restoring(rabbitmqctl, "start_app")  # returns once the app has booted


async def rabbitmq_kill_9(ctx: Context) -> None:
    try:
        await _thread(services.rabbitmq_kill)
        await trio.sleep(5)  # the fault itself: the broker is gone while the load goes on
    finally:
        await _restoring(services.ensure_services)  # starts the broker and awaits its boot


async def postgres_restart_fast(ctx: Context) -> None:
    try:
        await _thread(services.pg_ctl, "restart", "-m", "fast")
    finally:
        await _restoring(services.ensure_services)


async def postgres_stop_immediate(ctx: Context) -> None:
    try:
        await _thread(services.pg_ctl, "stop", "-m", "immediate")
        down_from = trio.current_time()
        await trio.sleep(8)  # the fault itself: Postgres is down while the load goes on
        ctx.outages.append((down_from, trio.current_time()))
    finally:
        await _restoring(services.pg_ctl, "start")


async def rabbitmq_memory_alarm(ctx: Context) -> None:
    before = await trio.to_thread.run_sync(services.rabbitmq_memory_watermark)
    try:
        await _thread(services.rabbitmq_set_memory_watermark, "0")  # the alarm goes off at once
        alarms = await trio.to_thread.run_sync(services.rabbitmq_alarms)
        assert "memory" in alarms, alarms
        await trio.sleep(20)  # the fault itself: every publisher is blocked
    finally:
        await _restoring(services.rabbitmq_set_memory_watermark, before)
    with trio.fail_after(30):
        await poll(_memory_alarm_cleared, interval_seconds=0.5)


async def _memory_alarm_cleared() -> bool:
    return "memory" not in await trio.to_thread.run_sync(services.rabbitmq_alarms)


# -- receivers and adapters --------------------------------------------------------------------

HANG_GRACE_SECONDS = 2


async def receivers_hang_past_the_grace(ctx: Context) -> None:
    """The receiver stops answering; once every worker is stuck on it, SIGTERM. notifier must
    exit within its grace (the stuck deliveries go back to the queue), then deliver them after
    a restart, the receiver answering again."""
    concurrency = 16
    seen = len(ctx.sink.received)
    ctx.sink.delay_seconds = 3600  # every request from now on hangs
    with trio.fail_after(30):
        await poll(lambda: _received_at_least(ctx, seen + concurrency))
    began = trio.current_time()
    ctx.service.signal(signal.SIGTERM)
    code = await ctx.service.wait_exit(30)
    took = trio.current_time() - began
    assert code == 0, ctx.service.log()[-3000:]
    assert took < HANG_GRACE_SECONDS + 5, f"exited {took:.1f} s after SIGTERM"
    ctx.sink.delay_seconds = 0
    ctx.service.start()
    await wait_ready(ctx.base_url)


async def _received_at_least(ctx: Context, count: int) -> bool:
    await trio.lowlevel.checkpoint()
    return len(ctx.sink.received) >= count


MARKER = "chaos_bug"


def marked_payload(n: int) -> dict[str, object]:
    """Every tenth event carries the marker the raising adapter reacts to."""
    return {"seq": n, MARKER: True} if n % 10 == 3 else {"seq": n}


def marked_webhook_deliveries(outcome: Outcome) -> set[str]:
    """The deliveries the raising adapter must kill: the webhook ones of marked events."""
    return {
        d for entry in outcome.context.ledger
        if int(entry.key.removeprefix("chaos-")) % 10 == 3
        for d in entry.delivery_ids if outcome.delivery_channels[d] == "webhook"
    }  # fmt: skip


SCENARIOS = [
    Scenario("baseline"),
    Scenario("rabbitmq stop_app, start_app", rabbitmq_stop_app, touches_services=True,
             max_duplicates=FAULT_DUPLICATES),
    Scenario("rabbitmq kill -9, restarted", rabbitmq_kill_9, touches_services=True,
             max_duplicates=FAULT_DUPLICATES),
    Scenario("amqp connections closed 3x", close_connections_three_times,
             max_duplicates=3 * FAULT_DUPLICATES),
    Scenario("amqp blackholed past the heartbeat", blackhole_amqp, broker_via_proxy=True,
             max_duplicates=FAULT_DUPLICATES),
    Scenario("postgres restart -m fast", postgres_restart_fast, touches_services=True,
             max_duplicates=FAULT_DUPLICATES),
    Scenario("postgres stop -m immediate, start", postgres_stop_immediate,
             touches_services=True, max_duplicates=FAULT_DUPLICATES),
    Scenario("postgres backends terminated 3x", terminate_postgres_backends,
             max_duplicates=3 * FAULT_DUPLICATES),
    Scenario("notifier kill -9 and restart", kill_and_restart, max_duplicates=FAULT_DUPLICATES),
    Scenario("notifier SIGTERM and restart", sigterm_and_restart),
    Scenario("receivers hang past the shutdown grace", receivers_hang_past_the_grace,
             max_duplicates=FAULT_DUPLICATES,
             config={"service": {"shutdown_grace_seconds": HANG_GRACE_SECONDS},
                     "workers.webhook": {"timeout_seconds": 30}}),
    Scenario("poison messages in the main queue", publish_poison),
    Scenario("main queue deleted mid-stream", delete_main_queue, max_duplicates=FAULT_DUPLICATES),
    # Slower than the default load: setting the alarm takes rabbitmqctl a few seconds, and the
    # second half of the events must still be arriving once it is on.
    Scenario("rabbitmq memory alarm for 20 s", rabbitmq_memory_alarm, touches_services=True,
             max_duplicates=FAULT_DUPLICATES, rate_per_second=50.0,
             log_has=("the relay waits", "the broker accepts publishes again"),
             log_lacks=("relay failed",)),
]  # fmt: skip


# The adapter scenario has a test of its own, which checks the same guarantees and more.
ADAPTER_BUG = Scenario(
    "adapter raising for a marked payload", payload=marked_payload, email_channel=True,
    child_args=("--raise-for", MARKER), expect_dead=marked_webhook_deliveries,
)  # fmt: skip


async def run(scenario: Scenario, database_url: str, broker_url: str, vhost: str,
              tmp_path: Path) -> Outcome:  # fmt: skip
    try:
        outcome = await run_scenario(
            scenario, database_url=database_url, broker_url=broker_url, vhost=vhost,
            tmp_path=tmp_path,
        )  # fmt: skip
    finally:
        if scenario.touches_services:  # whatever happened, leave both services as they were
            await _restoring(services.ensure_services)
            await _restoring(services.rabbitmq_clear_memory_alarm)
    await assert_guarantees(scenario, outcome, broker_url)
    return outcome


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(s, id=s.name, marks=[pytest.mark.stops_services] if s.touches_services else [])
        for s in SCENARIOS
    ],
)
async def test_no_accepted_event_is_lost(
    scenario: Scenario, database_url: str, broker_url: str, vhost: str, tmp_path: Path
) -> None:
    await run(scenario, database_url, broker_url, vhost, tmp_path)


async def assert_guarantees(scenario: Scenario, outcome: Outcome, broker_url: str) -> None:
    """The pass criteria every scenario is held to."""
    report, service, ctx = outcome.report, outcome.service, outcome.context
    t = service.timings
    recovery = "-" if t.recovery_seconds is None else f"{t.recovery_seconds:.2f} s"
    print(f"\n{scenario.name}: {report.summary()}; recovery {recovery}; "
          f"drain {t.drain_seconds:.1f} s")  # fmt: skip
    log_tail = "\n" + service.log()[-5000:]
    assert report.accepted == scenario.events, report.summary()
    assert report.unknown_left == 0, report.summary()
    # every accepted event is in Postgres, every delivery of it received or DEAD with a reason
    assert report.ok(scenario.max_duplicates), report.summary() + log_tail
    # the receivers always answer 200: only what the scenario kills may die
    expected_dead = scenario.expect_dead(outcome) if scenario.expect_dead else set()
    dead = {d for d, (status, _) in outcome.final_states.items() if status == "DEAD"}
    assert dead == expected_dead, report.summary() + log_tail
    # while Postgres was down, every answer was 503 with Retry-After, never 202
    assert outage_violations(ctx.ledger.observations, ctx.outages) == []
    during = answered_during(ctx.ledger.observations, ctx.outages)
    if ctx.outages:
        assert during, "no request was answered while Postgres was down"
        print(f"{len(during)} requests answered 503 with Retry-After while Postgres was down")
    if scenario.fault is not None:  # the first delivery after the heal, without a restart
        assert t.recovery_seconds is not None, "nothing was delivered after the heal"
        assert t.recovery_seconds < 30, t
    if scenario.fault is publish_poison:  # each poison message ended in the dead-letter queue
        with trio.fail_after(30):
            await poll(lambda: _depth_is(broker_url, len(POISON)))
    # no component crashed (restarts after a lost broker or database are by design), and the
    # process ran until the end and stopped gracefully
    assert crash_lines(service.log()) == []
    for text in scenario.log_has:
        assert text in service.log(), f"{text!r} is not in the log" + log_tail
    for text in scenario.log_lacks:
        assert text not in service.log(), f"{text!r} is in the log" + log_tail
    assert service.exit_code == 0, log_tail


async def test_an_adapter_bug_kills_only_the_marked_deliveries(
    database_url: str, broker_url: str, vhost: str, tmp_path: Path
) -> None:
    """Panic isolation, in detail: each marked webhook delivery ends DEAD with a ``panic``
    attempt naming the bug and its message in the dead-letter queue; the worker group never
    restarted; the email channel got every event, marked or not."""
    scenario = ADAPTER_BUG
    outcome = await run(scenario, database_url, broker_url, vhost, tmp_path)
    killed = marked_webhook_deliveries(outcome)
    assert len(killed) == scenario.events // 10
    assert not killed & set(outcome.webhook_ids)  # the raising adapter sent nothing for them
    for delivery_id in killed:
        status, last_error = outcome.final_states[delivery_id]
        assert status == "DEAD"
        assert (
            last_error == f"adapter raised AdapterBug: injected bug: the payload carries {MARKER!r}"
        )
    rows = await sql(
        database_url,
        "SELECT outcome, count(*) AS n FROM delivery_attempts WHERE delivery_id = ANY($1::uuid[]) "
        "GROUP BY outcome", list(killed),
    )  # fmt: skip
    assert {r["outcome"]: r["n"] for r in rows} == {"panic": len(killed)}
    with trio.fail_after(30):
        await poll(lambda: _depth_is(broker_url, len(killed)))
    emails = {d for d, kind in outcome.delivery_channels.items() if kind == "email"}
    assert len(emails) == scenario.events
    assert emails <= set(outcome.email_ids)
    assert "workers.webhook failed" not in outcome.service.log()


async def _depth_is(broker_url: str, depth: int) -> bool:
    return await dead_letter_depth(broker_url) == depth
