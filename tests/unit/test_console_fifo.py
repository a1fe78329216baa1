"""The console's channel list shows a FIFO channel's line (README "Ordered delivery (FIFO)"):
how many deliveries wait and how far behind it is, or that it is caught up; an ordinary
channel shows nothing of it."""

from __future__ import annotations

import re

from tests.unit.console_browser import Browser
from tests.unit.test_console_unit import api, channel


def row(page: str, channel_id: str) -> str:
    [found] = re.findall(
        rf'<tr class="channel-row" id="channel-{channel_id}">(.*?)</tr>', page, re.S
    )
    return str(found)


async def test_a_fifo_channels_line_is_shown(browser: Browser) -> None:
    body = {
        "type": "webhook",
        "config": {"url": "https://hooks.example.com/in"},
        "ordering": "fifo",
    }
    made = await api(browser, "/v1/channels", body)
    assert made["ordering"] == "fifo"
    fifo, plain = str(made["id"]), await channel(browser)
    await browser.sign_in()

    _, page, _ = await browser.get("/console/channels")
    assert "FIFO: caught up" in row(page, fifo)
    assert "FIFO" not in row(page, plain)

    for n in range(3):  # nothing delivers them: they wait
        await api(browser, "/v1/events", {"type": "t", "payload": {"n": n}, "channel_ids": [fifo]})
    _, page, _ = await browser.get("/console/channels")
    assert re.search(r"FIFO: 3 waiting, the oldest accepted \d+ s ago</span>", row(page, fifo))
