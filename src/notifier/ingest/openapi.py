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
from notifier.ingest import jsonguard
from notifier.ingest.models import BatchIn, ChannelIn, ChannelPatch, EventIn, NoFields, ReplayIn
from notifier.ingest.views import (
    RESPONSE_MODELS,
    ChannelPage,
    ChannelView,
    DeliveryDetail,
    DeliveryPage,
    ErrorBody,
    EventBatch,
    EventDetail,
    EventView,
    Health,
    Readiness,
    ReplayResult,
)
from notifier.store.rows import DELIVERY_STATUSES

OPENAPI_VERSION = "3.1.0"
JSON = "application/json"
METRICS_MEDIA_TYPE = "text/plain; version=0.0.4"
REQUEST_MODELS: tuple[type[msgspec.Struct], ...] = (
    ChannelIn, ChannelPatch, EventIn, BatchIn, ReplayIn, NoFields,
)  # fmt: skip
EXAMPLE_EVENT = {"type": "order.created", "payload": {"order_id": 42}}

_REF = "#/components/schemas/{name}"
_ERRORS = {
    400: ("BadRequest", "The body is not valid JSON (`invalid_json`), or the request carries "
          "more than one `Authorization` header (`invalid_authorization`)."),
    401: ("Unauthorized", "Missing or unknown API key (`unauthorized`)."),
    404: ("NotFound", "No such id for this API key (`not_found`); other tenants' ids too."),
    405: ("MethodNotAllowed", "Wrong method for the path (`method_not_allowed`); `Allow` lists "
          "the right ones."),
    409: ("Conflict", "`idempotency_conflict`: the key was used with another body; "
          "`not_replayable`: the delivery cannot be replayed now; `conflict`: the channel's "
          "config kept changing while a PATCH of it was made (send it again)."),
    413: ("PayloadTooLarge", "The body is over `ingest.max_body_bytes` "
          "(`request_entity_too_large`); nothing was read further or written."),
    415: ("UnsupportedMediaType", "`Content-Type` is not `application/json` "
          "(`unsupported_media_type`)."),
    422: ("Unprocessable", "Valid JSON that breaks a rule (`validation_error`, "
          "`invalid_parameter`, `invalid_cursor`); the message names the field."),
    429: ("RateLimited", "Over the API key's event rate (`rate_limited`); nothing was written. "
          "`Retry-After` says when to try again."),
    503: ("Unavailable", "Postgres is unreachable or did not answer in time (`unavailable`). "
          "`Retry-After` says when to try again; send a write again with the same idempotency "
          "key (a stall after the commit may have stored it, and the key gives the first "
          "answer)."),
}  # fmt: skip


def _ref(model: type[msgspec.Struct] | str) -> dict[str, str]:
    name = model if isinstance(model, str) else model.__name__
    return {"$ref": _REF.format(name=name)}


def _json_content(schema: dict[str, Any], example: Any = None) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": schema}
    if example is not None:
        media["example"] = example
    return {JSON: media}


def _answer(description: str, model: type[msgspec.Struct] | None = None, **extra: Any) -> Any:
    out: dict[str, Any] = {"description": description}
    if model is not None:
        out["content"] = _json_content(_ref(model))
    out.update(extra)
    return out


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"$ref": f"#/components/responses/{_ERRORS[s][0]}"} for s in statuses}


def _uuid_path(name: str, what: str) -> dict[str, Any]:
    return {
        "name": name, "in": "path", "required": True, "description": f"The {what}'s id.",
        "schema": {"type": "string", "format": "uuid"},
    }  # fmt: skip


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}  # fmt: skip


def _channel_variants(
    schemas: dict[str, Any], channel_types: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The create and patch body schemas: ``ChannelIn`` once per enabled channel type, its
    ``type`` fixed and its ``config`` that type's config struct; a patch's ``config`` is any
    of those (the type is the stored channel's)."""
    if not channel_types:
        return _ref(ChannelIn), _ref(ChannelPatch)
    configs: list[dict[str, Any]] = []
    variants: dict[str, str] = {}
    for channel_type in channel_types:
        spec = SPECS.get(channel_type)
        config = _ref(spec.config) if spec is not None else {"type": "object"}
        configs.append(config)
        variant = copy.deepcopy(schemas[ChannelIn.__name__])
        name = f"{channel_type.capitalize()}ChannelIn"
        variant["title"] = name
        variant["properties"]["type"] = {"type": "string", "const": channel_type}
        variant["properties"]["config"] = config
        schemas[name] = variant
        variants[channel_type] = _REF.format(name=name)
    patch = copy.deepcopy(schemas[ChannelPatch.__name__])
    patch["title"] = "ChannelPatchIn"
    patch["properties"]["config"] = configs[0] if len(configs) == 1 else {"anyOf": configs}
    schemas["ChannelPatchIn"] = patch
    create: dict[str, Any] = {
        "oneOf": [{"$ref": ref} for ref in variants.values()],
        "discriminator": {"propertyName": "type", "mapping": variants},
    }
    return create, _ref("ChannelPatchIn")


def _op(
    operation_id: str,
    tag: str,
    summary: str,
    responses: dict[str, Any],
    *,
    key: bool = True,
    description: str | None = None,
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    example: Any = None,
    body_required: bool = True,
) -> dict[str, Any]:
    """One operation; ``key`` says whether it needs the bearer API key."""
    op: dict[str, Any] = {
        "operationId": operation_id, "tags": [tag], "summary": summary,
        "security": [{"bearer": []}] if key else [],
    }  # fmt: skip
    if description is not None:
        op["description"] = description
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": _json_content(body, example)}
    op["responses"] = responses
    return op


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
    _, schemas = msgspec.json.schema_components(
        [*REQUEST_MODELS, *RESPONSE_MODELS, *configs], ref_template=_REF
    )
    create_body, patch_body = _channel_variants(schemas, types)
    schemas[BatchIn.__name__]["properties"]["events"]["maxItems"] = max_batch_events
    limit = {"type": "integer", "minimum": 1, "maximum": max_page, "default": default_page}
    page = [
        _query("limit", limit, "Items per page."),
        _query("cursor", {"type": "string"}, "`next_cursor` of the previous page."),
    ]
    uuid = {"type": "string", "format": "uuid"}
    idempotency_key = {
        "name": "Idempotency-Key", "in": "header", "required": False,
        "description": "`idempotency_key`, as a header (if both are given, they must agree).",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    }  # fmt: skip
    by_id = {"parameters": {"channel_id": "$response.body#/id"}}
    channel_links = {
        "GetChannel": {"operationId": "getChannel", **by_id},
        "PatchChannel": {"operationId": "patchChannel", **by_id},
        "DeleteChannel": {"operationId": "deleteChannel", **by_id},
    }
    event_links = {
        "GetEvent": {"operationId": "getEvent", "parameters": {"event_id": "$response.body#/id"}}
    }
    replayed = _answer(
        "The same idempotency key and body again: the first answer, with the deliveries' "
        "current statuses; nothing was written.", EventView,
    )  # fmt: skip
    paths: dict[str, Any] = {
        "/v1/channels": {
            "post": _op(
                "createChannel", "channels", "Create a channel",
                {"201": _answer("Created; `config` holds its secrets in this answer only.",
                                ChannelView, links=channel_links),
                 **_errors(400, 401, 413, 415, 422, 503)},
                description="A webhook channel without `config.secret` gets a generated "
                "`whsec_…` secret.", body=create_body, example=_example_channel(types),
            ),
            "get": _op(
                "listChannels", "channels", "List channels, oldest first",
                {"200": _answer("A page of channels.", ChannelPage), **_errors(400, 401, 422, 503)},
                parameters=[
                    _query("type", {"type": "string"}, "Only channels of this type."),
                    _query("recipient", {"type": "string"}, "Only channels of this recipient."),
                    *page,
                ],
            ),
        },
        "/v1/channels/{channel_id}": {
            "parameters": [_uuid_path("channel_id", "channel")],
            "get": _op(
                "getChannel", "channels", "Read a channel (never its secrets)",
                {"200": _answer("The channel.", ChannelView), **_errors(400, 401, 404, 503)},
            ),
            "patch": _op(
                "patchChannel", "channels", "Change any subset of a channel's fields",
                {"200": _answer("The changed channel.", ChannelView),
                 **_errors(400, 401, 404, 409, 413, 415, 422, 503)},
                description="Only the fields named change: a concurrent change of the others "
                "(another PATCH, notifier disabling the channel) is kept. A `config` without "
                "`secret` keeps the stored one; a new `secret` starts a rotation. `enabled: true` "
                "re-enables the channel and resets its health.",
                body=patch_body, example={"name": "billing alerts"},
            ),
            "delete": _op(
                "deleteChannel", "channels", "Delete a channel (its deliveries are kept)",
                {"204": {"description": "Deleted."}, **_errors(400, 401, 404, 503)},
            ),
        },
        "/v1/events": {
            "post": _op(
                "postEvent", "events", "Ingest one event",
                {"200": replayed,
                 "202": _answer("Stored, with its deliveries.", EventView, links=event_links),
                 **_errors(400, 401, 409, 413, 415, 422, 429, 503)},
                description="Fans out to the tenant's enabled channels whose recipient and "
                "event types match (or exactly to `channel_ids`), in one transaction.",
                parameters=[idempotency_key], body=_ref(EventIn), example=EXAMPLE_EVENT,
            ),
        },
        "/v1/events/batch": {
            "post": _op(
                "postEventBatch", "events", "Ingest several events in one transaction",
                {"200": _answer("Every event repeated an earlier one.", EventBatch),
                 "202": _answer("Stored.", EventBatch),
                 **_errors(400, 401, 409, 413, 415, 422, 429, 503)},
                description="One conflicting idempotency key fails the whole batch (409).",
                body=_ref(BatchIn), example={"events": [EXAMPLE_EVENT]},
            ),
        },
        "/v1/events/{event_id}": {
            "parameters": [_uuid_path("event_id", "event")],
            "get": _op(
                "getEvent", "events", "Read an event with its payload and deliveries",
                {"200": _answer("The event.", EventDetail), **_errors(400, 401, 404, 503)},
            ),
        },
        "/v1/deliveries": {
            "get": _op(
                "listDeliveries", "deliveries", "List deliveries, newest first",
                {"200": _answer("A page of deliveries.", DeliveryPage),
                 **_errors(400, 401, 422, 503)},
                parameters=[
                    _query("status", {"type": "string", "enum": list(DELIVERY_STATUSES)},
                           "Only deliveries in this status."),
                    _query("channel_id", uuid, "Only deliveries to this channel."),
                    _query("event_id", uuid, "Only deliveries of this event."),
                    *page,
                ],
            ),
        },
        "/v1/deliveries/{delivery_id}": {
            "parameters": [_uuid_path("delivery_id", "delivery")],
            "get": _op(
                "getDelivery", "deliveries", "Read a delivery with its attempts",
                {"200": _answer("The delivery.", DeliveryDetail), **_errors(400, 401, 404, 503)},
            ),
        },
        "/v1/deliveries/{delivery_id}/retry": {
            "parameters": [_uuid_path("delivery_id", "delivery")],
            "post": _op(
                "retryDelivery", "deliveries", "Replay a DEAD or DELIVERED delivery",
                {"202": _answer("Enqueued again with a fresh attempt budget.", DeliveryDetail),
                 **_errors(400, 401, 404, 409, 413, 422, 503)},
                description="No body, or `{}`. 409 `not_replayable` while the delivery is "
                "PENDING or RETRYING, or when its channel is disabled or deleted.",
                body=_ref(NoFields), body_required=False,
            ),
        },
        "/v1/deliveries/retry": {
            "post": _op(
                "retryDeliveries", "deliveries", "Replay the finished deliveries matching a filter",
                {"202": _answer("Enqueued again, oldest first.", ReplayResult),
                 **_errors(400, 401, 413, 415, 422, 503)},
                description="At most `limit` deliveries a call, walked oldest first. While "
                "`more` is true, send the same request again with `cursor` set to the answer's "
                "`next_cursor`: each call goes on after the deliveries the previous one "
                "replayed, so the whole matching set is replayed once (a `DELIVERED` one is "
                "`DELIVERED` again soon, and would otherwise be replayed again). A malformed "
                "`cursor` is 422 `invalid_cursor`.",
                body=_ref(ReplayIn), example={"status": "DEAD"},
            ),
        },
        "/healthz": {
            "get": _op("healthz", "operations", "Liveness",
                       {"200": _answer("The process is up.", Health)}, key=False),
        },
        "/readyz": {
            "get": _op(
                "readyz", "operations", "Readiness: Postgres and RabbitMQ answer",
                {"200": _answer("Ready.", Readiness),
                 "503": _answer("Not ready: `checks` says what failed.", Readiness)},
                key=False,
            ),
        },
        "/metrics": {
            "get": _op(
                "metrics", "operations", "Prometheus metrics (text exposition format)",
                {"200": {"description": "The metrics.",
                         "content": {METRICS_MEDIA_TYPE: {"schema": {"type": "string"}}}},
                 **_errors(503)},
                key=False,
            ),
        },
        "/openapi.json": {
            "get": _op(
                "openapi", "operations", "This document",
                {"200": {"description": "The OpenAPI document.",
                         "content": _json_content({"type": "object"})}},
                key=False,
            ),
        },
    }  # fmt: skip
    responses = {}
    for status, (name, description) in _ERRORS.items():
        answer = _answer(description, ErrorBody)
        if status in (429, 503):
            answer["headers"] = {"Retry-After": {"$ref": "#/components/headers/RetryAfter"}}
        elif status == 405:
            answer["headers"] = {"Allow": {"description": "The path's methods.",
                                           "schema": {"type": "string"}}}  # fmt: skip
        responses[name] = answer
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
            "responses": responses,
            "headers": {"RetryAfter": {"description": "Seconds to wait before trying again.",
                                       "schema": {"type": "integer", "minimum": 0}}},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "A tenant's API key."}},
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
