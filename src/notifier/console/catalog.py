"""Event types: the tenant's event-type catalog (``notifier.catalog``), read-only — each type
with its description and JSON Schema, and whether unregistered types are refused. Types are
registered with the API (``PUT /v1/event-types/{name}``)."""

from __future__ import annotations

import json

from quart import Response

from notifier.console.web import page, routes, signed_in_tenant
from notifier.ingest.api.context import api_context


@routes.get("/event-types")
async def event_types() -> Response:
    tenant_id = await signed_in_tenant()
    store = api_context().store
    found = await store.list_event_types(tenant_id)
    shown = [(t, json.dumps(t.schema, indent=2, ensure_ascii=False)) for t in found]
    strict = await store.strict_event_types(tenant_id)
    return await page("event_types.html", signed_in=True, event_types=shown, strict=strict)
