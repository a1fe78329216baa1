"""``/v1/event-types``, ``/v1/catalog/openapi.json`` and ``/v1/tenant``: a tenant's event-type
catalog (``notifier.catalog``) — register, read, list and delete types with their JSON Schemas,
export them for receivers as an OpenAPI document — and its ``strict_event_types`` switch.

A change is NOTIFYed to every ingest process (the trigger on ``event_types``, on
``notifier_catalogs``; the one on ``tenants`` for the switch); this process forgets the tenant's
catalog at once as well, without waiting for the notification."""

from __future__ import annotations

import msgspec
from quart import Blueprint, Response

from notifier.catalog import MAX_EVENT_TYPES, SchemaRefused, compile_schema
from notifier.ingest.api.auth import current_tenant
from notifier.ingest.api.context import api_context
from notifier.ingest.api.http import ApiError, json_response, read_body
from notifier.ingest.catalog_openapi import catalog_document
from notifier.ingest.models import EVENT_TYPE_RE, EventType, EventTypeIn, TenantPatch
from notifier.ingest.views import EventTypeList, EventTypeView, TenantView
from notifier.store.errors import CatalogTooLarge, TooManyEventTypes
from notifier.store.rows import EventType as StoredEventType

routes = Blueprint("catalog", __name__)


def event_type_view(t: StoredEventType) -> EventTypeView:
    return EventTypeView(
        name=t.name, description=t.description, schema=t.schema, created_at=t.created_at,
        updated_at=t.updated_at,
    )  # fmt: skip


def checked_name(name: str) -> str:
    """``name`` if it is an event type's name (as ``POST /v1/events`` takes it), else 422."""
    try:
        return msgspec.convert(name, EventType)
    except msgspec.ValidationError as exc:
        raise ApiError(
            422, "validation_error",
            f"name: an event type is 1 to 200 characters matching {EVENT_TYPE_RE}",
        ) from exc  # fmt: skip


@routes.put("/v1/event-types/<name>")
async def put_event_type(name: str) -> Response:
    """Create or replace the type (201 created, 200 replaced); 422 naming the path in the
    schema that is wrong (``invalid_schema``), or the tenant's limit reached
    (``too_many_event_types``, ``catalog_too_large``)."""
    tenant_id = await current_tenant()
    name = checked_name(name)
    data = await read_body(EventTypeIn)
    try:
        compile_schema(data.schema)
    except SchemaRefused as exc:
        raise ApiError(422, "invalid_schema", str(exc)) from exc
    ctx = api_context()
    try:
        stored, created = await ctx.store.put_event_type(
            tenant_id, name, description=data.description, schema=data.schema,
            max_types=MAX_EVENT_TYPES,
        )  # fmt: skip
    except TooManyEventTypes as exc:
        raise ApiError(422, "too_many_event_types", str(exc)) from exc
    except CatalogTooLarge as exc:
        raise ApiError(422, "catalog_too_large", str(exc)) from exc
    ctx.catalogs.forget(tenant_id)
    return json_response(event_type_view(stored), 201 if created else 200)


@routes.get("/v1/event-types/<name>")
async def get_event_type(name: str) -> Response:
    found = await api_context().store.get_event_type(await current_tenant(), name)
    if found is None:
        raise ApiError(404, "not_found", "event type not found")
    return json_response(event_type_view(found))


@routes.delete("/v1/event-types/<name>")
async def delete_event_type(name: str) -> Response:
    """Events of the type are no longer checked (or, in strict mode, refused)."""
    tenant_id = await current_tenant()
    ctx = api_context()
    if not await ctx.store.delete_event_type(tenant_id, name):
        raise ApiError(404, "not_found", "event type not found")
    ctx.catalogs.forget(tenant_id)
    return Response(b"", status=204)


@routes.get("/v1/event-types")
async def list_event_types() -> Response:
    """Every registered type, by name (at most ``MAX_EVENT_TYPES``: no pages)."""
    found = await api_context().store.list_event_types(await current_tenant())
    return json_response(EventTypeList(items=[event_type_view(t) for t in found]))


@routes.get("/v1/catalog/openapi.json")
async def catalog_openapi() -> Response:
    tenant_id = await current_tenant()
    found = await api_context().store.list_event_types(tenant_id)
    return json_response(catalog_document(str(tenant_id), found))


@routes.get("/v1/tenant")
async def get_tenant() -> Response:
    tenant_id = await current_tenant()
    strict = await api_context().store.strict_event_types(tenant_id)
    return json_response(TenantView(id=tenant_id, strict_event_types=strict))


@routes.patch("/v1/tenant")
async def patch_tenant() -> Response:
    """Change the settings the body names (``strict_event_types``)."""
    tenant_id = await current_tenant()
    patch = await read_body(TenantPatch)
    ctx = api_context()
    if patch.strict_event_types is msgspec.UNSET:
        strict = await ctx.store.strict_event_types(tenant_id)
    else:
        strict = await ctx.store.set_strict_event_types(tenant_id, patch.strict_event_types)
        ctx.catalogs.forget(tenant_id)
    return json_response(TenantView(id=tenant_id, strict_event_types=strict))
