"""The tenant's event-type catalog as receivers read it: an OpenAPI 3.1 document with one
``webhooks`` entry per event type, whose request body is what a webhook channel POSTs for an
event of that type (``adapters.webhook.signing.build_request``: ``type``, ``timestamp``,
``data``, the payload) with the type's schema as ``data``, and the Standard Webhooks headers."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

from notifier import __version__
from notifier.store.rows import EventType

OPENAPI_VERSION = "3.1.0"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_HEADERS = {
    "webhook-id": "The delivery's id: the same on every attempt (deduplicate on it).",
    "webhook-timestamp": "When this attempt was signed, in seconds since the epoch.",
    "webhook-signature": "`v1,<base64 HMAC-SHA256>` of `<webhook-id>.<webhook-timestamp>.<body>` "
    "with the channel's secret; several, space-separated, while a secret is rotated.",
}


def component_name(event_type: str) -> str:
    """The name of the type's schema among the document's components (``[A-Za-z0-9._-]``)."""
    return "EventType_" + _UNSAFE.sub("_", event_type)


def _moved(node: Any, prefix: str) -> Any:
    """``node`` with every JSON-pointer reference (``#``, ``#/$defs/...``) moved under
    ``prefix``; values that are data (``const``, ``enum``, ``default``, ``examples``) kept."""
    if isinstance(node, list):
        return [_moved(v, prefix) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if (
            key in ("$ref", "$dynamicRef")
            and isinstance(value, str)
            and (value == "#" or value.startswith("#/"))
        ):
            out[key] = prefix + value[1:]
        elif key in ("const", "enum", "default", "examples"):
            out[key] = copy.deepcopy(value)
        else:
            out[key] = _moved(value, prefix)
    return out


def _payload_schema(event_type: EventType, name: str) -> dict[str, Any]:
    """The type's schema as the component ``name``. Its references point inside it
    (``#/$defs/…``): they are moved to point inside the component, where it now is."""
    schema = {k: v for k, v in event_type.schema.items() if k not in ("$schema", "$id")}
    moved: dict[str, Any] = _moved(schema, f"#/components/schemas/{name}")
    return moved


def catalog_document(tenant: str, event_types: Sequence[EventType]) -> dict[str, Any]:
    """The OpenAPI document of ``event_types`` (``tenant``, its id, in the title)."""
    webhooks: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for t in event_types:
        name = component_name(t.name)
        schemas[name] = _payload_schema(t, name)
        body = {
            "type": "object",
            "required": ["type", "timestamp", "data"],
            "properties": {
                "type": {"const": t.name},
                "timestamp": {"type": "string", "format": "date-time",
                              "description": "When the event was ingested."},
                "data": {"$ref": f"#/components/schemas/{name}"},
            },
        }  # fmt: skip
        webhooks[t.name] = {
            "post": {
                "operationId": f"receive_{_UNSAFE.sub('_', t.name)}",
                "summary": t.description or f"An event of type {t.name}",
                "parameters": [
                    {
                        "name": header,
                        "in": "header",
                        "required": header != "webhook-signature",
                        "description": text,
                        "schema": {"type": "string"},
                    }
                    for header, text in _HEADERS.items()
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": body}},
                },
                "responses": {
                    "2XX": {"description": "Received: the delivery is done."},
                    "default": {
                        "description": "Not received: after 408, 425, 429 or 5xx the "
                        "delivery is tried again; 410 disables the channel; any other "
                        "answer ends the delivery (DEAD)."
                    },
                },
            }
        }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": f"notifier events of tenant {tenant}",
            "version": __version__,
            "description": "The webhooks a notifier webhook channel of this tenant sends, one "
            "per registered event type; `data` is the event's payload, checked against the "
            "type's schema when the event was ingested.",
        },
        "webhooks": webhooks,
        "components": {"schemas": schemas},
    }
