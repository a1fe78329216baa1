"""The console (``notifier.console``) through the app's test client on the in-memory store:
tenant scoping, escaping, the pages and their forms (its sessions: test_console_sessions_unit.py).
tests/integration/test_console.py runs it on Postgres, test_console_browser.py in Chromium."""

from __future__ import annotations

import re
import urllib.parse
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from notifier.console.chart import line_chart, nice_max
from notifier.console.overview import recent
from notifier.store.console import HourlyCount
from notifier.store.rows import DestinationCircuit
from tests.unit.console_browser import Browser

# -- deliveries and events ----------------------------------------------------------------------


async def api(browser: Browser, path: str, body: dict[str, Any], key: str = "a") -> Any:
    resp = await browser.client.post(
        path, json=body, headers={"Authorization": f"Bearer key-{key}"}
    )
    assert resp.status_code in (201, 202), await resp.get_data()
    return await resp.get_json()


async def channel(browser: Browser, key: str = "a", name: str = "hook") -> str:
    body = {"type": "webhook", "name": name, "config": {"url": "https://hooks.example.com/in"}}
    created = await api(browser, "/v1/channels", body, key)
    return str(created["id"])


async def event(browser: Browser, type_: str, payload: dict[str, Any], key: str = "a") -> str:
    """An event of ``type_``; the id of its one delivery."""
    created = await api(browser, "/v1/events", {"type": type_, "payload": payload}, key)
    [delivery] = created["deliveries"]
    return str(delivery["id"])


def rows(body: str) -> list[str]:
    """The delivery ids of a list page, in order."""
    return re.findall(r'href="/console/deliveries/([0-9a-f-]{36})" class="delivery-link"', body)


async def test_deliveries_are_listed_newest_first_and_filtered(browser: Browser) -> None:
    await channel(browser)
    first = await event(browser, "order.created", {"n": 1})
    second = await event(browser, "user.signed_up", {"n": 2})
    third = await event(browser, "order.paid", {"n": 3})
    browser.store.settle(uuid.UUID(first), "DEAD", error="HTTP 500")
    browser.store.settle(uuid.UUID(third), "DELIVERED")
    await browser.sign_in()

    _, body, _ = await browser.get("/console/deliveries")
    assert rows(body) == [third, second, first]
    assert rows((await browser.get("/console/deliveries?status=DEAD"))[1]) == [first]
    assert rows((await browser.get("/console/deliveries?type=order.*"))[1]) == [third, first]
    assert rows((await browser.get("/console/deliveries?type=user.signed_up"))[1]) == [second]
    assert rows((await browser.get("/console/deliveries?since=2999-01-01T00:00"))[1]) == []
    assert rows((await browser.get("/console/deliveries?until=2000-01-01T00:00"))[1]) == []
    other = str(uuid.uuid4())
    assert rows((await browser.get(f"/console/deliveries?channel={other}"))[1]) == []
    assert (await browser.get("/console/deliveries?status=LOST"))[0] == 400
    assert (await browser.get("/console/deliveries?since=yesterday"))[0] == 400
    assert (await browser.get("/console/deliveries?type=" + "x" * 256))[0] == 400
    assert (await browser.get("/console/deliveries?channel=nope"))[0] == 400
    for edge in ("0001-01-01T00:00", "9999-12-31T23:59:59", "2026-01-01T00:00+14:00"):
        for name in ("since", "until"):
            query = urllib.parse.urlencode({name: edge})
            assert (await browser.get(f"/console/deliveries?{query}"))[0] == 200, edge
    query = urllib.parse.urlencode({"since": "0001-01-01T00:00+14:00"})
    assert (await browser.get(f"/console/deliveries?{query}"))[0] == 400
    assert (await browser.get("/console/deliveries?before=nonsense"))[0] == 400


async def test_deliveries_are_paginated(browser: Browser) -> None:
    await channel(browser)
    made = [await event(browser, "order.created", {"n": n}) for n in range(53)]
    await browser.sign_in()
    _, body, _ = await browser.get("/console/deliveries")
    assert rows(body) == made[::-1][:50]
    found = re.search(r'href="([^"]+)" id="next-page"', body)
    assert found
    _, body, _ = await browser.get(found.group(1).replace("&amp;", "&"))
    assert rows(body) == made[::-1][50:]
    assert 'id="next-page"' not in body


async def test_a_delivery_page_shows_its_payload_as_text_and_its_attempts(
    browser: Browser,
) -> None:
    await channel(browser)
    delivery = await event(browser, "order.created", {"note": "<script>alert(1)</script>"})
    browser.store.settle(uuid.UUID(delivery), "DEAD", error="HTTP 500 <b>bad</b>")
    await browser.sign_in()
    status, body, _ = await browser.get(f"/console/deliveries/{delivery}")
    assert status == 200
    assert "<script>alert" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "HTTP 500 &lt;b&gt;bad&lt;/b&gt;" in body  # the attempt's error, escaped
    assert 'id="replay"' in body


async def test_a_delivery_page_shows_the_response_excerpt_escaped_and_shortened(
    browser: Browser,
) -> None:
    await channel(browser)
    short, long = await event(browser, "a", {"n": 1}), await event(browser, "b", {"n": 2})
    browser.store.settle(uuid.UUID(short), "DELIVERED", response_excerpt="<b>x</b>")
    full = "<i>" + "y" * 100 + "</i>"
    browser.store.settle(uuid.UUID(long), "DELIVERED", response_excerpt=full)
    await browser.sign_in()
    _, body, _ = await browser.get(f"/console/deliveries/{short}")
    assert '<span class="mono">&lt;b&gt;x&lt;/b&gt;</span>' in body
    assert "<details>" not in body
    _, body, _ = await browser.get(f"/console/deliveries/{long}")
    assert "<i>" not in body
    cut = "&lt;i&gt;" + "y" * 76 + "…"  # 80 characters shown, the whole answer one click away
    assert f'<details><summary class="mono">{cut}</summary>' in body
    assert f"<pre>&lt;i&gt;{'y' * 100}&lt;/i&gt;</pre></details>" in body


async def test_another_tenants_deliveries_and_events_answer_404(browser: Browser) -> None:
    await channel(browser, key="b")
    delivery = await event(browser, "order.created", {"n": 1}, key="b")
    event_id = browser.store.deliveries[uuid.UUID(delivery)].delivery.event_id
    browser.store.settle(uuid.UUID(delivery), "DEAD")
    await browser.sign_in("key-a")
    assert rows((await browser.get("/console/deliveries"))[1]) == []
    assert (await browser.get(f"/console/deliveries/{delivery}"))[0] == 404
    assert (await browser.get(f"/console/events/{event_id}"))[0] == 404
    status, _, _ = await browser.post(
        f"/console/deliveries/{delivery}/replay", {}, page="/console/deliveries"
    )
    assert status == 404
    assert browser.store.deliveries[uuid.UUID(delivery)].delivery.status == "DEAD"


async def test_a_dead_delivery_is_replayed_and_only_with_the_token(browser: Browser) -> None:
    await channel(browser)
    delivery = await event(browser, "order.created", {"n": 1})
    browser.store.settle(uuid.UUID(delivery), "DEAD")
    await browser.sign_in()
    path = f"/console/deliveries/{delivery}"
    assert (await browser.post(f"{path}/replay", {}, csrf=None))[0] == 403
    assert browser.store.deliveries[uuid.UUID(delivery)].delivery.status == "DEAD"
    status, _, headers = await browser.post(f"{path}/replay", {}, page=path)
    assert (status, headers["Location"]) == (303, f"{path}?notice=replayed")
    assert browser.store.deliveries[uuid.UUID(delivery)].delivery.status == "PENDING"
    _, body, _ = await browser.get(f"{path}?notice=replayed")
    assert "queued again" in body
    assert 'http-equiv="refresh"' in body  # followed until it is finished
    status, body, _ = await browser.post(f"{path}/replay", {}, page=path)
    assert status == 409  # PENDING: nothing to replay
    assert "cannot be replayed" in body


async def test_a_bulk_replay_says_how_many_then_queues_them(browser: Browser) -> None:
    await channel(browser)
    dead = [await event(browser, "order.created", {"n": n}) for n in range(3)]
    other = await event(browser, "user.signed_up", {"n": 9})
    for delivery in [*dead, other]:
        browser.store.settle(uuid.UUID(delivery), "DEAD")
    await browser.sign_in()
    _, body, _ = await browser.get("/console/deliveries?status=DEAD&type=order.*")
    assert 'id="bulk-replay"' in body
    confirm = "/console/deliveries/replay?status=DEAD&type=order.*"
    _, body, _ = await browser.get(confirm)
    assert "<strong>3</strong> deliveries will be queued again" in body
    assert all(browser.store.deliveries[uuid.UUID(d)].delivery.status == "DEAD" for d in dead)
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', body))
    del fields["csrf"]
    assert (await browser.post("/console/deliveries/replay", fields, csrf=None))[0] == 403
    status, body, _ = await browser.post("/console/deliveries/replay", fields, page=confirm)
    assert status == 200, body
    assert "3 deliveries were queued again" in body
    assert all(browser.store.deliveries[uuid.UUID(d)].delivery.status == "PENDING" for d in dead)
    assert browser.store.deliveries[uuid.UUID(other)].delivery.status == "DEAD"


async def test_an_event_page_shows_its_payload_and_deliveries(browser: Browser) -> None:
    await channel(browser, name="one")
    await channel(browser, name="two")
    created = await api(browser, "/v1/events", {"type": "t", "payload": {"x": "<i>hi</i>"}})
    await browser.sign_in()
    status, body, _ = await browser.get(f"/console/events/{created['id']}")
    assert status == 200
    assert "&lt;i&gt;hi&lt;/i&gt;" in body
    for d in created["deliveries"]:
        assert f"/console/deliveries/{d['id']}" in body


async def test_an_expunged_payload_reads_expunged_on_the_event_and_delivery_pages(
    browser: Browser,
) -> None:
    await channel(browser)
    delivery = await event(browser, "order.created", {"email": "ada@example.com"})
    browser.store.settle(uuid.UUID(delivery), "DELIVERED", response_excerpt="thanks, ada")
    event_id = browser.store.deliveries[uuid.UUID(delivery)].delivery.event_id
    await browser.store.expunge_event(browser.tenants["a"], event_id)
    await browser.sign_in()
    for path in (f"/console/events/{event_id}", f"/console/deliveries/{delivery}"):
        status, body, _ = await browser.get(path)
        assert status == 200
        assert 'id="payload-expunged">Expunged at ' in body
        assert "ada" not in body
        assert 'id="payload"' not in body


# -- channels -----------------------------------------------------------------------------------


async def test_channels_are_listed_with_their_health_and_no_secret(browser: Browser) -> None:
    channel_id = await channel(browser, name="<em>hook</em>")
    await channel(browser, key="b", name="not-mine")
    secret = browser.store.channels[uuid.UUID(channel_id)].config["secret"]
    await browser.sign_in()
    status, body, _ = await browser.get("/console/channels")
    assert status == 200
    assert channel_id in body
    assert "&lt;em&gt;hook&lt;/em&gt;" in body
    assert "not-mine" not in body
    assert secret not in body


async def test_a_channels_payload_filter_is_shown_escaped(browser: Browser) -> None:
    body = {
        "type": "webhook", "config": {"url": "https://hooks.example.com/in"},
        "filter": {"path": ["<b>"], "op": "eq", "value": "<script>x</script>"},
    }  # fmt: skip
    filtered = str((await api(browser, "/v1/channels", body))["id"])
    plain = await channel(browser)
    await browser.sign_in()
    _, page, _ = await browser.get("/console/channels")

    [row] = re.findall(rf'<tr class="channel-row" id="channel-{filtered}">(.*?)</tr>', page, re.S)
    assert (
        'Payload filter: <span class="mono">{&#34;path&#34;: [&#34;&lt;b&gt;&#34;], '
        "&#34;op&#34;: &#34;eq&#34;, &#34;value&#34;: &#34;&lt;script&gt;x&lt;/script&gt;&#34;}"
    ) in row
    assert "<script>" not in page
    [row] = re.findall(rf'<tr class="channel-row" id="channel-{plain}">(.*?)</tr>', page, re.S)
    assert "Payload filter" not in row


async def test_a_channels_page_shows_the_circuit_of_its_destination(browser: Browser) -> None:
    channel_id = await channel(browser)
    await browser.sign_in()
    _, body, _ = await browser.get("/console/channels")
    assert 'class="circuit circuit-closed"' in body
    opened = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    browser.store.circuits[("webhook", "https://hooks.example.com:443")] = DestinationCircuit(
        state="open", consecutive_failures=6, opened_at=opened,
        next_probe_at=opened + timedelta(seconds=40),
    )  # fmt: skip

    _, body, _ = await browser.get("/console/channels")

    [row] = re.findall(rf'<tr class="channel-row" id="channel-{channel_id}">(.*?)</tr>', body, re.S)
    assert 'class="circuit circuit-open"' in row
    assert "https://hooks.example.com:443 unreachable 6 times in a row" in row
    assert "open since 2026-01-02 03:04:05" in row
    assert "next probe 03:04:45" in row


async def test_a_channel_is_disabled_and_enabled(browser: Browser) -> None:
    channel_id = await channel(browser)
    await browser.sign_in()
    path = f"/console/channels/{channel_id}"
    assert (await browser.post(f"{path}/disable", {}, csrf=None))[0] == 403
    assert browser.store.channels[uuid.UUID(channel_id)].enabled
    status, _, _ = await browser.post(f"{path}/disable", {}, page="/console/channels")
    assert status == 303
    assert not browser.store.channels[uuid.UUID(channel_id)].enabled
    assert "disabled" in (await browser.get("/console/channels"))[1]
    await browser.post(f"{path}/enable", {}, page="/console/channels")
    assert browser.store.channels[uuid.UUID(channel_id)].enabled
    other = await channel(browser, key="b")
    status, _, _ = await browser.post(
        f"/console/channels/{other}/disable", {}, page="/console/channels"
    )
    assert status == 404
    assert browser.store.channels[uuid.UUID(other)].enabled


async def test_a_rotated_secret_is_shown_once_and_signs_from_then_on(browser: Browser) -> None:
    channel_id = await channel(browser)
    before = browser.store.channels[uuid.UUID(channel_id)].config["secret"]
    await browser.sign_in()
    path = f"/console/channels/{channel_id}/rotate-secret"
    assert (await browser.post(path, {}, csrf=None))[0] == 403
    status, body, _ = await browser.post(path, {}, page="/console/channels")
    assert status == 200
    shown = re.search(r'id="new-secret">(whsec_[^<]+)<', body)
    assert shown
    stored = browser.store.channels[uuid.UUID(channel_id)].config
    assert stored["secret"] == shown.group(1) != before
    assert shown.group(1) not in (await browser.get("/console/channels"))[1]


async def test_a_test_event_goes_to_the_one_channel_and_is_followed(browser: Browser) -> None:
    channel_id = await channel(browser, name="one")
    await channel(browser, name="two")
    await browser.sign_in()
    status, _, headers = await browser.post(
        f"/console/channels/{channel_id}/test", {}, page="/console/channels"
    )
    assert status == 303
    found = re.fullmatch(r"/console/deliveries/([0-9a-f-]{36})\?notice=test", headers["Location"])
    assert found
    delivery = browser.store.deliveries[uuid.UUID(found.group(1))].delivery
    assert str(delivery.channel_id) == channel_id
    assert len(browser.store.deliveries) == 1  # the other channel got nothing
    _, body, _ = await browser.get(headers["Location"])
    assert "A test event was sent" in body
    assert 'http-equiv="refresh"' in body


async def test_a_test_event_a_channels_filter_drops_is_refused_and_stores_nothing(
    browser: Browser,
) -> None:
    body = {
        "type": "webhook", "config": {"url": "https://hooks.example.com/in"},
        "filter": {"path": ["amount"], "op": "gte", "value": 100},
    }  # fmt: skip
    filtered = str((await api(browser, "/v1/channels", body))["id"])
    await browser.sign_in()
    status, page, _ = await browser.post(
        f"/console/channels/{filtered}/test", {}, page="/console/channels"
    )
    assert status == 409
    assert "payload filter drops the test event" in page
    assert browser.store.events == {}
    assert browser.store.deliveries == {}


# -- overview -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "top"),
    [(0, 1), (1, 1), (2, 2), (3, 5), (5, 5), (6, 10), (11, 20), (999, 1000), (1001, 2000)],
)
def test_the_charts_top_is_a_round_number_above_every_value(value: int, top: int) -> None:
    assert nice_max(value) == top


def test_the_chart_draws_each_series_across_the_plot() -> None:
    chart = line_chart([0, 5, 10], [10, 0, 0], ["a", "b", "c"])
    assert chart.y_max == 10
    first, _, last = chart.delivered.split()
    assert first == f"40.0,{chart.baseline:.1f}"  # 0 at the left, on the baseline
    assert last == f"{chart.width - 10:.1f},10.0"  # the top at the right
    assert chart.failed.split()[0] == "40.0,10.0"


def test_recent_sums_the_hourly_counts_for_the_hour_the_day_and_the_chart() -> None:
    now = datetime(2026, 1, 2, 12, 30, tzinfo=UTC)
    got = recent(
        [HourlyCount(0, "DELIVERED", 1), HourlyCount(0, "DEAD", 1),
         HourlyCount(2, "DELIVERED", 4), HourlyCount(5, "RETRYING", 2),
         HourlyCount(24, "DEAD", 9)],  # out of the day: left out
        now,
    )  # fmt: skip
    assert got.hour == {"DELIVERED": 1, "DEAD": 1}
    assert got.day == {"DELIVERED": 5, "DEAD": 1, "RETRYING": 2}
    assert got.delivered[-1] == 1  # the last hour, at the right
    assert got.delivered[-3] == 4  # two hours before
    assert got.failed[-1] == 1
    assert got.failed[-6] == 2  # RETRYING counts as failing
    assert got.labels[-1] == "12:30"


async def test_the_overview_counts_the_tenants_deliveries_and_failing_channels(
    browser: Browser,
) -> None:
    channel_id = uuid.UUID(await channel(browser, name="flaky"))
    dead = [await event(browser, "t", {"n": n}) for n in range(2)]
    await event(browser, "t", {"n": 3})
    for delivery in dead:
        browser.store.settle(uuid.UUID(delivery), "DEAD", error="HTTP 503 <i>down</i>")
    await channel(browser, key="b")
    browser.store.settle(uuid.UUID(await event(browser, "t", {}, key="b")), "DEAD")
    stored = browser.store.channels[channel_id]
    browser.store.channels[channel_id] = msgspec.structs.replace(
        stored, failing_since=datetime.now(UTC), consecutive_failures=2
    )
    await browser.sign_in()
    status, body, _ = await browser.get("/console/")
    assert status == 200
    dead_count = re.search(r'id="dead-count"><a [^>]*>(\d+)<', body)
    assert dead_count
    assert dead_count.group(1) == "2"  # not tenant b's
    assert '<svg class="chart"' in body
    failing = body[body.index('id="failing"') :]
    assert "flaky" in failing
    assert "HTTP 503 &lt;i&gt;down&lt;/i&gt;" in failing
    queue = re.search(r'id="queue">.*?<tbody>(.*?)</tbody>', body, re.S)
    assert queue
    # tenant a's own: one waiting, none retrying, two dead (not tenant b's dead one)
    assert re.findall(r'class="num">(\d+)<', queue.group(1)) == ["1", "0", "2"]
    assert "Queue depths" not in body  # never the fleet's
