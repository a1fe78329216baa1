"""The telegram channel end to end: the whole service in this process against the real Postgres
and RabbitMQ, delivering to a fake Bot API (``notifier.testing.FakeBotApi``).

The adapter is built by the registry from ``[workers.telegram]``, its token read from the
environment variable the config names (set per test with ``monkeypatch``, removed afterwards).
Every test runs with every logger at DEBUG, and afterwards the bot token must be nowhere: not in
a log record, not in a delivery's ``last_error``, an attempt's error or excerpt, or a disabled
channel's reason.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest
import trio

from notifier.config import Config
from notifier.store import open_store
from notifier.testing import (
    BOT_BLOCKED,
    CHAT_NOT_FOUND,
    SERVER_ERROR,
    BotApiReply,
    open_fake_bot_api,
)
from tests.integration.conftest import (
    create_tenant,
    delivery,
    make_config,
    outcomes,
    poll,
    run_notifier,
    sql,
    wait_status,
)

TOKEN = "987654321:AAF-integration_token_never_logged"
SECRET_PART = TOKEN.split(":", 1)[1]
TOKEN_ENV = "TEST_TELEGRAM_BOT_TOKEN"
FAST_RETRY = {"base_seconds": 1, "max_seconds": 30, "tiers_seconds": [1, 2, 5, 30]}


@pytest.fixture(autouse=True)
def _token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # for this test only: monkeypatch undoes it


def stored_texts(database_url: str) -> list[str]:
    """Every error, excerpt, disabled reason and channel config stored in the database."""

    async def run() -> list[str]:
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch(
                "SELECT coalesce(last_error, '') FROM deliveries"
                " UNION ALL SELECT coalesce(error, '') || coalesce(response_excerpt, '')"
                " FROM delivery_attempts"
                " UNION ALL SELECT coalesce(disabled_reason, '') || config::text FROM channels"
            )
        finally:
            await conn.close()
        return [r[0] for r in rows]

    return asyncio.run(run())


@pytest.fixture(autouse=True)
def _the_token_leaks_nowhere(caplog: pytest.LogCaptureFixture, database_url: str) -> Iterator[None]:
    """Every logger at DEBUG during the test; afterwards no log record and nothing stored in
    the database holds the token. (Sync: pytest-trio does not run autouse async fixtures.)"""
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "notifier"):
        caplog.set_level(logging.DEBUG, logger=name)
    yield
    records = caplog.get_records("setup") + caplog.get_records("call")
    assert records
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    for record in records:
        assert SECRET_PART not in formatter.format(record), record.name
    stored = stored_texts(database_url)
    assert stored
    assert [text for text in stored if SECRET_PART in text] == []


def telegram_config(database_url: str, broker_url: str, api: str, **telegram: Any) -> Config:
    workers = {
        "telegram": {
            "concurrency": 4, "prefetch": 8, "api_base_url": api, "bot_token_env": TOKEN_ENV,
            **telegram,
        }
    }  # fmt: skip
    return make_config(database_url, broker_url, retry=FAST_RETRY, workers=workers)


async def create_channel(api: httpx.AsyncClient, chat_id: int | str, **fields: Any) -> str:
    config = {"chat_id": chat_id, **fields.pop("config", {})}
    body = {"type": "telegram", "config": config, "event_types": ["*"], **fields}
    resp = await api.post("/v1/channels", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


async def post_event(api: httpx.AsyncClient, **fields: Any) -> dict[str, str]:
    """POST one event; return its delivery ids by channel id."""
    body = {"type": "order.created", "payload": {"order": 1}, **fields}
    resp = await api.post("/v1/events", json=body)
    assert resp.status_code == 202, resp.text
    return {d["channel_id"]: d["id"] for d in resp.json()["deliveries"]}


async def test_an_event_is_sent_to_the_chat_with_the_rendered_text(
    database_url: str, broker_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = await create_tenant(database_url)
    async with open_fake_bot_api(TOKEN) as bot:
        config = telegram_config(database_url, broker_url, bot.url)
        async with run_notifier(config) as running, running.client(key) as api:
            templated = await create_channel(
                api,
                4242,
                config={"text_template": "Order {{ payload.order }} is {{ payload.status }}"},
            )
            plain = await create_channel(api, "@my_channel")
            ids = await post_event(api, payload={"order": 7, "status": "paid"})
            with trio.fail_after(30):
                for delivery_id in ids.values():
                    await wait_status(database_url, delivery_id, "DELIVERED")
    assert sorted(ids) == sorted([templated, plain])
    by_chat = {call.chat_id: call for call in bot.sent()}
    assert set(by_chat) == {4242, "@my_channel"}
    assert all(call.token == TOKEN and call.method == "sendMessage" for call in bot.calls)
    assert by_chat[4242].text == "Order 7 is paid"
    default_text = by_chat["@my_channel"].text
    assert default_text is not None
    assert default_text.startswith("order.created\n\n")
    assert '"status": "paid"' in default_text
    (row,) = await sql(
        database_url,
        "SELECT outcome, status_code, response_excerpt FROM delivery_attempts"
        " WHERE delivery_id = $1",
        uuid.UUID(ids[templated]),
    )
    assert (row["outcome"], row["status_code"]) == ("delivered", 200)
    assert '"ok": true' in row["response_excerpt"]
    # httpx logged the requests (every logger is at DEBUG), with the token scrubbed.
    logged = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert any("/bot***/sendMessage" in m for m in logged), logged


async def test_a_429_is_retried_after_its_retry_after_and_a_500_after_the_backoff(
    database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    async with open_fake_bot_api(TOKEN) as bot:
        bot.script(100, BotApiReply.too_many_requests(2))
        bot.script(200, SERVER_ERROR)
        config = telegram_config(database_url, broker_url, bot.url)
        async with run_notifier(config) as running, running.client(key) as api:
            limited = await create_channel(api, 100)
            failing = await create_channel(api, 200)
            ids = await post_event(api)
            with trio.fail_after(30):
                for delivery_id in ids.values():
                    await wait_status(database_url, delivery_id, "DELIVERED")
    first, second = [c for c in bot.calls if c.chat_id == 100]
    assert (first.status, second.status) == (429, 200)
    # The backoff after attempt 1 is 1 s; Telegram's retry_after (2 s) is longer and wins.
    assert 2.0 <= second.at - first.at < 5.0
    assert await outcomes(database_url, ids[limited]) == [(1, "retry"), (2, "delivered")]
    row = await delivery(database_url, ids[limited])
    assert (row["attempt"], row["last_error"]) == (2, None)
    attempts = await sql(
        database_url,
        "SELECT error, status_code FROM delivery_attempts WHERE delivery_id = $1 ORDER BY id",
        uuid.UUID(ids[limited]),
    )
    assert attempts[0]["status_code"] == 429
    assert attempts[0]["error"] == "HTTP 429: Too Many Requests: retry after 2"
    first, second = [c for c in bot.calls if c.chat_id == 200]
    assert (first.status, second.status) == (500, 200)
    assert 1.0 <= second.at - first.at < 4.0
    assert await outcomes(database_url, ids[failing]) == [(1, "retry"), (2, "delivered")]


async def test_messages_to_one_chat_are_spread_a_second_apart_without_using_attempts(
    database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    async with open_fake_bot_api(TOKEN) as bot:
        config = telegram_config(database_url, broker_url, bot.url)
        async with run_notifier(config) as running, running.client(key) as api:
            chat_a = await create_channel(api, 111, max_attempts=1)
            chat_b = await create_channel(api, 222, max_attempts=1)
            events = [await post_event(api, payload={"order": n}) for n in range(3)]
            with trio.fail_after(30):
                for ids in events:
                    for delivery_id in ids.values():
                        await wait_status(database_url, delivery_id, "DELIVERED")
    assert {chat_a, chat_b} == set(events[0])
    assert len(bot.calls) == 6  # every call was a delivery: the limiter spared Telegram's 429s
    starts = {}
    for chat in (111, 222):
        times = sorted(c.at for c in bot.sent(chat))
        assert len(times) == 3
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(gap >= 0.9 for gap in gaps), (chat, gaps)  # 1 s apart, less network jitter
        starts[chat] = times[0]
    # The chats are limited separately: the second chat did not wait for the first.
    assert abs(starts[111] - starts[222]) < 0.9
    all_ids = [uuid.UUID(d) for ids in events for d in ids.values()]
    attempts = await sql(
        database_url,
        "SELECT attempt, outcome FROM delivery_attempts WHERE delivery_id = ANY($1)",
        all_ids,
    )
    delivered = [r for r in attempts if r["outcome"] == "delivered"]
    limited = [r for r in attempts if r["outcome"] == "rate_limited"]
    assert len(delivered) == 6
    assert len(limited) >= 4  # at least the 2nd and 3rd message of each chat waited
    assert {r["attempt"] for r in attempts} == {1}
    rows = await sql(
        database_url, "SELECT status, attempt FROM deliveries WHERE id = ANY($1)", all_ids
    )
    assert {(r["status"], r["attempt"]) for r in rows} == {("DELIVERED", 1)}


# Arrival times jitter around the times their tokens were taken by this much at most.
JITTER_SECONDS = 0.15
FLOOD_CHATS = 10


async def test_a_tenant_flooding_the_bot_is_held_to_its_share_by_the_fleets_buckets(
    database_url: str, broker_url: str
) -> None:
    """Two worker groups (two services, two pools: a fleet of two) send for one bot, each to a
    Bot API of its own so that each one's share shows. A tenant floods ten chats at once; its
    share (2/s) holds across both, and another tenant's messages, to two of the same chat ids,
    take their tokens at the first ask, while the bot (8/s) has tokens left."""
    flooder, other = await create_tenant(database_url), await create_tenant(database_url)
    limits = {"per_bot_per_second": 8, "per_tenant_per_second": 2}
    async with open_fake_bot_api(TOKEN) as bot_1, open_fake_bot_api(TOKEN) as bot_2:

        async def flood_started() -> bool:
            return bool(bot_1.calls or bot_2.calls)

        first = telegram_config(database_url, broker_url, bot_1.url, **limits)
        second = telegram_config(database_url, broker_url, bot_2.url, **limits)
        async with (
            run_notifier(first) as running,
            run_notifier(second, roles=("workers",)),
            running.client(flooder) as api_a,
            running.client(other) as api_b,
        ):
            for chat in range(1, FLOOD_CHATS + 1):
                await create_channel(api_a, chat, max_attempts=1)
            for chat in (1, 2):
                await create_channel(api_b, chat, max_attempts=1)
            # one delivery to each of the ten chats; the payload is in the text sent
            flood = await post_event(api_a, payload={"from": "flooder"})
            with trio.fail_after(30):
                await poll(flood_started, interval_seconds=0.01)
            others = await post_event(api_b, payload={"from": "other"})
            with trio.fail_after(30):
                for delivery_id in [*others.values(), *flood.values()]:
                    await wait_status(database_url, delivery_id, "DELIVERED")
        calls = bot_1.sent() + bot_2.sent()
    assert len(calls) == FLOOD_CHATS + 2 == len(bot_1.calls) + len(bot_2.calls)
    # both groups sent: the share held between them
    assert bot_1.sent()
    assert bot_2.sent()
    rows = await sql(
        database_url,
        "SELECT d.id, c.tenant_id, a.attempt, a.outcome"
        " FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id"
        " JOIN channels c ON c.id = d.channel_id",
    )
    assert {r["attempt"] for r in rows} == {1}
    tenant_a = {r["tenant_id"] for r in rows if str(r["id"]) in flood.values()}
    tenant_b = {r["tenant_id"] for r in rows if str(r["id"]) in others.values()}
    # The other tenant was never held: each of its messages took its tokens at the first ask.
    assert [r["outcome"] for r in rows if r["tenant_id"] in tenant_b] == ["delivered"] * 2
    # The flood waited for its share (the bot alone would have let 8 go at once).
    assert any(r["outcome"] == "rate_limited" for r in rows if r["tenant_id"] in tenant_a)
    # Its ten messages arrived at 2/s at most: any two arrivals two apart are a second apart.
    a_times = sorted(c.at for c in calls if "flooder" in (c.text or ""))
    assert len(a_times) == FLOOD_CHATS
    assert sorted(c.chat_id for c in calls if "other" in (c.text or "")) == [1, 2]
    for earlier, later in zip(a_times, a_times[2:], strict=False):
        assert later - earlier >= 1 - 2 * JITTER_SECONDS, a_times
    # The buckets are the tenants' own: a chat bucket and a share per tenant, one for the bot.
    bot_key = f"telegram:{TOKEN.split(':')[0]}"
    keys = {r["key"] for r in await sql(database_url, "SELECT key FROM rate_buckets")}
    (a_id,), (b_id,) = tenant_a, tenant_b
    assert keys == {
        bot_key, f"{bot_key}:tenant:{a_id}", f"{bot_key}:tenant:{b_id}",
        *(f"{bot_key}:tenant:{a_id}:chat:{n}" for n in range(1, FLOOD_CHATS + 1)),
        f"{bot_key}:tenant:{b_id}:chat:1", f"{bot_key}:tenant:{b_id}:chat:2",
    }  # fmt: skip
    # Maintenance deletes them like any other bucket once they have been full for a while.
    await sql(database_url, "UPDATE rate_buckets SET full_at = now() - interval '2 minutes'")
    async with open_store(database_url) as store:
        assert await store.clean_rate_buckets(limit=100) == len(keys)


async def test_chat_not_found_and_a_blocked_bot_are_dead_and_the_blocked_channel_is_disabled(
    database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    async with open_fake_bot_api(TOKEN) as bot:
        bot.script(404404, CHAT_NOT_FOUND, times=None)
        bot.script("@blocked_bot_chat", BOT_BLOCKED, times=None)
        config = telegram_config(database_url, broker_url, bot.url)
        async with run_notifier(config) as running, running.client(key) as api:
            missing = await create_channel(api, 404404)
            blocked = await create_channel(api, "@blocked_bot_chat")
            ids = await post_event(api)
            with trio.fail_after(30):
                for delivery_id in ids.values():
                    await wait_status(database_url, delivery_id, "DEAD")
    assert len(bot.calls) == 2  # permanent: no second try
    for channel_id, error in [
        (missing, "HTTP 400: Bad Request: chat not found"),
        (blocked, "HTTP 403: Forbidden: bot was blocked by the user"),
    ]:
        assert await outcomes(database_url, ids[channel_id]) == [(1, "dead")]
        row = await delivery(database_url, ids[channel_id])
        assert (row["attempt"], row["last_error"]) == (1, error)
    channels = await sql(
        database_url, "SELECT id, enabled, disabled_reason FROM channels WHERE id = ANY($1)",
        [uuid.UUID(missing), uuid.UUID(blocked)],
    )  # fmt: skip
    state = {str(r["id"]): (r["enabled"], r["disabled_reason"]) for r in channels}
    assert state[missing] == (True, None)
    assert state[blocked] == (False, "HTTP 403: Forbidden: bot was blocked by the user")


async def test_an_unreachable_bot_api_is_retried_then_dead_without_the_token_in_the_error(
    database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    # A port bound but not listening refuses connections, and nothing else can take it meanwhile
    # (a port merely closed again could be bound by notifier's own ingest server).
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        unreachable = f"http://127.0.0.1:{closed.getsockname()[1]}"
        config = telegram_config(database_url, broker_url, unreachable, timeout_seconds=2)
        async with run_notifier(config) as running, running.client(key) as api:
            channel = await create_channel(api, 5, max_attempts=2)
            ids = await post_event(api)
            with trio.fail_after(30):
                await wait_status(database_url, ids[channel], "DEAD")
    assert await outcomes(database_url, ids[channel]) == [(1, "retry"), (2, "dead")]
    row = await delivery(database_url, ids[channel])
    assert row["last_error"].startswith("connection failed: ConnectError")


async def test_a_channel_with_a_bad_chat_id_is_refused_naming_the_field(
    database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    async with open_fake_bot_api(TOKEN) as bot:
        config = telegram_config(database_url, broker_url, bot.url)
        async with run_notifier(config) as running, running.client(key) as api:
            for chat_id, field in [("@no", "config.chat_id"), (1.5, "config.chat_id")]:
                resp = await api.post(
                    "/v1/channels", json={"type": "telegram", "config": {"chat_id": chat_id}}
                )
                assert resp.status_code == 422, resp.text
                assert resp.json()["error"]["message"].startswith(f"{field}: ")
            resp = await api.post(
                "/v1/channels",
                json={"type": "telegram", "config": {"chat_id": 1, "text_template": "{% if %}"}},
            )
            assert resp.status_code == 422, resp.text
            assert resp.json()["error"]["message"].startswith("config.text_template: ")
            # One channel so the leak check has a row to look at.
            await create_channel(api, 1)
        assert bot.calls == []
