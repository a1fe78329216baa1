"""Portal links (README "Customer portal"): the tenant's links, newest first, with their scope
and state, and revoking one — its sessions end at once. Links are made with the API
(``POST /v1/portal-links``): their URL is shown only in that answer."""

from __future__ import annotations

import uuid
from typing import cast

from quart import Response, redirect, request

from notifier.console.web import PREFIX, ConsoleError, page, routes, signed_in_tenant
from notifier.ingest.api.context import api_context
from notifier.store.portal import PortalStore

MAX_LINKS = 200  # shown on the page, newest first


def _store() -> PortalStore:
    store = api_context().store
    if not isinstance(store, PortalStore):
        raise ConsoleError(503, "This store keeps no portal links.")
    return store


@routes.get("/portal-links")
async def portal_links() -> Response:
    tenant_id = await signed_in_tenant()
    links = await _store().list_portal_links(tenant_id, before=None, limit=MAX_LINKS)
    notice = "The link was revoked." if request.args.get("notice") == "revoked" else None
    return await page("portal_links.html", signed_in=True, links=links, notice=notice)


@routes.post("/portal-links/<uuid:link_id>/revoke")
async def revoke(link_id: uuid.UUID) -> Response:
    tenant_id = await signed_in_tenant()
    if await _store().revoke_portal_link(tenant_id, link_id) is None:
        raise ConsoleError(404, "There is no such portal link.")
    return cast(Response, redirect(f"{PREFIX}/portal-links?notice=revoked", 303))
