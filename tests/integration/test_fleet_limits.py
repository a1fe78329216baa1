"""Rate limits hold for the whole fleet: two ``notifier run`` processes (every role) against one
database and one vhost, a fake Bot API and a webhook receiver in the test process.

One pair of processes runs the three scenarios at once (each is slow by nature):

- 20 messages to one Telegram chat arrive no faster than one per second;
- 50 messages to a webhook channel limited to 5/s arrive no faster than that, every one
  delivered at attempt 1 (a rate-limited message waits in a delay tier, its attempt unused);
- a burst of events from one API key, spread over both processes, is answered 429 past the
  key's limit, with the same total admitted as the same burst sent to one process.

Each process delivers a share, so the limits were kept between processes, not within one.
Times are taken where the requests arrive; the buckets keep Postgres's time of each take, and a
call follows its take by a moment that varies with the load, so the bounds allow for that.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from notifier.testing import open_fake_bot_api, open_sink
from tests.chaos.harness import free_port, write_config
from tests.integration.conftest import create_tenant, poll, scalar, sql
from tests.integration.test_shutdown import read_log, wait_ready

pytestmark = pytest.mark.slow

TOKEN = "424242:AAF-fleet_limits_token"
TOKEN_ENV = "TEST_FLEET_BOT_TOKEN"
CHAT = 4242
TELEGRAM_BURST = 20
WEBHOOK_BURST = 50
WEBHOOK_RATE = 5
# per API key; the burst takes a whole batch (ingest.max_batch_events), the one of 70 below
INGEST_RATE, INGEST_BURST = 0.5, 70
INGEST_REQUESTS = 100
# Arrival times jitter around the times the tokens were taken by this much at most (a loaded
# machine, two notifier processes on two cores): two arrivals k tokens apart are at least
# k periods apart, less twice this.
JITTER_SECONDS = 0.15


def config_sections(
    database_url: str, broker_url: str, port: int, bot_url: str
) -> dict[str, dict[str, Any]]:
    return {
        "service": {"shutdown_grace_seconds": 5},
        "database": {"url": database_url, "pool_max_size": 10},
        "broker": {"url": broker_url},
        "ingest": {
            "bind": f"127.0.0.1:{port}", "rate_limit_per_second": INGEST_RATE,
            "rate_limit_burst": INGEST_BURST, "max_batch_events": INGEST_BURST,
        },
        "relay": {"poll_interval_seconds": 0.5},
        "retry": {"base_seconds": 1, "max_seconds": 5, "tiers_seconds": [1, 2, 5]},
        "workers.webhook": {
            "concurrency": 8, "prefetch": 16, "allow_private_networks": True,
        },
        "workers.telegram": {
            "concurrency": 8, "prefetch": 16, "api_base_url": bot_url, "bot_token_env": TOKEN_ENV,
        },
        "maintenance": {"interval_seconds": 5},
        "logging": {"format": "console", "level": "INFO"},
    }  # fmt: skip


@asynccontextmanager
async def notifier_process(
    tmp_path: Path, name: str, sections: dict[str, dict[str, Any]]
) -> AsyncIterator[tuple[str, Path]]:
    """``notifier run`` (every role) as a child process; its base URL and log. SIGTERM on exit,
    and the exit must be clean."""
    config = write_config(tmp_path / f"{name}.toml", sections)
    log = tmp_path / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    env[TOKEN_ENV] = TOKEN
    with log.open("ab") as out:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "notifier", "run", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    base = f"http://{sections['ingest']['bind']}"
    try:
        await wait_ready(base, process, log)
        yield base, log
    finally:
        if process.returncode is None:
            process.terminate()
        with trio.move_on_after(30):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, read_log(log)


def delivered_in(log: Path, delivery_ids: set[str]) -> int:
    """How many of ``delivery_ids`` the process of ``log`` delivered."""
    found = re.findall(r"delivery (\S+) attempt \d+: delivered", read_log(log))
    return len(set(found) & delivery_ids)


def assert_paced(times: Sequence[float], per_second: int) -> None:
    """No more than ``per_second`` of ``times`` in any second, less the jitter: the arrivals
    ``per_second * k`` apart are ``k`` seconds apart at least (``2 * JITTER_SECONDS`` less)."""
    ordered = sorted(times)
    for i, j in itertools.combinations(range(len(ordered)), 2):
        k = (j - i) // per_second
        assert ordered[j] - ordered[i] >= k - 2 * JITTER_SECONDS, (i, j, ordered)


async def burst(bases: Sequence[str], key: str) -> list[httpx.Response]:
    """``INGEST_REQUESTS`` single events at once, spread over ``bases`` in turn."""
    answers: list[httpx.Response] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=b, headers=headers, timeout=30)
            )
            for b in bases
        ]

        async def post(client: httpx.AsyncClient, n: int) -> None:
            body = {"type": "burst", "payload": {"n": n}}  # the key has no channel
            answers.append(await client.post("/v1/events", json=body))

        async with trio.open_nursery() as nursery:
            for n, client in zip(range(INGEST_REQUESTS), itertools.cycle(clients), strict=False):
                nursery.start_soon(post, client, n)
    return answers


def admitted(answers: list[httpx.Response]) -> int:
    for refused in (a for a in answers if a.status_code == 429):
        assert refused.json()["error"]["code"] == "rate_limited"
        assert int(refused.headers["Retry-After"]) >= 1
    assert {a.status_code for a in answers} <= {202, 429}, [a.text for a in answers]
    return sum(1 for a in answers if a.status_code != 429)


async def test_two_processes_keep_every_limit_for_the_fleet(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    senders = await create_tenant(database_url)
    burst_two, burst_one = await create_tenant(database_url), await create_tenant(database_url)
    async with (
        open_fake_bot_api(TOKEN) as bot,
        open_sink() as sink,
        AsyncExitStack() as stack,
    ):  # fmt: skip
        procs = []
        for name in ("a", "b"):
            sections = config_sections(database_url, broker_url, free_port(), bot.url)
            procs.append(
                await stack.enter_async_context(notifier_process(tmp_path, name, sections))
            )
        (base_a, log_a), (base_b, log_b) = procs
        # The ingest bursts first, over both processes and over one (while nothing else keeps
        # this process busy: its receivers time the deliveries).
        started = trio.current_time()
        two = admitted(await burst([base_a, base_b], burst_two))
        one = admitted(await burst([base_a], burst_one))
        elapsed = trio.current_time() - started
        refill = INGEST_RATE * elapsed  # what came back while the bursts were answered
        assert INGEST_BURST <= two <= INGEST_BURST + refill + 1
        assert INGEST_BURST <= one <= INGEST_BURST + refill + 1
        assert abs(two - one) <= refill + 1

        headers = {"Authorization": f"Bearer {senders}"}
        async with httpx.AsyncClient(base_url=base_a, headers=headers, timeout=30) as api:
            chat = await api.post(
                "/v1/channels",
                json={"type": "telegram", "config": {"chat_id": CHAT}, "max_attempts": 1},
            )
            hook = await api.post(
                "/v1/channels",
                json={"type": "webhook", "config": {"url": sink.url}, "max_attempts": 1,
                      "rate_limit_per_second": WEBHOOK_RATE},
            )  # fmt: skip
            assert (chat.status_code, hook.status_code) == (201, 201), (chat.text, hook.text)
            assert hook.json()["rate_limit_per_second"] == WEBHOOK_RATE
            events = [
                {"type": "fleet", "payload": {"n": n}, "channel_ids": [chat.json()["id"]]}
                for n in range(TELEGRAM_BURST)
            ] + [
                {"type": "fleet", "payload": {"n": n}, "channel_ids": [hook.json()["id"]]}
                for n in range(WEBHOOK_BURST)
            ]  # one batch: it spends 70 of the key's events, a whole burst
            posted = await api.post("/v1/events/batch", json={"events": events})
            assert posted.status_code == 202, posted.text

        ids = {d["id"]: d["channel_type"] for e in posted.json()["events"] for d in e["deliveries"]}

        async def all_delivered() -> bool:
            done = await scalar(
                database_url,
                "SELECT count(*) FROM deliveries WHERE status = 'DELIVERED' AND attempt = 1",
            )
            return bool(done == TELEGRAM_BURST + WEBHOOK_BURST)

        with trio.fail_after(75):
            await poll(all_delivered, interval_seconds=0.25)

    # 20 messages to one chat: a second apart, whichever process sent them.
    chat_times = [c.at for c in bot.sent(CHAT)]
    assert len(chat_times) == TELEGRAM_BURST == len(bot.calls)
    assert_paced(chat_times, 1)

    # 50 webhooks at 5/s: never more than 5 within a second, so the burst took 9 s at least.
    hook_times = [r.at for r in sink.received]
    assert len(hook_times) == WEBHOOK_BURST
    assert_paced(hook_times, WEBHOOK_RATE)

    # Every delivery at attempt 1: the waits used no attempt.
    rows = await sql(
        database_url,
        "SELECT attempt, outcome FROM delivery_attempts WHERE delivery_id = ANY($1)",
        [uuid.UUID(i) for i in ids],
    )
    assert {r["attempt"] for r in rows} == {1}
    assert sum(1 for r in rows if r["outcome"] == "delivered") == len(ids)
    assert {r["outcome"] for r in rows} == {"delivered", "rate_limited"}

    # Both processes delivered a share of each burst: the limits held between them.
    for channel_type in ("telegram", "webhook"):
        of_type = {i for i, t in ids.items() if t == channel_type}
        shares = [delivered_in(log, of_type) for log in (log_a, log_b)]
        assert sum(shares) == len(of_type)
        assert min(shares) > 0, (channel_type, shares)
