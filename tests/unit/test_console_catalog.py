"""The console's Event types page over the in-memory store: the signed-in tenant's types only,
their descriptions and schemas escaped, the strict switch, and the sign-in it needs."""

from __future__ import annotations

from tests.unit.console_browser import Browser


async def test_the_event_types_page_lists_the_tenants_types_escaped(browser: Browser) -> None:
    a, b = browser.tenants["a"], browser.tenants["b"]
    await browser.store.put_event_type(
        a, "order.paid", description="<script>alert(1)</script>paid",
        schema={"type": "object", "properties": {"note": {"pattern": "^<b>"}}}, max_types=10,
    )  # fmt: skip
    await browser.store.put_event_type(b, "b.secret", description="b's", schema={}, max_types=10)
    status, _, headers = await browser.get("/console/event-types")
    assert (status, headers["Location"]) == (303, "/console/sign-in")  # not signed in
    await browser.sign_in("key-a")
    status, body, _ = await browser.get("/console/event-types")
    assert status == 200
    assert 'href="/console/event-types"' in body  # in the navigation
    assert 'id="event-type-order.paid"' in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;paid" in body
    assert "<script>" not in body
    assert "&#34;^&lt;b&gt;&#34;" in body  # the schema, as text
    assert "b.secret" not in body
    assert "stored unchecked" in body
    await browser.store.set_strict_event_types(a, True)
    _, body, _ = await browser.get("/console/event-types")
    assert "unregistered_event_type" in body


async def test_no_event_type_yet_says_how_to_register_one(browser: Browser) -> None:
    await browser.sign_in("key-b")
    _, body, _ = await browser.get("/console/event-types")
    assert "No event type yet" in body
    assert "PUT /v1/event-types/{name}" in body
