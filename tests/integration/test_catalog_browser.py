"""The console's event-type catalog page in a real browser (headless Chromium, as
``test_console_browser``), against an in-process ingest on the real Postgres: an operator signed
in finds the tenant's event types, with their descriptions (markup shown as text) and schemas,
from the navigation, and whether unregistered types are refused. The screenshot
docs/console-catalog.png (for the README) is taken here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.integration.conftest import create_tenant, make_config, run_notifier
from tests.integration.test_console_browser import chrome, run, shots, sign_in, wait_for

__all__ = ["chrome", "shots"]  # the fixtures, shared with test_console_browser

pytestmark = pytest.mark.slow

ORDER_PAID = {
    "type": "object",
    "required": ["order_id", "total"],
    "properties": {
        "order_id": {"type": "integer"},
        "total": {"$ref": "#/$defs/money"},
        "currency": {"enum": ["EUR", "USD"]},
    },
    "$defs": {"money": {"type": "number", "minimum": 0}},
}
USER_SIGNED_UP = {
    "type": "object",
    "required": ["user_id"],
    "properties": {"user_id": {"type": "string"}, "email": {"type": "string", "format": "email"}},
}


def cells(chrome: WebDriver) -> Iterator[list[str]]:
    for row in chrome.find_elements(By.CSS_SELECTOR, "#event-types tr.event-type-row"):
        yield [td.text for td in row.find_elements(By.TAG_NAME, "td")]


async def test_an_operator_reads_the_tenants_event_types(
    chrome: WebDriver, database_url: str, broker_url: str, shots: Path
) -> None:
    key = await create_tenant(database_url)
    async with run_notifier(make_config(database_url, broker_url), ("ingest",)) as running:
        base = running.base_url
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=10
        ) as api:
            for name, description, schema in (
                ("order.paid", "An order was paid <b>in full</b>.", ORDER_PAID),
                ("user.signed_up", "A user signed up.", USER_SIGNED_UP),
            ):
                put = await api.put(
                    f"/v1/event-types/{name}", json={"description": description, "schema": schema}
                )
                assert put.status_code == 201, put.text
            strict = await api.patch("/v1/tenant", json={"strict_event_types": True})
            assert strict.status_code == 200, strict.text

        await run(sign_in, chrome, base, key)

        def open_catalog() -> list[list[str]]:
            chrome.find_element(By.LINK_TEXT, "Event types").click()
            wait_for(chrome, lambda c: c.find_elements(By.CSS_SELECTOR, "tr.event-type-row"))
            for summary in chrome.find_elements(By.CSS_SELECTOR, "#event-types summary"):
                summary.click()  # the schemas unfolded, for the screenshot
            chrome.save_screenshot(str(shots / "console-catalog.png"))
            return list(cells(chrome))

        rows = await run(open_catalog)
        assert [r[0] for r in rows] == ["order.paid", "user.signed_up"]
        assert rows[0][1] == "An order was paid <b>in full</b>."  # markup shown as text
        assert await run(lambda: chrome.find_elements(By.CSS_SELECTOR, "#event-types td b")) == []
        assert '"$ref": "#/$defs/money"' in rows[0][2]
        assert "strict" in await run(lambda: chrome.find_element(By.ID, "strict-mode").text)
