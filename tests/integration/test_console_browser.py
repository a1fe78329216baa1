"""The console in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, installed by scripts/ensure-services) driven with Selenium, against an
in-process notifier on the real Postgres and RabbitMQ. An operator signs in, finds a DEAD
delivery by filter, opens it (its markup payload shown as text), replays it and watches it
become DELIVERED; rotates a secret; a form without its CSRF token is refused; a signed-out
browser is sent to sign in. The screenshots in docs/ (for the README) are taken here.

Selenium's calls block: they run in a worker thread while notifier runs in this trio loop."""

from __future__ import annotations

import functools
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

from notifier.adapters.webhook import generate_secret
from notifier.testing import Received, open_sink
from tests.integration.conftest import (
    create_tenant,
    make_config,
    run_notifier,
    scalar,
    verify,
    wait_status,
)

pytestmark = pytest.mark.slow

# The screenshots go into docs/ (the README shows them) when UPDATE_SCREENSHOTS=1, else
# next to the test's other files: a test run leaves the checkout as it was.
DOCS = Path(__file__).resolve().parents[2] / "docs"
WAIT_SECONDS = 30.0  # for the browser's pages and the pipeline's delivery, on a busy machine
PAYLOAD = {"order": 42, "note": "<script>document.title='owned'</script><b>bold</b>"}
T = TypeVar("T")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return DOCS if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path


def open_chrome() -> WebDriver:
    """Headless Chromium, driven through chromedriver."""
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.fail(
            "chromium and chromium-driver are missing: scripts/ensure-services installs them"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,860", "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    chrome.set_page_load_timeout(WAIT_SECONDS)
    return chrome


@pytest.fixture(scope="module")
def chrome() -> Iterator[WebDriver]:
    chrome = open_chrome()
    try:
        yield chrome
    finally:
        chrome.quit()


async def run(fn: Callable[..., T], *args: Any) -> T:
    return await trio.to_thread.run_sync(functools.partial(fn, *args))


def wait_for(chrome: WebDriver, check: Callable[[WebDriver], Any]) -> Any:
    """Until ``check`` is true. A page that reloads itself (a delivery not finished yet) may
    be replaced between finding an element and reading it: that is tried again."""
    changing = (NoSuchElementException, StaleElementReferenceException)
    wait = WebDriverWait(chrome, WAIT_SECONDS, poll_frequency=0.2, ignored_exceptions=changing)
    return wait.until(check)


def sign_in(chrome: WebDriver, base: str, key: str) -> None:
    chrome.get(f"{base}/console/")
    wait_for(chrome, lambda c: c.current_url.endswith("/console/sign-in"))  # sent to sign in
    chrome.find_element(By.ID, "api_key").send_keys(key)
    chrome.find_element(By.ID, "sign-in").click()
    wait_for(chrome, lambda c: c.find_elements(By.ID, "sign-out"))
    assert key not in chrome.current_url
    assert key not in chrome.page_source


class Receiver:
    """A webhook receiver answering ``status`` (changed while it runs)."""

    def __init__(self) -> None:
        self.status = 500

    def __call__(self, _: Received) -> tuple[int, dict[str, str], bytes]:
        return self.status, {}, b"receiver says no" if self.status >= 400 else b"ok"


async def test_an_operator_finds_a_dead_delivery_replays_it_and_watches_it_delivered(
    chrome: WebDriver, database_url: str, broker_url: str, shots: Path
) -> None:
    config = make_config(database_url, broker_url, retry={"tiers_seconds": [1]})
    key = await create_tenant(database_url)
    receiver = Receiver()
    async with open_sink(receiver) as sink, run_notifier(config) as running:
        base = running.base_url
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=10
        ) as api:
            created = await api.post("/v1/channels", json={
                "type": "webhook", "name": "orders-hook", "max_attempts": 1,
                "config": {"url": sink.url, "secret": generate_secret()},
            })  # fmt: skip
            assert created.status_code == 201, created.text
            await api.post("/v1/events", json={"type": "user.signed_up", "payload": {"n": 1}})
            sent = await api.post("/v1/events", json={"type": "order.paid", "payload": PAYLOAD})
            (dead,) = [d["id"] for d in sent.json()["deliveries"]]
            with trio.fail_after(WAIT_SECONDS):
                await wait_status(database_url, dead, "DEAD")

        await run(sign_in, chrome, base, key)
        await run(chrome.save_screenshot, str(shots / "console-overview.png"))

        def find_dead() -> None:
            chrome.find_element(By.LINK_TEXT, "Deliveries").click()
            Select(chrome.find_element(By.ID, "filter-status")).select_by_value("DEAD")
            chrome.find_element(By.ID, "filter-type").send_keys("order.*")
            chrome.find_element(By.ID, "apply-filter").click()
            wait_for(chrome, lambda c: "status=DEAD" in c.current_url)
            links = chrome.find_elements(By.CSS_SELECTOR, "#deliveries a.delivery-link")
            assert [a.get_attribute("href").rsplit("/", 1)[1] for a in links] == [dead]
            chrome.save_screenshot(str(shots / "console-deliveries.png"))
            links[0].click()
            wait_for(chrome, lambda c: c.find_elements(By.ID, "payload"))

        await run(find_dead)
        shown = await run(lambda: chrome.find_element(By.ID, "payload").text)
        assert "<script>document.title='owned'</script><b>bold</b>" in shown  # as text
        assert (
            await run(lambda: chrome.find_elements(By.CSS_SELECTOR, "#payload script, #payload b"))
            == []
        )
        assert await run(lambda: chrome.title) != "owned"
        assert await run(lambda: chrome.find_element(By.ID, "delivery-status").text) == "DEAD"

        receiver.status = 200  # the receiver is fixed; the operator replays

        def replay_and_watch() -> None:
            chrome.find_element(By.ID, "replay").click()
            wait_for(chrome, lambda c: c.find_elements(By.ID, "notice"))
            # The page reloads itself until the delivery is finished.
            wait_for(chrome, lambda c: c.find_element(By.ID, "delivery-status").text == "DELIVERED")
            chrome.save_screenshot(str(shots / "console-delivery.png"))

        await run(replay_and_watch)
        rows = await run(lambda: chrome.find_element(By.ID, "attempts").text)
        assert "dead" in rows
        assert "delivered" in rows

        def rotate() -> str:
            chrome.find_element(By.LINK_TEXT, "Channels").click()
            wait_for(chrome, lambda c: c.find_elements(By.CSS_SELECTOR, "tr.channel-row"))
            chrome.save_screenshot(str(shots / "console-channels.png"))
            chrome.find_element(By.CSS_SELECTOR, "button.rotate").click()
            return str(wait_for(chrome, lambda c: c.find_element(By.ID, "new-secret")).text)

        secret = await run(rotate)

        def send_test_and_follow() -> None:
            chrome.find_element(By.LINK_TEXT, "Channels").click()
            chrome.find_element(By.CSS_SELECTOR, "button.send-test").click()
            wait_for(chrome, lambda c: "notice=test" in c.current_url)
            wait_for(chrome, lambda c: c.find_element(By.ID, "delivery-status").text == "DELIVERED")

        await run(send_test_and_follow)
        assert verify(sink.received[-1], secret)["type"] == "notifier.test"  # the new secret signs
        assert re.fullmatch(r"whsec_[A-Za-z0-9+/=]+", secret)
        # The secret shown is the one now signing (the API never shows it again).
        assert await scalar(database_url, "SELECT config->>'secret' FROM channels") == secret


async def test_a_form_without_its_token_is_refused_and_signing_out_locks_the_console(
    chrome: WebDriver, database_url: str, broker_url: str
) -> None:
    config = make_config(database_url, broker_url)
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running:
        base = running.base_url
        await run(sign_in, chrome, base, key)

        def post_without_token() -> str:
            # The form as a page would post it, less its token (WebDriver's script runs
            # outside the page's Content-Security-Policy).
            chrome.execute_script("document.querySelector('input[name=csrf]').remove()")
            chrome.find_element(By.ID, "sign-out").click()
            return str(wait_for(chrome, lambda c: c.find_element(By.ID, "error")).text)

        assert "expired" in await run(post_without_token)

        def still_signed_in_then_sign_out() -> str:
            chrome.get(f"{base}/console/deliveries")
            chrome.find_element(By.ID, "sign-out").click()
            wait_for(chrome, lambda c: c.current_url.endswith("/console/sign-in"))
            chrome.get(f"{base}/console/deliveries")
            return str(chrome.current_url)

        assert (await run(still_signed_in_then_sign_out)).endswith("/console/sign-in")
