"""The OpenAPI paths of the event-type catalog (``api.catalog``) and of the tenant's settings,
part of the document ``openapi.build_openapi`` builds."""

from __future__ import annotations

from typing import Any

from notifier.ingest.models import EVENT_TYPE_RE, EventTypeIn, TenantPatch
from notifier.ingest.openapi_parts import answer, error_refs, json_content, op, ref
from notifier.ingest.views import EventTypeList, EventTypeView, TenantView

EXAMPLE_EVENT_TYPE = {
    "description": "An order was placed.",
    "schema": {
        "type": "object", "required": ["order_id"],
        "properties": {"order_id": {"type": "integer"}, "total": {"type": "number"}},
    },
}  # fmt: skip
NAME = {
    "name": "name", "in": "path", "required": True, "description": "The event type.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": EVENT_TYPE_RE},
}  # fmt: skip


def catalog_paths() -> dict[str, Any]:
    by_name = {"parameters": {"name": "$response.body#/name"}}
    links = {
        "GetEventType": {"operationId": "getEventType", **by_name},
        "DeleteEventType": {"operationId": "deleteEventType", **by_name},
    }
    return {
    "/v1/event-types": {
        "get": op(
            "listEventTypes", "catalog", "List the registered event types, by name",
            {"200": answer("Every registered type (at most 200: no pages).", EventTypeList),
             **error_refs(400, 401, 429, 503)},
        ),
    },
    "/v1/event-types/{name}": {
        "parameters": [NAME],
        "put": op(
            "putEventType", "catalog", "Register an event type, or replace it",
            {"200": answer("Replaced.", EventTypeView, links=links),
             "201": answer("Registered.", EventTypeView, links=links),
             **error_refs(400, 401, 413, 415, 422, 429, 503)},
            description="Events of this type are then checked against `schema` (JSON Schema "
            "draft 2020-12; `format` is not checked) by `POST /v1/events`, the batch route and "
            "AMQP ingest: a payload that does not match is refused with 422 "
            "`schema_violation`, naming the failing path. A schema that is not valid draft "
            "2020-12, over 64 KiB, with a `$ref` outside itself, recursive, or over 5,000 "
            "nodes with every `$ref` inlined is refused with 422 `invalid_schema` naming the "
            "path in the schema; a tenant has at most 200 types (`too_many_event_types`) and "
            "1 MiB of schemas in all (`catalog_too_large`).",
            body=ref(EventTypeIn), example=EXAMPLE_EVENT_TYPE,
        ),
        "get": op(
            "getEventType", "catalog", "Read an event type with its schema",
            {"200": answer("The event type.", EventTypeView),
             **error_refs(400, 401, 404, 429, 503)},
        ),
        "delete": op(
            "deleteEventType", "catalog", "Delete an event type",
            {"204": {"description": "Deleted: its events are no longer checked (refused in "
                     "strict mode)."},
             **error_refs(400, 401, 404, 429, 503)},
        ),
    },
    "/v1/catalog/openapi.json": {
        "get": op(
            "catalogOpenapi", "catalog", "The catalog as an OpenAPI 3.1 document for receivers",
            {"200": {"description": "An OpenAPI 3.1 document with a `webhooks` entry per event "
                     "type: the body a webhook channel sends, its `data` the type's schema.",
                     "content": json_content({"type": "object"})},
             **error_refs(400, 401, 429, 503)},
        ),
    },
    "/v1/tenant": {
        "get": op(
            "getTenant", "catalog", "The API key's tenant and its settings",
            {"200": answer("The tenant.", TenantView), **error_refs(400, 401, 429, 503)},
        ),
        "patch": op(
            "patchTenant", "catalog", "Change the tenant's settings",
            {"200": answer("The tenant.", TenantView),
             **error_refs(400, 401, 413, 415, 422, 429, 503)},
            description="`strict_event_types: true`: an event whose type is not registered is "
            "refused (422 `unregistered_event_type`); false (the default): it is stored "
            "unchecked.",
            body=ref(TenantPatch), example={"strict_event_types": True},
        ),
    },
    }  # fmt: skip
