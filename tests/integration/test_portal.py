"""The customer portal on the real Postgres, through the HTTP API and the portal's pages as a
browser without scripts uses them (a client keeping cookies): portal links made, listed and
revoked by the tenant; a link opening a session scoped to one customer's channels (or to fixed
channel ids) and every portal route refusing, with 404, a channel or delivery outside that scope
— another customer's of the same tenant, another tenant's; CSRF refusal; expired and revoked
links and the sessions they opened refused; the tenant's API key never shown."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from notifier.config import Config
from notifier.store import open_store
from tests.integration.conftest import (
    Running,
    create_tenant,
    make_config,
    run_notifier,
    scalar,
    sql,
)
from tests.integration.test_console import post_form as console_post
from tests.integration.test_console import signed_in

# Plain http, so a client reaching the test's server over http keeps the portal's cookie (an
# https public_url makes it Secure: test_the_cookie_is_secure_when_the_public_url_is_https).
PUBLIC_URL = "http://hooks.example.com/notify"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
SINK = "http://127.0.0.1:9/hook"


@pytest.fixture
def portal_config(database_url: str, broker_url: str) -> Config:
    return make_config(database_url, broker_url, console={"public_url": PUBLIC_URL})


def hook(name: str, customer: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "webhook", "name": name, "config": {"url": SINK}}
    if customer is not None:
        body["customer"] = customer
    return body


async def make_channel(api: httpx.AsyncClient, name: str, customer: str | None) -> str:
    resp = await api.post("/v1/channels", json=hook(name, customer))
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


async def make_delivery(api: httpx.AsyncClient, channel_id: str) -> str:
    resp = await api.post("/v1/events", json={
        "type": "order.paid", "payload": {"n": 1}, "channel_ids": [channel_id],
    })  # fmt: skip
    assert resp.status_code == 202, resp.text
    return str(resp.json()["deliveries"][0]["id"])


async def make_link(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    resp = await api.post("/v1/portal-links", json=body)
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def token_of(link: dict[str, Any]) -> str:
    url = str(link["url"])
    assert url.startswith(PUBLIC_URL + "/portal/enter/")
    return url.rsplit("/", 1)[1]


@asynccontextmanager
async def portal(running: Running, link: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    """A client keeping cookies, as a browser, that opened ``link``."""
    async with httpx.AsyncClient(base_url=running.base_url, timeout=10) as browser:
        resp = await browser.get(f"/portal/enter/{token_of(link)}")
        assert resp.status_code == 303, resp.text
        assert resp.headers["location"] == "/portal/"
        yield browser


async def post_form(browser: httpx.AsyncClient, path: str, form: dict[str, Any]) -> httpx.Response:
    """``form`` posted with the token of the endpoints page."""
    token = CSRF.search((await browser.get("/portal/")).text)
    assert token
    return await browser.post(path, data={**form, "csrf": token.group(1)})


async def test_links_are_made_listed_and_revoked_and_their_token_is_not_stored(
    portal_config: Config, database_url: str, broker_url: str
) -> None:
    key, other = await create_tenant(database_url), await create_tenant(database_url)
    async with (
        run_notifier(portal_config, ("ingest",)) as running,
        running.client(key) as api,
        running.client(other) as api_b,
    ):
        mine = await make_channel(api, "mine", None)
        theirs = await make_channel(api_b, "theirs", None)
        link = await make_link(api, customer="acme", expires_in_seconds=600)
        assert link["state"] == "active"
        assert link["customer"] == "acme"
        assert link["channel_ids"] is None
        assert link["revoked_at"] is None
        by_ids = await make_link(api, channel_ids=[mine])
        assert by_ids["channel_ids"] == [mine]
        # Only the token's hash is stored.
        stored = await sql(database_url, "SELECT * FROM portal_links")
        assert token_of(link) not in repr(stored)
        assert token_of(by_ids) not in repr(stored)

        for body, code in (
            ({}, "validation_error"),
            ({"customer": "acme", "channel_ids": [mine]}, "validation_error"),
            ({"customer": "acme", "expires_in_seconds": 59}, "validation_error"),
            ({"customer": "acme", "expires_in_seconds": 7 * 86400 + 1}, "validation_error"),
            ({"customer": "a b"}, "validation_error"),
            ({"customer": ""}, "validation_error"),
            ({"channel_ids": [theirs]}, "unknown_channels"),  # another tenant's channel
            ({"channel_ids": [str(uuid.uuid4())]}, "unknown_channels"),
        ):
            resp = await api.post("/v1/portal-links", json=body)
            assert resp.status_code == 422, (body, resp.text)
            assert resp.json()["error"]["code"] == code, body
        assert await scalar(database_url, "SELECT count(*) FROM portal_links") == 2

        listed = (await api.get("/v1/portal-links")).json()
        assert [x["id"] for x in listed["items"]] == [by_ids["id"], link["id"]]
        assert all("url" not in x for x in listed["items"])
        assert (await api_b.get("/v1/portal-links")).json()["items"] == []
        page = (await api.get("/v1/portal-links", params={"limit": 1})).json()
        assert [x["id"] for x in page["items"]] == [by_ids["id"]]
        rest = await api.get("/v1/portal-links", params={"cursor": page["next_cursor"]})
        assert [x["id"] for x in rest.json()["items"]] == [link["id"]]

        # Another tenant cannot revoke it; its tenant can, and again.
        assert (await api_b.delete(f"/v1/portal-links/{link['id']}")).status_code == 404
        assert (await api.delete(f"/v1/portal-links/{link['id']}")).status_code == 204
        assert (await api.delete(f"/v1/portal-links/{link['id']}")).status_code == 204
        assert (await api.delete(f"/v1/portal-links/{uuid.uuid4()}")).status_code == 404
        states = {x["id"]: x["state"] for x in (await api.get("/v1/portal-links")).json()["items"]}
        assert states == {link["id"]: "revoked", by_ids["id"]: "active"}


async def test_a_link_needs_the_consoles_public_url(config: Config, database_url: str) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        resp = await api.post("/v1/portal-links", json={"customer": "acme"})
    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "portal_not_configured"
    assert "public_url" in resp.json()["error"]["message"]


async def test_channels_carry_a_customer_label(config: Config, database_url: str) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        channel_id = await make_channel(api, "a", "acme")
        assert (await api.get(f"/v1/channels/{channel_id}")).json()["customer"] == "acme"
        patched = await api.patch(f"/v1/channels/{channel_id}", json={"customer": "globex"})
        assert patched.json()["customer"] == "globex"
        patched = await api.patch(f"/v1/channels/{channel_id}", json={"customer": None})
        assert patched.json()["customer"] is None
        bad = await api.patch(f"/v1/channels/{channel_id}", json={"customer": "no spaces"})
        assert bad.status_code == 422
        assert (await api.post("/v1/channels", json=hook("b", "x" * 201))).status_code == 422
        other = await make_channel(api, "c", "acme")
        await make_channel(api, "d", None)
        listed = (await api.get("/v1/channels", params={"customer": "acme"})).json()["items"]
        assert [c["id"] for c in listed] == [other]
        assert len((await api.get("/v1/channels")).json()["items"]) == 3
        for bad in ("a b", "x" * 201, ""):
            resp = await api.get("/v1/channels", params={"customer": bad})
            assert resp.status_code == 422, bad


async def test_a_session_reaches_only_its_customers_channels_on_every_route(
    portal_config: Config, database_url: str
) -> None:
    key, other = await create_tenant(database_url), await create_tenant(database_url)
    async with run_notifier(portal_config, ("ingest",)) as running:
        async with running.client(key) as api, running.client(other) as api_b:
            ours = await make_channel(api, "acme-orders", "acme")
            globex = await make_channel(api, "globex-orders", "globex")  # same tenant
            unlabelled = await make_channel(api, "internal", None)
            foreign = await make_channel(api_b, "foreign", "acme")  # another tenant's acme
            our_delivery = await make_delivery(api, ours)
            outside = [await make_delivery(api, globex), await make_delivery(api, unlabelled),
                       await make_delivery(api_b, foreign)]  # fmt: skip
            link = await make_link(api, customer="acme")

        await sql(database_url, "UPDATE deliveries SET status = 'DEAD'")
        async with portal(running, link) as browser:
            home = await browser.get("/portal/")
            assert home.status_code == 200
            assert "acme-orders" in home.text
            for name in ("globex-orders", "internal", "foreign"):
                assert name not in home.text
            assert key not in home.text
            assert token_of(link) not in home.text
            log = await browser.get("/portal/deliveries")
            assert our_delivery in log.text
            assert not any(d in log.text for d in outside)
            for channel_id in (globex, unlabelled, foreign):
                filtered = await browser.get("/portal/deliveries", params={"channel": channel_id})
                assert filtered.status_code == 200
                assert "delivery-link" not in filtered.text
                assert (await browser.get(f"/portal/endpoints/{channel_id}")).status_code == 404
                for action, form in (("", {"name": "x", "url": SINK, "event_types": "*"}),
                                     ("/rotate-secret", {}), ("/test", {})):  # fmt: skip
                    resp = await post_form(browser, f"/portal/endpoints/{channel_id}{action}", form)
                    assert resp.status_code == 404, (channel_id, action)
            for delivery_id in outside:
                assert (await browser.get(f"/portal/deliveries/{delivery_id}")).status_code == 404
                resp = await post_form(browser, f"/portal/deliveries/{delivery_id}/replay", {})
                assert resp.status_code == 404
            # Nothing outside the scope changed; its own routes work.
            statuses = dict(await sql(database_url, "SELECT id::text, status FROM deliveries"))
            assert all(statuses[d] == "DEAD" for d in outside)
            names = dict(await sql(database_url, "SELECT id::text, name FROM channels"))
            assert names[globex] == "globex-orders"
            assert names[foreign] == "foreign"
            page = await browser.get(f"/portal/deliveries/{our_delivery}")
            assert page.status_code == 200
            assert "Attempts" in page.text
            resp = await post_form(browser, f"/portal/deliveries/{our_delivery}/replay", {})
            assert resp.status_code == 303
            assert await scalar(
                database_url, "SELECT status FROM deliveries WHERE id = $1", uuid.UUID(our_delivery)
            ) == "PENDING"  # fmt: skip


async def test_endpoints_are_made_and_edited_within_the_tenants_event_types(
    portal_config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(portal_config, ("ingest",)) as running, running.client(key) as api:
        for name in ("order.paid", "order.refunded"):
            put = await api.put(f"/v1/event-types/{name}", json={"schema": {"type": "object"}})
            assert put.status_code in (200, 201), put.text
        link = await make_link(api, customer="acme")
        async with portal(running, link) as browser:
            form = await browser.get("/portal/endpoints/new")
            assert 'value="order.paid"' in form.text
            assert 'name="event_types"' not in form.text
            refused = await post_form(browser, "/portal/endpoints", {
                "name": "x", "url": SINK, "event_type": ["order.paid", "user.deleted"],
            })  # fmt: skip
            assert refused.status_code == 400
            assert "user.deleted" in refused.text
            made = await post_form(browser, "/portal/endpoints", {
                "name": "acme hook", "url": SINK, "event_type": ["order.paid"],
            })  # fmt: skip
            assert made.status_code == 200, made.text
            secret = re.search(r'id="new-secret">([^<]+)<', made.text)
            assert secret
            assert secret.group(1).startswith("whsec_")
            (row,) = await sql(database_url, "SELECT id, customer, event_types, config->>'secret'"
                               " FROM channels")  # fmt: skip
            assert row[1] == "acme"
            assert list(row[2]) == ["order.paid"]
            assert row[3] == secret.group(1)
            channel_id = str(row[0])
            saved = await post_form(
                browser,
                f"/portal/endpoints/{channel_id}",
                {
                    "name": "renamed",
                    "url": "http://127.0.0.1:9/other",
                    "event_type": ["order.paid", "order.refunded"],
                },
            )  # fmt: skip  (no "enabled": unticked)
            assert saved.status_code == 303
            view = (await api.get(f"/v1/channels/{channel_id}")).json()
            assert view["name"] == "renamed"
            assert view["enabled"] is False
            assert view["config"]["url"] == "http://127.0.0.1:9/other"
            assert view["event_types"] == ["order.paid", "order.refunded"]
            assert view["customer"] == "acme"
            # the secret was kept across the change of URL
            assert await scalar(database_url, "SELECT config->>'secret' FROM channels") == (
                secret.group(1)
            )
            bad_url = await post_form(browser, f"/portal/endpoints/{channel_id}", {
                "name": "x", "url": "ftp://nowhere", "event_type": ["order.paid"],
            })  # fmt: skip
            assert bad_url.status_code == 400
        # A link of fixed channels makes none.
        fixed = await make_link(api, channel_ids=[channel_id])
        async with portal(running, fixed) as browser:
            assert "renamed" in (await browser.get("/portal/")).text
            assert (await browser.get("/portal/endpoints/new")).status_code == 409
            resp = await post_form(browser, "/portal/endpoints", {
                "name": "x", "url": SINK, "event_type": ["order.paid"],
            })  # fmt: skip
            assert resp.status_code == 409
    assert await scalar(database_url, "SELECT count(*) FROM channels") == 1


async def test_forms_without_their_token_and_ended_links_are_refused(
    portal_config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(portal_config, ("ingest",)) as running, running.client(key) as api:
        channel_id = await make_channel(api, "acme-orders", "acme")
        link = await make_link(api, customer="acme")
        expiring = await make_link(api, customer="acme")
        async with portal(running, link) as browser:
            headers = (await browser.get(f"/portal/enter/{token_of(link)}")).headers
            cookie = headers["set-cookie"]
            assert "HttpOnly" in cookie
            assert "SameSite=Lax" in cookie
            assert "Path=/portal" in cookie
            page = await browser.get("/portal/")
            assert "script-src" not in page.headers["content-security-policy"]
            assert page.headers["content-security-policy"].startswith("default-src 'none'")
            assert page.headers["x-frame-options"] == "DENY"
            # No token, or another session's: refused, nothing written.
            no_token = await browser.post(f"/portal/endpoints/{channel_id}/rotate-secret")
            assert no_token.status_code == 403
            forged = await browser.post(
                f"/portal/endpoints/{channel_id}/rotate-secret", data={"csrf": "0" * 64}
            )
            assert forged.status_code == 403
            assert await scalar(
                database_url, "SELECT config ? 'previous_secret' FROM channels"
            ) is False  # fmt: skip
            # Revoked: the open session ends at once, and the link opens no other.
            assert (await api.delete(f"/v1/portal-links/{link['id']}")).status_code == 204
            assert (await browser.get("/portal/")).status_code == 403
            again = await browser.get(f"/portal/enter/{token_of(link)}")
            assert again.status_code == 410
            assert "revoked" in again.text
        async with portal(running, expiring) as browser:
            assert (await browser.get("/portal/")).status_code == 200
            # Its expiry passes (on Postgres's clock, which the portal reads).
            await sql(database_url, "UPDATE portal_links SET expires_at = now() - interval '1 s'"
                      " WHERE id = $1", uuid.UUID(expiring["id"]))  # fmt: skip
            assert (await browser.get("/portal/")).status_code == 403
            assert (await browser.get("/portal/deliveries")).status_code == 403
            again = await browser.get(f"/portal/enter/{token_of(expiring)}")
            assert again.status_code == 410
            assert "expired" in again.text
        async with httpx.AsyncClient(base_url=running.base_url, timeout=10) as stranger:
            near = token_of(link)[:-1] + ("A" if token_of(link)[-1] != "A" else "B")
            for token in ("x" * 43, "short", near):
                assert (await stranger.get(f"/portal/enter/{token}")).status_code == 403
            assert (await stranger.get("/portal/")).status_code == 403
            # A disabled tenant's links open nothing.
            fresh = await make_link(api, customer="acme")
            await sql(database_url, "UPDATE tenants SET enabled = false")
            assert (await stranger.get(f"/portal/enter/{token_of(fresh)}")).status_code == 403
            metrics = (await stranger.get("/metrics")).text
    entries = dict(re.findall(r'notifier_portal_entries_total\{outcome="(\w+)"\} (\S+)', metrics))
    assert entries == {"opened": "3.0", "invalid": "4.0", "expired": "1.0", "revoked": "1.0"}


async def test_maintenance_deletes_ended_sessions_and_long_ended_links(database_url: str) -> None:
    await create_tenant(database_url)
    tenant = await scalar(database_url, "SELECT id FROM tenants")
    async with open_store(database_url) as store:
        links = [
            await store.create_portal_link(
                tenant, f"hash-{i}", customer="acme", channel_ids=None, expires_in_seconds=600
            )
            for i in range(3)
        ]
        for i, link in enumerate(links):
            assert await store.create_portal_session(f"s{i}", link.id, max_age_seconds=60)
        # s0's session ended on its own; link 1 was revoked 31 days ago; link 2 lives on.
        await sql(
            database_url, "UPDATE portal_sessions SET expires_at = now() WHERE id_hash = 's0'"
        )
        await sql(database_url, "UPDATE portal_links SET revoked_at = now() - interval '31 days'"
                  " WHERE id = $1", links[1].id)  # fmt: skip
        assert await store.portal_session("s0") is None
        assert await store.portal_session("s1") is None  # its link is revoked
        assert await store.clean_console(limit=10) == 2  # s0, and link 1 with s1
        kept = await sql(database_url, "SELECT id FROM portal_links ORDER BY created_at")
        assert [r[0] for r in kept] == [links[0].id, links[2].id]
        assert [r[0] for r in await sql(database_url, "SELECT id_hash FROM portal_sessions")] == [
            "s2"
        ]
        session = await store.portal_session("s2")
        assert session is not None
        assert session.scope.customer == "acme"


async def test_hostile_form_input_is_refused_with_a_page_and_writes_nothing(
    portal_config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(portal_config, ("ingest",)) as running, running.client(key) as api:
        channel_id = await make_channel(api, "acme-orders", "acme")
        link = await make_link(api, customer="acme")
        async with portal(running, link) as browser:
            before = await sql(database_url, "SELECT * FROM channels")
            for form in (
                {"name": "a\x00b", "url": SINK, "event_types": "*"},
                {"name": "x" * 201, "url": SINK, "event_types": "*"},
                {"name": "x", "url": SINK + "\x00", "event_types": "*"},
                {"name": "x", "url": "http://" + "a" * 3000, "event_types": "*"},
                {"name": "x", "url": "", "event_types": "*"},
                {"name": "x", "url": "javascript:alert(1)", "event_types": "*"},
                {"name": "x", "url": SINK, "event_types": "a\x00b"},
                {"name": "x", "url": SINK, "event_types": ""},
            ):
                for path in ("/portal/endpoints", f"/portal/endpoints/{channel_id}"):
                    resp = await post_form(browser, path, form)
                    assert resp.status_code == 400, (path, form, resp.text)
                    assert resp.headers["content-type"].startswith("text/html")
            assert await sql(database_url, "SELECT * FROM channels") == before
            for path, status in (
                ("/portal/deliveries?status=LOST", 400), ("/portal/deliveries?channel=nope", 400),
                ("/portal/deliveries?before=nope", 400), ("/portal/endpoints/nope", 404),
                ("/portal/deliveries/nope", 404), ("/portal/enter/" + "%00" * 43, 403),
            ):  # fmt: skip
                assert (await browser.get(path)).status_code == status, path


async def test_the_console_lists_the_tenants_links_and_revokes_one(
    portal_config: Config, database_url: str
) -> None:
    key, other = await create_tenant(database_url), await create_tenant(database_url)
    async with (
        run_notifier(portal_config, ("ingest",)) as running,
        running.client(key) as api,
        running.client(other) as api_b,
    ):
        await make_channel(api, "acme-orders", "acme")
        link = await make_link(api, customer="acme")
        theirs = await make_link(api_b, customer="acme")
        async with portal(running, link) as customer, signed_in(running, key) as tenant:
            listed = await tenant.get("/console/portal-links")
            assert f'id="portal-link-{link["id"]}"' in listed.text
            assert theirs["id"] not in listed.text
            assert token_of(link) not in listed.text
            # another tenant's link: not found, and left alone
            resp = await console_post(tenant, f"/console/portal-links/{theirs['id']}/revoke", {})
            assert resp.status_code == 404
            assert (await customer.get("/portal/")).status_code == 200
            resp = await console_post(tenant, f"/console/portal-links/{link['id']}/revoke", {})
            assert resp.status_code == 303
            assert (await customer.get("/portal/")).status_code == 403
            states = {
                x["id"]: x["state"] for x in (await api.get("/v1/portal-links")).json()["items"]
            }
            assert states == {link["id"]: "revoked"}
            assert (await api_b.get("/v1/portal-links")).json()["items"][0]["state"] == "active"


async def test_leaving_ends_the_session_and_a_new_entry_replaces_the_old_one(
    portal_config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(portal_config, ("ingest",)) as running, running.client(key) as api:
        await make_channel(api, "acme-orders", "acme")
        await make_channel(api, "globex-orders", "globex")
        acme = await make_link(api, customer="acme")
        globex = await make_link(api, customer="globex")
        async with portal(running, acme) as browser:
            # Entering another link in the same browser ends the first session.
            entered = await browser.get(f"/portal/enter/{token_of(globex)}")
            assert entered.status_code == 303
            assert await scalar(database_url, "SELECT count(*) FROM portal_sessions") == 1
            home = (await browser.get("/portal/")).text
            assert "globex-orders" in home
            assert "acme-orders" not in home
            left = await post_form(browser, "/portal/leave", {})
            assert left.status_code == 200
            assert "notifier_portal=; " in left.headers["set-cookie"]
            assert await scalar(database_url, "SELECT count(*) FROM portal_sessions") == 0
            assert (await browser.get("/portal/")).status_code == 403


async def deliveries_to(api: httpx.AsyncClient, **event: Any) -> set[str]:
    """The channels an event (type ``order.paid``) reached."""
    resp = await api.post("/v1/events", json={"type": "order.paid", "payload": {}, **event})
    assert resp.status_code == 202, resp.text
    return {str(d["channel_id"]) for d in resp.json()["deliveries"]}


async def test_a_portal_endpoint_receives_only_the_events_addressed_to_its_customer(
    portal_config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(portal_config, ("ingest",)) as running, running.client(key) as api:
        internal = await make_channel(api, "internal", None)  # the tenant's, no recipient
        link = await make_link(api, customer="acme")
        async with portal(running, link) as browser:
            made = await post_form(browser, "/portal/endpoints", {
                "name": "catch-all", "url": SINK, "event_types": "*",
            })  # fmt: skip
            assert made.status_code == 200, made.text
        mine = str(await scalar(database_url, "SELECT id FROM channels WHERE name = 'catch-all'"))
        (row,) = await sql(database_url, "SELECT recipient, customer, event_types FROM channels"
                           " WHERE id = $1", uuid.UUID(mine))  # fmt: skip
        assert tuple(row) == ("acme", "acme", ["*"])
        # Events for the tenant itself, or for another customer, never reach it.
        assert await deliveries_to(api) == {internal}
        assert await deliveries_to(api, recipient="globex") == set()
        # The tenant addresses acme's events with recipient "acme".
        assert await deliveries_to(api, recipient="acme") == {mine}


async def test_the_portal_changes_event_types_only_of_endpoints_addressed_to_the_customer(
    portal_config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(portal_config, ("ingest",)) as running, running.client(key) as api:
        # The tenant's channel for acme without a recipient: it gets the tenant's own events of
        # its types, so widening them would leak the tenant's (and every customer's) events.
        shared = await api.post("/v1/channels", json={
            **hook("acme-orders", "acme"), "event_types": ["order.paid"],
        })  # fmt: skip
        assert shared.status_code == 201, shared.text
        shared_id = shared.json()["id"]
        addressed = await api.post("/v1/channels", json={
            **hook("acme-addressed", "acme"), "event_types": ["order.paid"], "recipient": "acme",
        })  # fmt: skip
        addressed_id = addressed.json()["id"]
        link = await make_link(api, customer="acme")
        fixed = await make_link(api, channel_ids=[shared_id, addressed_id])
        for opened in (link, fixed):
            async with portal(running, opened) as browser:
                form = await browser.get(f"/portal/endpoints/{shared_id}")
                assert 'id="event-types-fixed"' in form.text
                assert 'name="event_types"' not in form.text
                refused = await post_form(browser, f"/portal/endpoints/{shared_id}", {
                    "name": "acme-orders", "url": SINK, "event_types": "*", "enabled": "on",
                })  # fmt: skip
                assert refused.status_code == 409
                assert "event types are set by the service" in refused.text
                assert (await api.get(f"/v1/channels/{shared_id}")).json()["event_types"] == [
                    "order.paid"
                ]
                # The read-only form (no event types) still saves the rest.
                saved = await post_form(browser, f"/portal/endpoints/{shared_id}", {
                    "name": "renamed", "url": SINK, "enabled": "on",
                })  # fmt: skip
                assert saved.status_code == 303
                view = (await api.get(f"/v1/channels/{shared_id}")).json()
                assert (view["name"], view["event_types"]) == ("renamed", ["order.paid"])
                # Addressed to acme: its event types are the customer's to choose.
                form = await browser.get(f"/portal/endpoints/{addressed_id}")
                assert 'name="event_types"' in form.text
                saved = await post_form(browser, f"/portal/endpoints/{addressed_id}", {
                    "name": "acme-addressed", "url": SINK, "event_types": "*", "enabled": "on",
                })  # fmt: skip
                assert saved.status_code == 303
                got = (await api.get(f"/v1/channels/{addressed_id}")).json()["event_types"]
                assert got == ["*"]
                await api.patch(f"/v1/channels/{addressed_id}", json={"event_types": ["x"]})
        assert await deliveries_to(api) == {shared_id}


async def test_the_portal_never_moves_the_tenants_credentials_to_a_new_url(
    portal_config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(portal_config, ("ingest",)) as running, running.client(key) as api:
        body = hook("acme-orders", "acme")
        body["config"]["headers"] = {"X-Api-Key": "tenant-credential"}
        made = await api.post("/v1/channels", json=body)
        assert made.status_code == 201, made.text
        channel_id = made.json()["id"]
        link = await make_link(api, customer="acme")
        async with portal(running, link) as browser:
            form = await browser.get(f"/portal/endpoints/{channel_id}")
            assert "readonly" in form.text
            assert "tenant-credential" not in form.text
            before = await sql(database_url, "SELECT config FROM channels")
            refused = await post_form(browser, f"/portal/endpoints/{channel_id}", {
                "name": "acme-orders", "url": "http://127.0.0.1:9/elsewhere", "enabled": "on",
            })  # fmt: skip
            assert refused.status_code == 409
            assert "carries credentials set by the service" in refused.text
            assert "ask them to change its URL" in refused.text
            assert await sql(database_url, "SELECT config FROM channels") == before
            # Its URL unchanged, the rest is saved.
            saved = await post_form(browser, f"/portal/endpoints/{channel_id}", {
                "name": "renamed", "url": SINK, "enabled": "on",
            })  # fmt: skip
            assert saved.status_code == 303
            assert await sql(database_url, "SELECT config FROM channels") == before
            assert await scalar(database_url, "SELECT name FROM channels") == "renamed"


async def test_a_test_event_the_endpoints_filter_drops_is_refused_and_stores_nothing(
    portal_config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(portal_config, ("ingest",)) as running, running.client(key) as api:
        made = await api.post("/v1/channels", json={
            **hook("acme-orders", "acme"),
            "filter": {"path": ["currency"], "op": "eq", "value": "EUR"},
        })  # fmt: skip
        assert made.status_code == 201, made.text
        link = await make_link(api, customer="acme")
        async with portal(running, link) as browser:
            resp = await post_form(browser, f"/portal/endpoints/{made.json()['id']}/test", {})
            assert resp.status_code == 409
            assert "payload filter drops the test event" in resp.text
    assert await scalar(database_url, "SELECT count(*) FROM events") == 0
    assert await scalar(database_url, "SELECT count(*) FROM deliveries") == 0


async def test_a_customer_makes_at_most_50_endpoints_in_the_portal(
    portal_config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(portal_config, ("ingest",)) as running, running.client(key) as api:
        for i in range(50):
            await make_channel(api, f"acme-{i}", "acme")
        link = await make_link(api, customer="acme")
        async with portal(running, link) as browser:
            refused = await post_form(browser, "/portal/endpoints", {
                "name": "one more", "url": SINK, "event_types": "*",
            })  # fmt: skip
            assert refused.status_code == 409
            assert "At most 50 endpoints" in refused.text
    assert await scalar(database_url, "SELECT count(*) FROM channels") == 50


async def test_a_link_keeps_its_newest_20_sessions(database_url: str) -> None:
    await create_tenant(database_url)
    tenant = await scalar(database_url, "SELECT id FROM tenants")
    async with open_store(database_url) as store:
        link, other = [
            await store.create_portal_link(
                tenant, f"hash-{i}", customer="acme", channel_ids=None, expires_in_seconds=600
            )
            for i in range(2)
        ]
        assert await store.create_portal_session("other", other.id, max_age_seconds=60)
        for i in range(22):
            assert await store.create_portal_session(f"s{i}", link.id, max_age_seconds=60)
        rows = await sql(database_url, "SELECT id_hash FROM portal_sessions WHERE link_id = $1",
                         link.id)  # fmt: skip
        assert {r[0] for r in rows} == {f"s{i}" for i in range(2, 22)}
        assert await store.portal_session("s0") is None
        assert await store.portal_session("s21") is not None
        assert await store.portal_session("other") is not None  # another link's: kept


async def test_the_cookie_is_secure_when_the_public_url_is_https(
    database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    for public_url, forwarded, secure in (
        ("https://hooks.example.com", None, True),  # whatever the proxy in front says
        ("http://hooks.example.com", None, False),
        ("http://hooks.example.com", "https", True),
    ):
        config = make_config(database_url, broker_url, console={"public_url": public_url})
        async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
            link = await make_link(api, customer="acme")
            token = str(link["url"]).rsplit("/", 1)[1]
            headers = {"X-Forwarded-Proto": forwarded} if forwarded else {}
            async with httpx.AsyncClient(base_url=running.base_url, timeout=10) as browser:
                resp = await browser.get(f"/portal/enter/{token}", headers=headers)
            assert resp.status_code == 303
            cookie = resp.headers["set-cookie"]
            assert cookie.startswith("notifier_portal=")
            assert ("; Secure" in cookie) is secure, (public_url, forwarded, cookie)
