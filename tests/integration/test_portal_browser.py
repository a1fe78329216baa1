"""The customer portal in a real browser: headless Chromium driven with Selenium (as the
console's browser tests), against an in-process notifier on the real Postgres and RabbitMQ. A
tenant's customer opens a portal link, adds an endpoint, finds a DEAD delivery with its attempts,
replays it and watches it delivered, rotates a signing secret and sends a test event signed with
it; another customer's ids answer "no such" pages; revoked and expired links are refused. The
portal screenshots in docs/ are taken here (UPDATE_SCREENSHOTS=1).

Selenium's calls block: they run in a worker thread while notifier runs in this trio loop."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from notifier.adapters.webhook import generate_secret
from notifier.testing import open_sink
from tests.integration.conftest import (
    create_tenant,
    make_config,
    run_notifier,
    scalar,
    sql,
    verify,
    wait_status,
)
from tests.integration.test_console_browser import (
    DOCS,
    WAIT_SECONDS,
    Receiver,
    open_chrome,
    run,
    wait_for,
)

pytestmark = pytest.mark.slow

PUBLIC_URL = "https://hooks.example.com"


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return DOCS if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path


@pytest.fixture(scope="module")
def chrome() -> Iterator[WebDriver]:
    chrome = open_chrome()
    try:
        yield chrome
    finally:
        chrome.quit()


def error_text(chrome: WebDriver) -> str:
    return str(wait_for(chrome, lambda c: c.find_element(By.ID, "error")).text)


def open_link(chrome: WebDriver, base: str, url: str) -> None:
    """Open a portal link as the customer would (its host is the configured public one; the
    test's notifier listens on ``base``)."""
    chrome.get(base + url.removeprefix(PUBLIC_URL))
    wait_for(chrome, lambda c: c.find_elements(By.ID, "endpoints"))
    assert chrome.current_url == f"{base}/portal/"  # the token left the address bar


async def test_a_customer_manages_its_endpoints_and_deliveries_in_the_portal(
    chrome: WebDriver, database_url: str, broker_url: str, shots: Path
) -> None:
    config = make_config(
        database_url, broker_url, retry={"tiers_seconds": [1]}, console={"public_url": PUBLIC_URL}
    )
    key = await create_tenant(database_url)
    receiver = Receiver()
    async with open_sink(receiver) as sink, run_notifier(config) as running:
        base = running.base_url
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=10
        ) as api:

            async def channel(name: str, customer: str) -> str:
                made = await api.post("/v1/channels", json={
                    "type": "webhook", "name": name, "max_attempts": 1, "customer": customer,
                    "config": {"url": sink.url, "secret": generate_secret()},
                })  # fmt: skip
                assert made.status_code == 201, made.text
                return str(made.json()["id"])

            ours, theirs = await channel("acme-orders", "acme"), await channel("globex", "globex")

            async def event(channel_id: str) -> str:
                sent = await api.post("/v1/events", json={
                    "type": "order.paid", "payload": {"order": 42}, "channel_ids": [channel_id],
                })  # fmt: skip
                return str(sent.json()["deliveries"][0]["id"])

            dead, their_delivery = await event(ours), await event(theirs)
            with trio.fail_after(WAIT_SECONDS):
                await wait_status(database_url, dead, "DEAD")
            link = (await api.post("/v1/portal-links", json={"customer": "acme"})).json()
            assert link["url"].startswith(f"{PUBLIC_URL}/portal/enter/")

            await run(open_link, chrome, base, link["url"])
            page = await run(lambda: chrome.page_source)
            assert "acme-orders" in page
            assert "globex" not in page
            assert key not in page

            def add_endpoint() -> str:
                chrome.find_element(By.ID, "new-endpoint").click()
                chrome.find_element(By.ID, "name").send_keys("acme-billing")
                chrome.find_element(By.ID, "url").send_keys(sink.url + "/billing")
                chrome.find_element(By.ID, "save-endpoint").click()
                secret = wait_for(chrome, lambda c: c.find_element(By.ID, "new-secret")).text
                chrome.find_element(By.LINK_TEXT, "Back to the endpoints").click()
                wait_for(
                    chrome, lambda c: len(c.find_elements(By.CSS_SELECTOR, "tr.endpoint-row")) == 2
                )
                chrome.save_screenshot(str(shots / "portal-endpoints.png"))
                return str(secret)

            assert (await run(add_endpoint)).startswith("whsec_")
            assert await scalar(
                database_url, "SELECT customer FROM channels WHERE name = 'acme-billing'"
            ) == "acme"  # fmt: skip

            def find_dead() -> None:
                chrome.find_element(By.LINK_TEXT, "Deliveries").click()
                links = wait_for(
                    chrome, lambda c: c.find_elements(By.CSS_SELECTOR, "a.delivery-link")
                )
                assert [a.get_attribute("href").rsplit("/", 1)[1] for a in links] == [dead]
                chrome.save_screenshot(str(shots / "portal-deliveries.png"))
                links[0].click()
                wait_for(chrome, lambda c: c.find_element(By.ID, "delivery-status").text == "DEAD")

            await run(find_dead)
            assert "receiver says no" in await run(
                lambda: chrome.find_element(By.ID, "attempts").text
            )
            receiver.status = 200

            def replay_and_watch() -> None:
                chrome.find_element(By.ID, "replay").click()
                wait_for(chrome, lambda c: c.find_elements(By.ID, "notice"))
                wait_for(
                    chrome, lambda c: c.find_element(By.ID, "delivery-status").text == "DELIVERED"
                )
                chrome.save_screenshot(str(shots / "portal-delivery.png"))

            await run(replay_and_watch)

            def rotate_and_test() -> str:
                chrome.find_element(By.LINK_TEXT, "Endpoints").click()
                row = chrome.find_element(By.ID, f"endpoint-{ours}")
                row.find_element(By.CSS_SELECTOR, "button.rotate").click()
                secret = str(wait_for(chrome, lambda c: c.find_element(By.ID, "new-secret")).text)
                chrome.find_element(By.LINK_TEXT, "Endpoints").click()
                row = chrome.find_element(By.ID, f"endpoint-{ours}")
                row.find_element(By.CSS_SELECTOR, "button.send-test").click()
                wait_for(chrome, lambda c: "notice=test" in c.current_url)
                wait_for(
                    chrome, lambda c: c.find_element(By.ID, "delivery-status").text == "DELIVERED"
                )
                return secret

            secret = await run(rotate_and_test)
            assert verify(sink.received[-1], secret)["type"] == "notifier.test"

            # Another customer's ids, and made-up ones: no such page.
            def visit(path: str) -> str:
                chrome.get(base + path)
                return error_text(chrome)

            for path in (f"/portal/endpoints/{theirs}", f"/portal/deliveries/{their_delivery}",
                         f"/portal/endpoints/{uuid.uuid4()}"):  # fmt: skip
                assert "There is no such" in await run(visit, path)

            # Revoked: the open session ends, and the link is refused.
            assert (await api.delete(f"/v1/portal-links/{link['id']}")).status_code == 204
            assert "has ended" in await run(visit, "/portal/")
            refused = await run(visit, link["url"].removeprefix(PUBLIC_URL))
            assert "revoked" in refused
            await run(chrome.save_screenshot, str(shots / "portal-refused.png"))

            # Expired (on Postgres's clock, which the portal reads): refused as well.
            expiring = (await api.post("/v1/portal-links", json={"customer": "acme"})).json()
            await sql(database_url, "UPDATE portal_links SET expires_at = now() - interval '1 s'"
                      " WHERE id = $1", uuid.UUID(expiring["id"]))  # fmt: skip
            assert "expired" in await run(visit, expiring["url"].removeprefix(PUBLIC_URL))
