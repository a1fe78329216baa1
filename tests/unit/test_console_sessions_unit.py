"""The console's sessions through the app's test client on the in-memory stores: signing in and
out, a copied cookie after sign-out, the cookie's flags, the sign-in slow-down and the client
address it counts, the signed cookie and its CSRF token, and the security headers.
tests/adversarial/test_console_sessions.py runs them on Postgres over HTTP."""

from __future__ import annotations

import logging
import uuid

import pytest

from notifier.console.session import Sessions, SignInThrottle, client_address, trusted_networks
from notifier.ingest.tenants import hash_api_key
from notifier.testing.console import MemoryConsoleStore
from tests.unit.console_browser import CSRF, Browser


async def test_a_signed_out_browser_is_sent_to_sign_in(browser: Browser) -> None:
    for path in ("/console/", "/console/deliveries", f"/console/events/{uuid.uuid4()}"):
        status, _, headers = await browser.get(path)
        assert (status, headers["Location"]) == (303, "/console/sign-in"), path


async def test_signing_in_with_a_key_opens_the_console_and_signing_out_closes_it(
    browser: Browser,
) -> None:
    await browser.sign_in()
    status, body, _ = await browser.get("/console/")
    assert status == 200
    assert "key-a" not in body
    token = CSRF.search(body)
    assert token
    status, _, headers = await browser.post("/console/sign-out", {}, csrf=token.group(1))
    assert (status, headers["Location"]) == (303, "/console/sign-in")
    assert (await browser.get("/console/"))[0] == 303


async def test_a_copied_cookie_opens_nothing_once_its_session_signed_out(
    browser: Browser,
) -> None:
    data = {"api_key": "key-a", "csrf": await browser.csrf()}
    resp = await browser.client.post("/console/sign-in", form=data)
    cookie = resp.headers["Set-Cookie"].split(";")[0]  # notifier_console=<signed id>
    assert hash_api_key("key-a") not in cookie  # a random id only
    replayed = {"Cookie": cookie}
    assert (await browser.client.get("/console/", headers=replayed)).status_code == 200
    status, _, _ = await browser.post("/console/sign-out", {}, page="/console/")
    assert status == 303
    resp = await browser.client.get("/console/", headers=replayed)
    assert (resp.status_code, resp.headers["Location"]) == (303, "/console/sign-in")


async def test_the_session_cookie_is_http_only_strict_and_never_holds_the_key(
    browser: Browser,
) -> None:
    data = {"api_key": "key-a", "csrf": await browser.csrf()}
    resp = await browser.client.post("/console/sign-in", form=data)
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert "Secure" not in cookie  # served over plain HTTP here
    assert "key-a" not in cookie
    assert "key-a" not in resp.headers.get("Location", "")
    data = {"api_key": "key-a", "csrf": await browser.csrf()}
    behind_tls = {"X-Forwarded-Proto": "https"}  # a proxy terminating TLS in front
    resp = await browser.client.post("/console/sign-in", form=data, headers=behind_tls)
    assert "Secure" in resp.headers["Set-Cookie"]


async def test_a_wrong_key_is_refused_and_shown_nowhere(
    browser: Browser, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    status, body, _ = await browser.post("/console/sign-in", {"api_key": "wrong-<b>key"})
    assert status == 401
    assert "not accepted" in body
    assert "wrong" not in body
    assert "gave no valid API key" in caplog.text
    assert "wrong" not in caplog.text
    assert (await browser.get("/console/"))[0] == 303
    await browser.sign_in()
    assert "key-a" not in caplog.text


async def test_repeated_failed_sign_ins_from_one_address_are_slowed_down(
    browser: Browser,
) -> None:
    for _ in range(5):
        assert (await browser.post("/console/sign-in", {"api_key": "nope"}))[0] == 401
    status, body, _ = await browser.post("/console/sign-in", {"api_key": "key-a"})
    assert status == 429  # even the right key waits: the address is slowed down
    assert "try again in" in body


async def test_the_throttle_doubles_the_wait_after_the_free_attempts() -> None:
    clock = [100.0]
    throttle = SignInThrottle(
        MemoryConsoleStore(lambda: clock[0]), free=2, base_seconds=1.0, max_seconds=4.0,
        forget_after_seconds=900.0,
    )  # fmt: skip
    for expected in (0.0, 0.0, 1.0, 2.0, 4.0, 4.0):  # after 0, 1, 2, ... failures
        assert await throttle.wait_seconds("10.0.0.1") == expected
        await throttle.failed("10.0.0.1")
    clock[0] += 3.0
    assert await throttle.wait_seconds("10.0.0.1") == 1.0  # counted from the last failure
    assert await throttle.wait_seconds("10.0.0.2") == 0.0  # per address
    await throttle.succeeded("10.0.0.1")
    assert await throttle.wait_seconds("10.0.0.1") == 0.0


async def test_the_throttle_forgets_an_address_after_a_quiet_while() -> None:
    clock = [0.0]
    throttle = SignInThrottle(MemoryConsoleStore(lambda: clock[0]), free=1)
    await throttle.failed("a")
    await throttle.failed("a")
    assert await throttle.wait_seconds("a") == 2.0
    clock[0] += 15 * 60
    assert await throttle.wait_seconds("a") == 0.0
    await throttle.failed("a")  # counts from one again
    assert await throttle.wait_seconds("a") == 1.0


def test_a_session_cookie_is_refused_when_forged_or_expired() -> None:
    sessions = Sessions("secret", max_age_seconds=60)
    value = sessions.dump("the-id")
    assert sessions.load(value) == "the-id"
    assert Sessions("another secret", 60).load(value) is None
    assert sessions.load(value[:-2] + "xx") is None
    assert sessions.load("garbage") is None
    assert Sessions("secret", max_age_seconds=-1).load(value) is None  # already expired


def test_the_csrf_token_is_an_hmac_of_the_session_id() -> None:
    sessions = Sessions("secret", max_age_seconds=60)
    token = sessions.csrf("the-id")
    assert sessions.csrf_ok("the-id", token)
    assert Sessions("secret", 60).csrf_ok("the-id", token)  # another process, same secret
    assert not Sessions("another secret", 60).csrf_ok("the-id", token)
    assert not sessions.csrf_ok("another-id", token)
    assert not sessions.csrf_ok(None, token)
    assert "the-id" not in token


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        ("203.0.113.9", ["198.51.100.1"], "203.0.113.9"),  # an untrusted peer: X-F-F ignored
        ("10.0.0.2", ["198.51.100.1"], "198.51.100.1"),
        ("10.0.0.2", ["6.6.6.6, 198.51.100.1"], "198.51.100.1"),  # the client's own: ignored
        ("10.0.0.2", ["6.6.6.6", "198.51.100.1, 10.0.0.3"], "198.51.100.1"),  # proxies skipped
        ("10.0.0.2", ["10.0.0.3"], "10.0.0.3"),  # all trusted: the left-most
        ("10.0.0.2", [], "10.0.0.2"),
        (None, [], "unknown"),
    ],
)
def test_the_client_address_is_forwarded_only_by_a_trusted_proxy(
    peer: str | None, forwarded: list[str], expected: str
) -> None:
    assert client_address(peer, forwarded, trusted_networks(["10.0.0.0/8"])) == expected
    if peer is not None:
        assert client_address(peer, forwarded, ()) == peer  # no trusted proxy at all


async def test_a_form_posted_without_its_csrf_token_is_refused(browser: Browser) -> None:
    assert (await browser.post("/console/sign-in", {"api_key": "key-a"}, csrf=None))[0] == 403
    assert (await browser.post("/console/sign-in", {"api_key": "key-a"}, csrf="forged"))[0] == 403
    await browser.sign_in()
    status, body, _ = await browser.post("/console/sign-out", {}, csrf=None)
    assert status == 403
    assert "expired" in body
    assert (await browser.get("/console/"))[0] == 200  # still signed in


async def test_every_answer_carries_the_security_headers(browser: Browser) -> None:
    for path in ("/console/sign-in", "/console/", "/console/nowhere"):
        _, _, headers = await browser.get(path)
        csp = headers["Content-Security-Policy"]
        assert "script-src" not in csp
        assert "default-src 'none'" in csp
        assert "frame-ancestors 'none'" in csp
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["Referrer-Policy"] == "no-referrer"
        assert headers["Content-Type"].startswith("text/html")
