"""The console's first page: how the tenant's deliveries are doing."""

from __future__ import annotations

from quart import Response

from notifier.console.web import page, routes, signed_in_tenant


@routes.get("/")
async def overview() -> Response:
    await signed_in_tenant()
    return await page("overview.html", signed_in=True)
