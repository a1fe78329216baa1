"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /openapi.json``.

Its schemas are generated with ``msgspec.json.schema_components`` from the structs that
validate requests (``models.py``, and each channel type's config struct) and from those the
handlers answer with (``views.py``), so the document cannot drift from the code. What is
written here by hand is the routing: paths, parameters, status codes and security.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import msgspec

from notifier import __version__
from notifier.adapters.specs import SPECS
from notifier.adapters.webhook.channels import WebhookConfigUpdate
from notifier.ingest import jsonguard
from notifier.ingest.api.docs import BUNDLE_PATH
from notifier.ingest.models import (
    CUSTOMER_RE,
    FILTER,
    FILTER_SCHEMA,
    IDEMPOTENCY_HEADER_PATTERN,
    JSON_VALUE,
    JSON_VALUE_SCHEMA,
    NO_NUL,
    BatchIn,
    ChannelIn,
    ChannelPatch,
    EventIn,
    EventTypeIn,
    NoFields,
    PortalLinkIn,
    ReplayIn,
    TenantPatch,
)
from notifier.ingest.openapi_catalog import catalog_paths
from notifier.ingest.openapi_parts import (
    SCHEMA_REF,
    answer,
    error_refs,
    error_responses,
    json_content,
    metrics_refusals,
    op,
    query,
    ref,
    uuid_path,
)
from notifier.ingest.views import (
    RESPONSE_MODELS,
    ChannelPage,
    ChannelView,
    DeliveryDetail,
    DeliveryPage,
    EventBatch,
    EventDetail,
    EventView,
    Health,
    PortalLinkCreated,
    PortalLinkPage,
    Readiness,
    ReplayResult,
)
from notifier.store.rows import DELIVERY_STATUSES

OPENAPI_VERSION = "3.1.0"
METRICS_MEDIA_TYPE = "text/plain; version=0.0.4"
REQUEST_MODELS: tuple[type[msgspec.Struct], ...] = (
    ChannelIn, ChannelPatch, EventIn, BatchIn, ReplayIn, NoFields, EventTypeIn, TenantPatch,
    PortalLinkIn,
)  # fmt: skip
EXAMPLE_EVENT = {"type": "order.created", "payload": {"order_id": 42}}
# A PATCH's `config`, by channel type, where it differs from a create's (the type's config).
PATCH_CONFIGS: dict[str, type[msgspec.Struct]] = {"webhook": WebhookConfigUpdate}


def _channel_variants(
    schemas: dict[str, Any], channel_types: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The create and patch body schemas: ``ChannelIn`` once per enabled channel type, its
    ``type`` fixed and its ``config`` that type's config struct; a patch's ``config`` is any
    of those (the type is the stored channel's)."""
    if not channel_types:
        return ref(ChannelIn), ref(ChannelPatch)
    configs: list[dict[str, Any]] = []
    variants: dict[str, str] = {}
    for channel_type in channel_types:
        spec = SPECS.get(channel_type)
        config = ref(spec.config) if spec is not None else {"type": "object"}
        patch_config = PATCH_CONFIGS.get(channel_type)
        configs.append(ref(patch_config) if patch_config is not None else config)
        variant = copy.deepcopy(schemas[ChannelIn.__name__])
        name = f"{channel_type.capitalize()}ChannelIn"
        variant["title"] = name
        variant["properties"]["type"] = {"type": "string", "const": channel_type}
        variant["properties"]["config"] = config
        schemas[name] = variant
        variants[channel_type] = SCHEMA_REF.format(name=name)
    patch = copy.deepcopy(schemas[ChannelPatch.__name__])
    patch["title"] = "ChannelPatchIn"
    patch["properties"]["config"] = configs[0] if len(configs) == 1 else {"anyOf": configs}
    schemas["ChannelPatchIn"] = patch
    create: dict[str, Any] = {
        "oneOf": [{"$ref": ref} for ref in variants.values()],
        "discriminator": {"propertyName": "type", "mapping": variants},
    }
    return create, ref("ChannelPatchIn")


def build_openapi(
    *,
    channel_types: Iterable[str],
    max_body_bytes: int,
    max_batch_events: int,
    max_page: int,
    default_page: int,
    version: str = __version__,
) -> dict[str, Any]:
    """The OpenAPI document for an app with these channel types enabled and these limits."""
    types = sorted(channel_types)
    configs = [SPECS[t].config for t in types if t in SPECS]
    configs += [PATCH_CONFIGS[t] for t in types if t in PATCH_CONFIGS]
    _, schemas = msgspec.json.schema_components(
        [*REQUEST_MODELS, *RESPONSE_MODELS, *configs], ref_template=SCHEMA_REF
    )
    schemas[BatchIn.__name__]["properties"]["events"]["maxItems"] = max_batch_events
    schemas[JSON_VALUE] = JSON_VALUE_SCHEMA  # what EventIn's payload holds
    schemas[FILTER] = FILTER_SCHEMA  # a channel's payload filter
    # An integer may be written 229.0 (JSON Schema's integer is a value, not a spelling).
    limit = {"type": "integer", "minimum": 1, "maximum": max_page, "default": default_page}
    page = [
        query("limit", limit, "Items per page."),
        query("cursor", {"type": "string"}, "`next_cursor` of the previous page."),
    ]
    paths = {
        **_channel_paths(schemas, types, page), **_event_paths(), **catalog_paths(),
        **_delivery_paths(page), **_operation_paths(), **_portal_paths(page),
    }  # fmt: skip
    description = _DESCRIPTION.format(
        max_body_bytes=max_body_bytes, depth=jsonguard.MAX_DEPTH,
        digits=jsonguard.MAX_INTEGER_DIGITS,
    )  # fmt: skip
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "notifier", "version": version, "description": description},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": error_responses(),
            "headers": {"RetryAfter": {"description": "Seconds to wait before trying again.",
                                       "schema": {"type": "integer", "minimum": 0}}},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "A tenant's API key."}},
        },
    }  # fmt: skip


def _channel_paths(
    schemas: dict[str, Any], types: list[str], page: list[dict[str, Any]]
) -> dict[str, Any]:
    create_body, patch_body = _channel_variants(schemas, types)
    by_id = {"parameters": {"channel_id": "$response.body#/id"}}
    channel_links = {
        "GetChannel": {"operationId": "getChannel", **by_id},
        "PatchChannel": {"operationId": "patchChannel", **by_id},
        "DeleteChannel": {"operationId": "deleteChannel", **by_id},
    }
    return {
    "/v1/channels": {
        "post": op(
            "createChannel", "channels", "Create a channel",
            {"201": answer("Created; `config` holds its secrets in this answer only.",
                            ChannelView, links=channel_links),
             **error_refs(400, 401, 413, 415, 422, 429, 503)},
            description="A webhook channel without `config.secret` gets a generated "
            "`whsec_…` secret.", body=create_body, example=_example_channel(types),
        ),
        "get": op(
            "listChannels", "channels", "List channels, oldest first",
            {"200": answer("A page of channels.", ChannelPage),
             **error_refs(400, 401, 422, 429, 503)},
            parameters=[
                query("type", {"type": "string", "pattern": NO_NUL}, "Only channels of this type."),
                query("recipient", {"type": "string", "pattern": NO_NUL},
              "Only channels of this recipient."),
                query("customer", {"type": "string", "pattern": CUSTOMER_RE, "maxLength": 200},
                      "Only channels labelled with this customer."),
                *page,
            ],
        ),
    },
    "/v1/channels/{channel_id}": {
        "parameters": [uuid_path("channel_id", "channel")],
        "get": op(
            "getChannel", "channels", "Read a channel (never its secrets)",
            {"200": answer("The channel.", ChannelView), **error_refs(400, 401, 404, 429, 503)},
        ),
        "patch": op(
            "patchChannel", "channels", "Change any subset of a channel's fields",
            {"200": answer("The changed channel.", ChannelView),
             **error_refs(400, 401, 404, 409, 413, 415, 422, 429, 503)},
            description="Only the fields named change: a concurrent change of the others "
            "(another PATCH, notifier disabling the channel) is kept. A `config` without "
            "`secret` keeps the stored one; a new `secret` starts a rotation. `enabled: true` "
            "re-enables the channel and resets its health; `filter: null` removes its payload "
            "filter. A new `ordering` (`none`, `fifo`: one at a time in acceptance order) "
            "applies to the events accepted after it; deliveries accepted before keep theirs.",
            body=patch_body, example={"name": "billing alerts"},
        ),
        "delete": op(
            "deleteChannel", "channels", "Delete a channel (its deliveries are kept)",
            {"204": {"description": "Deleted."}, **error_refs(400, 401, 404, 429, 503)},
        ),
    },
    }  # fmt: skip


def _event_paths() -> dict[str, Any]:
    idempotency_key = {
        "name": "Idempotency-Key", "in": "header", "required": False,
        "description": "`idempotency_key`, as a header (if both are given, they must agree).",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255,
                   "pattern": IDEMPOTENCY_HEADER_PATTERN},
    }  # fmt: skip
    traceparent = {
        "name": "traceparent", "in": "header", "required": False,
        "description": "The W3C trace context of the caller "
        "(`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`): kept with the events and "
        "sent on to the receivers (README, Tracing). A value out of shape, or the header given "
        "twice, is ignored, never refused.",
        "schema": {"type": "string"},
    }  # fmt: skip
    deliveries = {
        "operationId": "listDeliveries", "parameters": {"query.event_id": "$response.body#/id"},
        "description": "The event's deliveries.",
    }  # fmt: skip
    by_id = {"parameters": {"event_id": "$response.body#/id"}}
    event_links = {
        "GetEvent": {"operationId": "getEvent", **by_id},
        "ListDeliveries": deliveries,
        "ExpungeEventPayload": {"operationId": "expungeEventPayload", **by_id},
    }
    batch_links = {"ListDeliveriesOfTheFirst": {
        **deliveries, "parameters": {"query.event_id": "$response.body#/events/0/id"},
        "description": "The deliveries of the batch's first event.",
    }}  # fmt: skip
    replayed = answer(
        "The same idempotency key and body again: the first answer, with the deliveries' "
        "current statuses; nothing was written.", EventView, links=event_links,
    )  # fmt: skip
    return {
    "/v1/events": {
        "post": op(
            "postEvent", "events", "Ingest one event",
            {"200": replayed,
             "202": answer("Stored, with its deliveries.", EventView, links=event_links),
             **error_refs(400, 401, 409, 413, 415, 422, 429, 503)},
            description="Fans out to the tenant's enabled channels whose recipient and "
            "event types match (or exactly to `channel_ids`), in one transaction. A payload "
            "of a registered event type must match its schema (422 `schema_violation`); in "
            "strict mode an unregistered type is refused (422 `unregistered_event_type`).",
            parameters=[idempotency_key, traceparent], body=ref(EventIn),
            example=EXAMPLE_EVENT,
        ),
    },
    "/v1/events/batch": {
        "post": op(
            "postEventBatch", "events", "Ingest several events in one transaction",
            {"200": answer("Every event repeated an earlier one.", EventBatch, links=batch_links),
             "202": answer("Stored.", EventBatch, links=batch_links),
             **error_refs(400, 401, 409, 413, 415, 422, 429, 503)},
            description="One conflicting idempotency key fails the whole batch (409); so does "
            "one event the event-type catalog refuses (422, naming `events[i]`).",
            parameters=[traceparent], body=ref(BatchIn),
            example={"events": [EXAMPLE_EVENT]},
        ),
    },
    "/v1/events/{event_id}": {
        "parameters": [uuid_path("event_id", "event")],
        "get": op(
            "getEvent", "events", "Read an event with its payload and deliveries",
            {"200": answer("The event.", EventDetail, links={"ListDeliveries": deliveries}),
             **error_refs(400, 401, 404, 429, 503)},
        ),
    },
    "/v1/events/{event_id}/payload": {
        "parameters": [uuid_path("event_id", "event")],
        "delete": op(
            "expungeEventPayload", "events", "Expunge an event's payload, keep its deliveries",
            {"200": answer("Expunged (or expunged before): the event, `payload` null, "
                           "`payload_expunged_at` set.", EventDetail),
             **error_refs(400, 401, 404, 409, 429, 503)},
            description="The payload becomes `null`, the attempts' response excerpts go; the "
            "event, its deliveries and their attempts stay. Again: the same answer. 409 "
            "`deliveries_in_flight` while a delivery is PENDING or RETRYING (its message "
            "carries the payload). A delivery of an expunged event is not replayed.",
        ),
    },
    }  # fmt: skip


def _delivery_paths(page: list[dict[str, Any]]) -> dict[str, Any]:
    uuid = {"type": "string", "format": "uuid"}
    return {
    "/v1/deliveries": {
        "get": op(
            "listDeliveries", "deliveries", "List deliveries, newest first",
            {"200": answer("A page of deliveries.", DeliveryPage),
             **error_refs(400, 401, 422, 429, 503)},
            parameters=[
                query("status", {"type": "string", "enum": list(DELIVERY_STATUSES)},
                       "Only deliveries in this status."),
                query("channel_id", uuid, "Only deliveries to this channel."),
                query("event_id", uuid, "Only deliveries of this event."),
                *page,
            ],
        ),
    },
    "/v1/deliveries/{delivery_id}": {
        "parameters": [uuid_path("delivery_id", "delivery")],
        "get": op(
            "getDelivery", "deliveries", "Read a delivery with its attempts",
            {"200": answer("The delivery.", DeliveryDetail), **error_refs(400, 401, 404, 429, 503)},
        ),
    },
    "/v1/deliveries/{delivery_id}/retry": {
        "parameters": [uuid_path("delivery_id", "delivery")],
        "post": op(
            "retryDelivery", "deliveries", "Replay a DEAD or DELIVERED delivery",
            {"202": answer("Enqueued again with a fresh attempt budget.", DeliveryDetail),
             **error_refs(400, 401, 404, 409, 413, 422, 429, 503)},
            description="No body, or `{}`. The replay is an entry of the delivery's history "
            "(outcome `replayed`), numbered after its last attempt; the next attempt is "
            "numbered after it, with a fresh budget of attempts counted from the replay. "
            "409 `not_replayable` while the delivery is PENDING or RETRYING, or when its "
            "channel is disabled or deleted.",
            body=ref(NoFields), body_required=False,
        ),
    },
    "/v1/deliveries/retry": {
        "post": op(
            "retryDeliveries", "deliveries", "Replay the finished deliveries matching a filter",
            {"202": answer("Enqueued again, oldest first.", ReplayResult),
             **error_refs(400, 401, 413, 415, 422, 429, 503)},
            description="At most `limit` deliveries a call, walked oldest first. While "
            "`more` is true, send the same request again with `cursor` set to the answer's "
            "`next_cursor`: each call goes on after the deliveries the previous one "
            "replayed, so the whole matching set is replayed once (a `DELIVERED` one is "
            "`DELIVERED` again soon, and would otherwise be replayed again). A malformed "
            "`cursor` is 422 `invalid_cursor`.",
            body=ref(ReplayIn), example={"status": "DEAD"},
        ),
    },
    }  # fmt: skip


def _portal_paths(page: list[dict[str, Any]]) -> dict[str, Any]:
    return {
    "/v1/portal-links": {
        "post": op(
            "createPortalLink", "portal", "Make a link to the customer portal",
            {"201": answer("The link; its `url` is shown only here.", PortalLinkCreated),
             **error_refs(400, 401, 409, 413, 415, 422, 429, 503)},
            description="A short-lived URL opening the customer portal (README \"Customer "
            "portal\") for the channels labelled `customer`, or for `channel_ids` (exactly one "
            "of them; unknown ids are 422 `unknown_channels`). Anyone holding it may open it "
            "until it expires or is revoked. 409 `portal_not_configured` without "
            "`[console] public_url`.",
            body=ref(PortalLinkIn), example={"customer": "acme", "expires_in_seconds": 3600},
        ),
        "get": op(
            "listPortalLinks", "portal", "List portal links, newest first (never their URL)",
            {"200": answer("A page of links.", PortalLinkPage),
             **error_refs(400, 401, 422, 429, 503)},
            parameters=page,
        ),
    },
    "/v1/portal-links/{link_id}": {
        "parameters": [uuid_path("link_id", "portal link")],
        "delete": op(
            "revokePortalLink", "portal", "Revoke a portal link and end its sessions",
            {"204": {"description": "Revoked (a revoked link stays revoked)."},
             **error_refs(400, 401, 404, 429, 503)},
        ),
    },
    }  # fmt: skip


def _operation_paths() -> dict[str, Any]:
    return {
    "/healthz": {
        "get": op("healthz", "operations", "Liveness",
                   {"200": answer("The process is up.", Health)}, key=False),
    },
    "/readyz": {
        "get": op(
            "readyz", "operations", "Readiness: Postgres and RabbitMQ answer",
            {"200": answer("Ready.", Readiness),
             "503": answer("Not ready: `checks` says what failed.", Readiness)},
            key=False,
        ),
    },
    "/metrics": {
        "get": op(
            "metrics", "operations", "Prometheus metrics (text exposition format)",
            {"200": {"description": "The metrics.",
                     "content": {METRICS_MEDIA_TYPE: {"schema": {"type": "string"}}}},
             **metrics_refusals(), **error_refs(503)},
            key=False,
        ),
    },
    "/docs": {
        "get": op(
            "apiReference", "operations", "This document for people (Redoc, served from here)",
            {"200": {"description": "An HTML page.",
                     "content": {"text/html": {"schema": {"type": "string"}}}}},
            key=False,
        ),
    },
    BUNDLE_PATH: {
        "get": op(
            "apiReferenceScript", "operations", "The script of the `/docs` page",
            {"200": {"description": "Redoc's standalone bundle.",
                     "content": {"text/javascript": {"schema": {"type": "string"}}}}},
            key=False,
        ),
    },
    "/openapi.json": {
        "get": op(
            "openapi", "operations", "This document",
            {"200": {"description": "The OpenAPI document.",
                     "content": json_content({"type": "object"})}},
            key=False,
        ),
    },
    }  # fmt: skip


def _example_channel(types: list[str]) -> dict[str, Any] | None:
    for channel_type in types:
        if channel_type in SPECS:
            return {"type": channel_type, "config": SPECS[channel_type].example}
    return None


_DESCRIPTION = """\
A self-hosted notification fan-out service. Every `/v1` route needs `Authorization: Bearer \
<api key>`; a key sees only its own tenant. Errors are `{{"error": {{"code", "message"}}}}`; a \
wrong method for a path answers 405 with `Allow`.

Input limits: a body is at most {max_body_bytes} bytes (413, refused before it is parsed); \
arrays and objects nest at most {depth} levels deep; an integer must fit a signed 64-bit \
integer, any other number a finite 64-bit float, and no number has more than {digits} digits \
before its decimal point; no object repeats a key; no key or string holds `\\u0000` or a lone \
UTF-16 surrogate; `NaN` and `Infinity` are not JSON (400). Breaking one of these rules \
answers 422 and writes nothing."""
