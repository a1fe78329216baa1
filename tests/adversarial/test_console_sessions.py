"""The console's sessions under clients that keep old cookies, sit behind proxies or forge
``X-Forwarded-For``, on the real Postgres and over HTTP: sign-out, a key replaced and a tenant
disabled end a session at once (its old cookie opens nothing, even once the key or the tenant is
back); the sign-in slow-down counts the address a trusted proxy forwarded, and only then, so a
client locked out never locks out another; a tenant's overview shows its own deliveries, never
another tenant's or the fleet's figures; and a launch of two processes with no configured secret
accepts a session and a form made on one process at the other."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from notifier.config import Config, ConfigError
from notifier.ingest.tenants import hash_api_key
from tests.integration.conftest import (
    Running,
    create_tenant,
    make_config,
    run_notifier,
    scalar,
    sql,
)
from tests.integration.test_processes import (
    http_exchange,
    ingest_config,
    launched,
    owner_of_connection,
)

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
COOKIE = "notifier_console"


async def token_of(browser: httpx.AsyncClient, path: str) -> str:
    found = CSRF.search((await browser.get(path)).text)
    assert found
    return found.group(1)


@asynccontextmanager
async def signed_in(running: Running, key: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client keeping cookies, as a browser, signed in with ``key``."""
    async with httpx.AsyncClient(base_url=running.base_url, timeout=10) as browser:
        form = {"api_key": key, "csrf": await token_of(browser, "/console/sign-in")}
        resp = await browser.post("/console/sign-in", data=form)
        assert resp.status_code == 303, resp.text
        assert (await browser.get("/console/")).status_code == 200
        yield browser


async def with_cookie(running: Running, cookie: str, path: str = "/console/") -> httpx.Response:
    """``path`` asked by another client that replays a copied session cookie."""
    async with httpx.AsyncClient(
        base_url=running.base_url, timeout=10, cookies={COOKIE: cookie}
    ) as thief:
        return await thief.get(path)


def sent_to_sign_in(resp: httpx.Response) -> bool:
    return resp.status_code == 303 and resp.headers["Location"] == "/console/sign-in"


async def test_sign_out_ends_the_session_at_once(config: Config, database_url: str) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running:
        async with signed_in(running, key) as browser:
            cookie = browser.cookies[COOKIE]
            assert (await with_cookie(running, cookie)).status_code == 200
            # the cookie holds a random id only: neither the key nor its hash
            assert key not in cookie
            assert hash_api_key(key) not in cookie
            token = await token_of(browser, "/console/")
            resp = await browser.post("/console/sign-out", data={"csrf": token})
            assert sent_to_sign_in(resp)
        # The copied cookie is dead at once, on every page.
        for path in ("/console/", "/console/deliveries", "/console/channels"):
            assert sent_to_sign_in(await with_cookie(running, cookie, path)), path
        assert await scalar(database_url, "SELECT count(*) FROM console_sessions") == 0  # its row


@pytest.mark.parametrize(
    ("end", "undo"),
    [
        ("UPDATE tenants SET api_key_hash = 'replaced' WHERE api_key_hash = $1",
         "UPDATE tenants SET api_key_hash = $1 WHERE api_key_hash = 'replaced'"),
        ("UPDATE tenants SET enabled = false WHERE api_key_hash = $1",
         "UPDATE tenants SET enabled = true WHERE api_key_hash = $1"),
    ],
    ids=["key rotated", "tenant disabled"],
)  # fmt: skip
async def test_a_rotated_key_or_a_disabled_tenant_ends_its_sessions_at_once(
    config: Config, database_url: str, end: str, undo: str
) -> None:
    key, other = await create_tenant(database_url), await create_tenant(database_url)
    async with (
        run_notifier(config, ("ingest",)) as running,
        signed_in(running, key) as ours,
        signed_in(running, other) as theirs,
    ):
        cookie = ours.cookies[COOKIE]
        await sql(database_url, end, hash_api_key(key))
        # At once: no wait for a cache to be told.
        assert sent_to_sign_in(await with_cookie(running, cookie))
        # Ended, not suspended: the key (or the tenant) back does not revive it.
        await sql(database_url, undo, hash_api_key(key))
        assert sent_to_sign_in(await with_cookie(running, cookie))
        # Another tenant's session goes on.
        assert (await theirs.get("/console/")).status_code == 200


async def sign_in_from(
    browser: httpx.AsyncClient, key: str, forwarded_for: str | None
) -> httpx.Response:
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    form = {"api_key": key, "csrf": await token_of(browser, "/console/sign-in")}
    return await browser.post("/console/sign-in", data=form, headers=headers)


async def failures_until_slowed_down(
    browser: httpx.AsyncClient, forwarded_for: Callable[[int], str]
) -> int:
    """Sign in with a wrong key (``forwarded_for(n)`` the n-th time) until refused with 429;
    how many were heard (401) before. The wait after the fifth is a second, so a slow machine
    may hear one more: the count is what the table holds."""
    heard = 0
    for n in range(12):
        resp = await sign_in_from(browser, "wrong", forwarded_for(n))
        if resp.status_code == 429:
            assert "try again in" in resp.text
            return heard
        assert resp.status_code == 401, resp.text
        heard += 1
    raise AssertionError(f"never slowed down after {heard} failures")


async def test_behind_a_trusted_proxy_one_client_locked_out_never_locks_out_another(
    database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    # The test connects from 127.0.0.1: the proxy in front.
    config = make_config(database_url, broker_url, console={"trusted_proxies": ["127.0.0.0/8"]})
    async with run_notifier(config, ("ingest",)) as running:
        async with httpx.AsyncClient(base_url=running.base_url, timeout=10) as browser:
            # Wrong keys from one client (which also claims addresses of its own, left of the
            # one the proxy wrote) until it is slowed down: after the five free failures.
            assert await failures_until_slowed_down(
                browser, lambda n: f"6.6.6.{n}, 198.51.100.7"
            ) == 5  # fmt: skip
            # Another client behind the same proxy signs in at once.
            resp = await sign_in_from(browser, key, "198.51.100.8")
            assert resp.status_code == 303, resp.text
        # Counted in Postgres for the fleet, by the address the proxy forwarded.
        rows = await sql(database_url, "SELECT address, failures FROM console_signin_failures")
        assert [tuple(r) for r in rows] == [("198.51.100.7", 5)]


async def test_from_an_untrusted_peer_x_forwarded_for_is_ignored(
    database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url, console={"trusted_proxies": ["10.0.0.0/8"]})
    async with run_notifier(config, ("ingest",)) as running:
        async with httpx.AsyncClient(base_url=running.base_url, timeout=10) as browser:
            # A new made-up address each time: counted against the peer all the same.
            assert await failures_until_slowed_down(browser, lambda n: f"198.51.100.{n}") == 5
        rows = await sql(database_url, "SELECT address, failures FROM console_signin_failures")
        assert [tuple(r) for r in rows] == [("127.0.0.1", 5)]


async def test_the_overview_shows_the_tenants_own_queue_only(
    config: Config, database_url: str
) -> None:
    key, other = await create_tenant(database_url), await create_tenant(database_url)
    hook = {"type": "webhook", "name": "hook", "config": {"url": "http://127.0.0.1:9/hook"}}
    async with run_notifier(config, ("ingest",)) as running:
        for api_key, events in ((key, 2), (other, 7)):
            async with running.client(api_key) as api:
                assert (await api.post("/v1/channels", json=hook)).status_code == 201
                for n in range(events):
                    event = {"type": "order.created", "payload": {"n": n}}
                    assert (await api.post("/v1/events", json=event)).status_code == 202
        await sql(
            database_url,
            "UPDATE deliveries SET status = 'DEAD' WHERE id IN (SELECT id FROM deliveries "
            "WHERE tenant_id = (SELECT id FROM tenants WHERE api_key_hash = $1) LIMIT 3)",
            hash_api_key(other),
        )
        async with signed_in(running, key) as browser:
            body = (await browser.get("/console/")).text
    queue = re.search(r'id="queue">.*?<tbody>(.*?)</tbody>', body, re.S)
    assert queue, body
    assert re.findall(r'class="num">(\d+)<', queue.group(1)) == ["2", "0", "0"]
    assert "Queue depths" not in body  # the fleet's: never
    assert 'id="queues"' not in body


# -- two processes of one launch, no secret configured ------------------------------------------


async def exchange(
    port: int, kids: set[int], method: str, path: str, *, cookie: str | None = None,
    form: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], str, int | None]:  # fmt: skip
    """One request on a connection of its own: status, headers (lower-case names), body, and
    the process that answered it."""
    body = "&".join(f"{k}={v}" for k, v in (form or {}).items()).encode()
    extra = {"Cookie": f"{COOKIE}={cookie}"} if cookie else {}
    if form is not None:
        extra["Content-Type"] = "application/x-www-form-urlencoded"
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        status, headers, answer = await http_exchange(stream, method, path, body, extra)
        owner = owner_of_connection(port, stream.socket.getsockname()[1], kids)
    return status, headers, answer.decode(), owner


def cookie_of(headers: dict[str, str]) -> str:
    found = re.match(rf"{COOKIE}=([^;]+)", headers["set-cookie"])
    assert found, headers
    return found.group(1)


@pytest.mark.slow
async def test_two_processes_without_a_secret_accept_each_others_sessions_and_forms(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    config = ingest_config(database_url, broker_url)
    async with launched(tmp_path, config, "--role", "ingest", "--processes", "2") as launch:
        kids = await launch.wait_children(2)
        port = launch.port
        crossed: set[str] = set()  # the steps answered by another process than the one before
        answered: set[int | None] = set()
        with trio.fail_after(120):
            for _ in range(60):
                if len(crossed) == 4 and answered >= kids:
                    break
                # the sign-in form on one connection, posted on another
                status, headers, body, form_at = await exchange(
                    port, kids, "GET", "/console/sign-in"
                )
                assert status == 200
                anonymous, token = cookie_of(headers), CSRF.search(body).group(1)  # type: ignore[union-attr]
                status, headers, body, at = await exchange(
                    port, kids, "POST", "/console/sign-in", cookie=anonymous,
                    form={"api_key": key, "csrf": token},
                )  # fmt: skip
                assert status == 303, (at, body)
                crossed |= {"sign-in"} if at != form_at else set()
                session, before = cookie_of(headers), at
                # a page of the session, then a form of that page (sign-out) posted elsewhere
                status, _, body, at = await exchange(port, kids, "GET", "/console/", cookie=session)
                assert status == 200, (at, body)
                crossed |= {"page"} if at != before else set()
                token, before = CSRF.search(body).group(1), at  # type: ignore[union-attr]
                status, headers, body, at = await exchange(
                    port, kids, "POST", "/console/sign-out", cookie=session, form={"csrf": token}
                )  # fmt: skip
                assert (status, headers.get("location")) == (303, "/console/sign-in"), (at, body)
                crossed |= {"sign-out"} if at != before else set()
                before = at
                # signed out on every process at once
                status, headers, _, at = await exchange(
                    port, kids, "GET", "/console/", cookie=session
                )
                assert (status, headers.get("location")) == (303, "/console/sign-in"), at
                crossed |= {"signed out"} if at != before else set()
                answered |= {form_at, at}
        assert answered >= kids, answered
        assert crossed == {"sign-in", "page", "sign-out", "signed out"}, crossed
    assert "secret made for it" in launch.process.log()


def test_a_trusted_proxy_that_is_no_network_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"console\.trusted_proxies\[1\]"):
        make_config("postgresql://x/y", "amqp://x", console={
            "trusted_proxies": ["10.0.0.0/8", "10.0.0.1/8"],  # host bits set: not a network
        })  # fmt: skip
