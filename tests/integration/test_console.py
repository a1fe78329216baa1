"""The console on the real Postgres: its pages read and change what the store's SQL holds
(filters, replay one and in bulk, channels, the test event, another tenant's ids), through an
in-process notifier serving only ingest, so that deliveries stay where the test puts them; and a
delivery's attempts as a whole notifier (workers too) recorded them."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from notifier.config import Config
from notifier.testing import Received, open_sink
from tests.integration.conftest import (
    Running,
    create_tenant,
    run_notifier,
    scalar,
    sql,
    wait_status,
)

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
HOOK = {"type": "webhook", "name": "hook", "config": {"url": "http://127.0.0.1:9/hook"}}


@asynccontextmanager
async def signed_in(running: Running, key: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client keeping cookies, as a browser, signed in with ``key``."""
    async with httpx.AsyncClient(base_url=running.base_url, timeout=10) as browser:
        page = await browser.get("/console/sign-in")
        token = CSRF.search(page.text)
        assert token
        form = {"api_key": key, "csrf": token.group(1)}
        resp = await browser.post("/console/sign-in", data=form)
        assert resp.status_code == 303, resp.text
        yield browser


async def post_form(browser: httpx.AsyncClient, path: str, form: dict[str, str]) -> httpx.Response:
    """``form`` posted with the token of the overview page."""
    token = CSRF.search((await browser.get("/console/")).text)
    assert token
    return await browser.post(path, data={**form, "csrf": token.group(1)})


async def seed(api: httpx.AsyncClient, events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    channel = await api.post("/v1/channels", json=HOOK)
    assert channel.status_code == 201, channel.text
    made = []
    for type_, payload in events:
        resp = await api.post("/v1/events", json={"type": type_, "payload": payload})
        assert resp.status_code == 202, resp.text
        made.append(resp.json()["deliveries"][0]["id"])
    return made


def listed(body: str) -> list[str]:
    return re.findall(r'href="/console/deliveries/([0-9a-f-]{36})" class="delivery-link"', body)


async def test_deliveries_are_filtered_and_replayed_in_bulk_on_postgres(
    config: Config, database_url: str
) -> None:
    key, other = await create_tenant(database_url), await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running:
        async with running.client(key) as api, running.client(other) as api_b:
            ours = await seed(api, [("order.created", {"n": 1}), ("user.x", {"n": 2}),
                                    ("order.paid", {"n": 3})])  # fmt: skip
            (theirs,) = await seed(api_b, [("order.created", {"n": 4})])
        await sql(database_url, "UPDATE deliveries SET status = 'DEAD'")
        async with signed_in(running, key) as browser:
            page = await browser.get("/console/deliveries", params={"status": "DEAD"})
            assert listed(page.text) == ours[::-1]
            page = await browser.get("/console/deliveries", params={"type": "order.*"})
            assert listed(page.text) == [ours[2], ours[0]]
            assert (await browser.get(f"/console/deliveries/{theirs}")).status_code == 404
            overview = (await browser.get("/console/")).text
            assert re.search(r'id="dead-count"><a [^>]*>3<', overview)  # not the other's
            since = {"status": "DEAD", "since": "2000-01-01T00:00", "until": "2999-01-01T00:00"}
            assert (
                listed((await browser.get("/console/deliveries", params=since)).text) == ours[::-1]
            )

            query = {"status": "DEAD", "type": "order.*"}
            confirm = await browser.get("/console/deliveries/replay", params=query)
            assert "<strong>2</strong> deliveries will be queued again" in confirm.text
            fields = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', confirm.text))
            del fields["csrf"]
            done = await post_form(browser, "/console/deliveries/replay", fields)
            assert "2 deliveries were queued again" in done.text
        statuses = dict(await sql(database_url, "SELECT id::text, status FROM deliveries"))
        assert [statuses[d] for d in ours] == ["PENDING", "DEAD", "PENDING"]
        assert statuses[theirs] == "DEAD"  # another tenant's: untouched


async def test_channels_are_changed_and_tested_on_postgres(
    config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running:
        async with running.client(key) as api:
            created = (await api.post("/v1/channels", json=HOOK)).json()
        channel_id, first_secret = created["id"], created["config"]["secret"]
        async with signed_in(running, key) as browser:
            page = await browser.get("/console/channels")
            assert channel_id in page.text
            assert first_secret not in page.text

            rotated = await post_form(browser, f"/console/channels/{channel_id}/rotate-secret", {})
            shown = re.search(r'id="new-secret">(whsec_[^<]+)<', rotated.text)
            assert shown
            stored = await scalar(
                database_url, "SELECT config FROM channels WHERE id = $1", uuid.UUID(channel_id)
            )
            assert shown.group(1) in str(stored)
            assert first_secret in str(stored)  # still signing through the grace period

            sent = await post_form(browser, f"/console/channels/{channel_id}/test", {})
            assert sent.status_code == 303
            delivery_id = sent.headers["Location"].split("/")[-1].split("?")[0]
            assert await scalar(
                database_url, "SELECT channel_id::text FROM deliveries WHERE id = $1",
                uuid.UUID(delivery_id),
            ) == channel_id  # fmt: skip

            await post_form(browser, f"/console/channels/{channel_id}/disable", {})
            assert not await scalar(
                database_url, "SELECT enabled FROM channels WHERE id = $1", uuid.UUID(channel_id)
            )
            refused = await post_form(browser, f"/console/channels/{channel_id}/test", {})
            assert refused.status_code == 409
            overview = await browser.get("/console/")
            assert overview.status_code == 200


async def test_a_delivery_page_shows_the_receivers_answer_as_text_on_postgres(
    config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)

    def answer(_: Received) -> tuple[int, dict[str, str], bytes]:
        return 200, {"content-type": "text/html"}, b"<b>x</b>"

    async with (
        open_sink(answer) as sink,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        hook = {"type": "webhook", "name": "hook", "config": {"url": sink.url}}
        assert (await api.post("/v1/channels", json=hook)).status_code == 201
        (delivery_id,) = await seed_one(api)
        with trio.fail_after(30):
            await wait_status(database_url, delivery_id, "DELIVERED")
        detail = (await api.get(f"/v1/deliveries/{delivery_id}")).json()
        assert [(a["outcome"], a["response_excerpt"]) for a in detail["attempts"]] == [
            ("delivered", "<b>x</b>")
        ]
        async with signed_in(running, key) as browser:
            page = (await browser.get(f"/console/deliveries/{delivery_id}")).text
        assert '<span class="mono">&lt;b&gt;x&lt;/b&gt;</span>' in page
        assert "<b>x</b>" not in page


async def seed_one(api: httpx.AsyncClient) -> list[str]:
    resp = await api.post("/v1/events", json={"type": "order.created", "payload": {"n": 1}})
    assert resp.status_code == 202, resp.text
    return [d["id"] for d in resp.json()["deliveries"]]
