"""No secret reaches a log, a stored error or an error report: one run of the whole service with
all three channel types, every logger at DEBUG, and deliveries that succeed, retry and die.

The secrets: the tenant's API key (and a wrong one somebody sent), the webhook signing secrets
before and after a rotation, a user-set ``Authorization`` header of a webhook channel, the SMTP
password and the Telegram bot token.
"""

from __future__ import annotations

import io
import json
import logging
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import trio

from notifier.adapters.webhook import generate_secret
from notifier.logs import make_handler
from notifier.testing import (
    BOT_BLOCKED,
    BotApiReply,
    Received,
    RecordingReporter,
    open_fake_bot_api,
    open_sink,
)
from notifier.testing_smtp import open_smtp_server
from tests.integration.conftest import (
    create_tenant,
    make_config,
    poll,
    run_notifier,
    sql,
    verify_all,
)

OLD_SECRET, NEW_SECRET = generate_secret(), generate_secret()
HEADER_TOKEN = "hdr-4c1d8e0b-never-logged"
SMTP_USER, SMTP_PASSWORD = "mailer", "smtp-9b2f71aa-never-logged"
BOT_TOKEN = "123456789:AAH-full_run_token_never_logged"
PASSWORD_ENV, TOKEN_ENV = "TEST_SECRETS_SMTP_PASSWORD", "TEST_SECRETS_BOT_TOKEN"


def secret_forms(secrets: dict[str, str]) -> dict[str, str]:
    """Each secret and the part of it that is the secret on its own (a ``whsec_`` secret's key
    material, a bot token's part after the bot id)."""
    forms = dict(secrets)
    for name, value in secrets.items():
        if value.startswith("whsec_"):
            forms[f"{name} key material"] = value.removeprefix("whsec_")
        if name == "bot token":
            forms["bot token secret part"] = value.split(":", 1)[1]
    return forms


def leaks(texts: Iterator[str], secrets: dict[str, str]) -> list[tuple[str, str]]:
    return [(name, text) for text in texts for name, v in secrets.items() if v in text]


def record_texts(records: list[logging.LogRecord]) -> Iterator[str]:
    """What any handler could write for each record: the message, its arguments, the exception
    with its chain and the stack, and every extra attribute."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    for record in records:
        yield formatter.format(record)
        yield repr(record.args)
        if record.exc_info and record.exc_info[1] is not None:
            yield "".join(traceback.format_exception(record.exc_info[1]))
        yield repr(vars(record))


def json_lines(records: list[logging.LogRecord]) -> list[dict[str, Any]]:
    """The records as the service's JSON log handler writes them, parsed back."""
    out = io.StringIO()
    handler = make_handler("json", out)
    for record in records:
        handler.handle(record)
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.fixture
def everything_at_debug(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every logger that exists (and every one created later, through the root) at DEBUG;
    ``caplog`` puts the levels back afterwards."""
    caplog.set_level(logging.DEBUG)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def receiver() -> Callable[[Received], tuple[int, dict[str, str], bytes]]:
    """At /hook: fails each delivery's first attempt, then accepts it. At /refuses: 401."""
    seen: set[str] = set()

    def respond(received: Received) -> tuple[int, dict[str, str], bytes]:
        if received.path.endswith("/refuses"):
            return 401, {}, b"unauthorized"
        first = received.headers["webhook-id"] not in seen
        seen.add(received.headers["webhook-id"])
        return (500 if first else 200), {}, b"ack"

    return respond


async def test_no_secret_is_logged_stored_or_reported_over_a_full_run(
    database_url: str,
    broker_url: str,
    monkeypatch: pytest.MonkeyPatch,
    everything_at_debug: pytest.LogCaptureFixture,
) -> None:
    caplog = everything_at_debug
    monkeypatch.setenv(PASSWORD_ENV, SMTP_PASSWORD)
    monkeypatch.setenv(TOKEN_ENV, BOT_TOKEN)
    api_key = await create_tenant(database_url)
    wrong_key = f"nk_wrong_{uuid.uuid4().hex}"
    reporter = RecordingReporter()
    async with (
        open_sink(receiver()) as sink,
        open_smtp_server(
            credentials=(SMTP_USER, SMTP_PASSWORD),
            refuse={"gone@example.com": "550 5.1.1 No such user"},
        ) as smtp,
        open_fake_bot_api(BOT_TOKEN) as bot,
    ):
        bot.script(100, BotApiReply.too_many_requests(1))
        bot.script(200, BOT_BLOCKED, times=None)
        workers: dict[str, Any] = {
            "webhook": {"concurrency": 4, "prefetch": 8, "allow_private_networks": True},
            "email": {"smtp_port": smtp.port, "smtp_username": SMTP_USER,
                      "smtp_password_env": PASSWORD_ENV, "from": "n@mail.example.com"},
            "telegram": {"api_base_url": bot.url, "bot_token_env": TOKEN_ENV},
        }  # fmt: skip
        retry = {"base_seconds": 1, "max_seconds": 5, "tiers_seconds": [1, 2, 5]}
        config = make_config(database_url, broker_url, workers=workers, retry=retry)
        async with run_notifier(config, reporter=reporter) as running:
            async with running.client(wrong_key) as intruder:
                assert (await intruder.get("/v1/channels")).status_code == 401
            async with running.client(api_key) as api:
                good = await create(api, "webhook", {
                    "url": sink.url, "secret": OLD_SECRET,
                    "headers": {"Authorization": f"Bearer {HEADER_TOKEN}"},
                })  # fmt: skip
                await create(api, "webhook", {"url": sink.url.replace("/hook", "/refuses")})
                await create(api, "email", {"to": "ops@example.com"})
                await create(api, "email", {"to": "gone@example.com"})
                await create(api, "telegram", {"chat_id": 100})
                await create(api, "telegram", {"chat_id": 200})
                first = await post_event(api, 1)
                with trio.fail_after(60):
                    await all_settled(database_url, first)
                rotated = await api.patch(
                    f"/v1/channels/{good}",
                    json={"config": {"url": sink.url, "secret": NEW_SECRET,
                                     "headers": {"Authorization": f"Bearer {HEADER_TOKEN}"}}},
                )  # fmt: skip
                assert rotated.status_code == 200, rotated.text
                second = await post_event(api, 2)
                with trio.fail_after(60):
                    await all_settled(database_url, second)

    statuses = await sql(database_url, "SELECT c.type, d.status, count(*) FROM deliveries d"
                         " JOIN channels c ON c.id = d.channel_id GROUP BY 1, 2")  # fmt: skip
    # Both outcomes for every type: each adapter ran its success and its failure paths.
    assert {(r[0], r[1]) for r in statuses} == {
        (t, s) for t in ("webhook", "email", "telegram") for s in ("DELIVERED", "DEAD")
    }
    assert await sql(database_url, "SELECT 1 FROM delivery_attempts WHERE outcome = 'retry'")
    delivered = [r for r in sink.received if r.path == "/hook"]
    verify_all(delivered[:2], OLD_SECRET)  # the first event's two attempts
    verify_all(delivered[2:], NEW_SECRET)  # after the rotation: signed with both secrets
    verify_all(delivered[2:], OLD_SECRET)
    assert [mail.login for mail in smtp.received] == [SMTP_USER, SMTP_USER]
    assert len(bot.sent(100)) == 2

    secrets = secret_forms({
        "API key": api_key, "wrong API key": wrong_key, "old webhook secret": OLD_SECRET,
        "new webhook secret": NEW_SECRET, "Authorization header": HEADER_TOKEN,
        "SMTP password": SMTP_PASSWORD, "bot token": BOT_TOKEN,
    })  # fmt: skip
    records = caplog.get_records("setup") + caplog.get_records("call")
    loggers = {r.name.split(".")[0] for r in records}
    assert {"notifier", "httpx", "httpcore", "aiormq"} <= loggers, loggers
    assert any(r.exc_info for r in records) or any(r.levelno >= logging.WARNING for r in records)
    found = leaks(record_texts(records), secrets)
    assert found == [], [(name, text[:2000]) for name, text in found[:3]]
    # aiormq logged the frames it sent, with the bodies (which hold channel configs) cut out
    assert any("<ChannelFrame: " in r.getMessage() for r in records if r.name.startswith("aiormq"))
    # What the service writes: the same records through its log handler, as JSON lines (after
    # the checks above, since the handler scrubs records in place).
    lines = json_lines(records)
    assert leaks((json.dumps(line) for line in lines), secrets) == []
    assert leaks((str(v) for line in lines for v in line.values()), secrets) == []
    outcomes = [line for line in lines if line["logger"] == "notifier.worker" and "outcome" in line]
    assert {"delivered", "retry", "dead"} <= {line["outcome"] for line in outcomes}
    assert all(isinstance(line["attempt"], int) and line["delivery_id"] for line in outcomes)

    stored = await sql(
        database_url,
        "SELECT coalesce(last_error, '') FROM deliveries"
        " UNION ALL SELECT coalesce(error, '') || coalesce(response_excerpt, '')"
        " FROM delivery_attempts UNION ALL SELECT coalesce(disabled_reason, '') FROM channels",
    )
    assert any(r[0] for r in stored)
    assert leaks((r[0] for r in stored), secrets) == []

    assert len(reporter.reports) >= 3  # a DEAD report per type at least
    reported = (
        f"{r.summary} {r.tags} {r.exc!r} {r.contexts} "  # a dead delivery's alert context too
        + ("".join(traceback.format_exception(r.exc)) if r.exc else "")
        for r in reporter.reports
    )
    assert leaks(reported, secrets) == []


async def create(api: httpx.AsyncClient, type_: str, config: dict[str, Any]) -> str:
    body = {"type": type_, "config": config, "event_types": ["*"], "max_attempts": 2}
    resp = await api.post("/v1/channels", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


async def post_event(api: httpx.AsyncClient, n: int) -> list[str]:
    resp = await api.post("/v1/events", json={"type": "order.created", "payload": {"n": n}})
    assert resp.status_code == 202, resp.text
    return [d["id"] for d in resp.json()["deliveries"]]


async def all_settled(database_url: str, ids: list[str]) -> None:
    async def settled() -> bool:
        rows = await sql(
            database_url,
            "SELECT count(*) FROM deliveries WHERE id = ANY($1::uuid[])"
            " AND status IN ('DELIVERED', 'DEAD')",
            [uuid.UUID(i) for i in ids],
        )
        return bool(rows[0][0] == len(ids))

    await poll(settled, interval_seconds=0.1)


STALE_TOKEN = "sk_test_51f0c2e7-stale-header"


async def test_a_stored_header_that_cannot_be_sent_kills_its_deliveries_and_leaks_nowhere(
    database_url: str, broker_url: str, everything_at_debug: pytest.LogCaptureFixture
) -> None:
    """Channels stored before the header rules (written here around the API): a value with a
    trailing space (which h11 refuses, quoting it) and a non-ASCII one (which httpx cannot
    encode). Each delivery ends DEAD at once naming the header, nothing is sent, no ERROR line
    is logged, and the value is in no log record, stored error or report."""
    caplog = everything_at_debug
    api_key = await create_tenant(database_url)
    reporter = RecordingReporter()
    stale = {"X-Api-Token": f"{STALE_TOKEN} ", "X-Team": f"café-{STALE_TOKEN}"}
    async with open_sink() as sink:
        retry = {"base_seconds": 1, "max_seconds": 1, "tiers_seconds": [1]}
        config = make_config(database_url, broker_url, retry=retry)
        async with (
            run_notifier(config, reporter=reporter) as running,
            running.client(api_key) as api,
        ):
            for name, value in stale.items():
                channel = await create(api, "webhook", {"url": sink.url, "headers": {name: "x"}})
                await sql(
                    database_url,
                    "UPDATE channels SET config = jsonb_set(config, ARRAY['headers', $1],"
                    " to_jsonb($2::text)) WHERE id = $3",
                    name, value, uuid.UUID(channel),
                )  # fmt: skip
            ids = await post_event(api, 1)
            with trio.fail_after(30):
                await all_settled(database_url, ids)

    assert sink.received == []
    rows = await sql(
        database_url,
        "SELECT d.status, d.last_error, a.outcome, a.error FROM deliveries d"
        " JOIN delivery_attempts a ON a.delivery_id = d.id ORDER BY d.last_error",
    )
    assert [(r[0], r[2]) for r in rows] == [("DEAD", "dead"), ("DEAD", "dead")]
    assert [r[1].split(": ")[0] for r in rows] == [
        "config.headers.X-Api-Token", "config.headers.X-Team",
    ]  # fmt: skip
    assert all(r[1] == r[3] for r in rows)
    records = caplog.get_records("setup") + caplog.get_records("call")
    assert [r.getMessage() for r in records if r.levelno >= logging.ERROR] == []
    secrets = {"stale header value": STALE_TOKEN}
    assert leaks(record_texts(records), secrets) == []
    assert leaks((str(v) for r in rows for v in r), secrets) == []
    reported = (f"{r.summary} {r.tags} {r.exc!r} {r.contexts}" for r in reporter.reports)
    assert leaks(reported, secrets) == []
