"""``/v1/portal-links``: the tenant makes, lists and revokes the signed links that open the
customer portal (README "Customer portal") for one of its customers. A link's URL (holding its
token) is in the answer to its creation only; the store keeps the token's hash."""

from __future__ import annotations

import uuid

from quart import Blueprint, Response

from notifier.console.portal.links import link_url, new_token, token_hash
from notifier.ingest.api.auth import current_tenant
from notifier.ingest.api.context import api_context
from notifier.ingest.api.http import ApiError, json_response, read_body
from notifier.ingest.api.pagination import cursor_arg, limit_arg, split_page
from notifier.ingest.models import PortalLinkIn
from notifier.ingest.views import PortalLinkCreated, PortalLinkPage, PortalLinkView
from notifier.store.errors import UnknownChannels
from notifier.store.portal import PortalLink, PortalStore

routes = Blueprint("portal_links", __name__)


def portal_store() -> PortalStore:
    store = api_context().store
    if not isinstance(store, PortalStore):
        raise ApiError(503, "unavailable", "this store keeps no portal links")
    return store


def link_view(link: PortalLink) -> PortalLinkView:
    return PortalLinkView(
        id=link.id, customer=link.customer, channel_ids=link.channel_ids, state=link.state,
        created_at=link.created_at, expires_at=link.expires_at, revoked_at=link.revoked_at,
    )  # fmt: skip


@routes.post("/v1/portal-links")
async def create_portal_link() -> Response:
    tenant_id = await current_tenant()
    data = await read_body(PortalLinkIn)
    if (data.customer is None) == (data.channel_ids is None):
        raise ApiError(422, "validation_error", "give exactly one of customer and channel_ids")
    public_url = api_context().config.console.public_url
    if not public_url:
        raise ApiError(
            409, "portal_not_configured",
            "portal links need the console's public address: set [console] public_url",
        )  # fmt: skip
    token = new_token()
    ids = sorted(set(data.channel_ids)) if data.channel_ids is not None else None
    try:
        link = await portal_store().create_portal_link(
            tenant_id, token_hash(token), customer=data.customer, channel_ids=ids,
            expires_in_seconds=data.expires_in_seconds,
        )  # fmt: skip
    except UnknownChannels as exc:
        raise ApiError(422, "unknown_channels", str(exc)) from exc
    view = link_view(link)
    created = PortalLinkCreated(**{f: getattr(view, f) for f in view.__struct_fields__},
                                url=link_url(public_url, token))  # fmt: skip
    return json_response(created, 201)


@routes.get("/v1/portal-links")
async def list_portal_links() -> Response:
    tenant_id = await current_tenant()
    limit = limit_arg()
    rows = await portal_store().list_portal_links(tenant_id, before=cursor_arg(), limit=limit + 1)
    page, next_cursor = split_page(rows, limit, lambda link: (link.created_at, link.id))
    return json_response(
        PortalLinkPage(items=[link_view(x) for x in page], next_cursor=next_cursor)
    )


@routes.delete("/v1/portal-links/<uuid:link_id>")
async def revoke_portal_link(link_id: uuid.UUID) -> Response:
    """Revoked at once: the sessions it opened end, and it opens no other."""
    if await portal_store().revoke_portal_link(await current_tenant(), link_id) is None:
        raise ApiError(404, "not_found", "portal link not found")
    return Response(b"", status=204)
