"""The building blocks of the OpenAPI document (``openapi.py``): schema references, answers, the
shared error responses (one per status), parameters and one operation."""

from __future__ import annotations

from typing import Any

import msgspec

from notifier.ingest.views import ErrorBody

JSON = "application/json"

SCHEMA_REF = "#/components/schemas/{name}"
ERRORS = {
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
          "`invalid_parameter`, `invalid_cursor`; the event-type catalog's `schema_violation`, "
          "`unregistered_event_type`, `invalid_schema`, `too_many_event_types`, "
          "`catalog_too_large`); the message "
          "names the field, or the JSON path that fails (`payload at $.order.total: ...`)."),
    429: ("RateLimited", "Over the API key's event rate (`rate_limited`), or too many requests "
          "with a missing or unknown API key from the client's address "
          "(`too_many_unauthorized`: the key was not looked up); nothing was written. "
          "`Retry-After` says when to try again."),
    503: ("Unavailable", "Postgres is unreachable or did not answer in time (`unavailable`). "
          "`Retry-After` says when to try again; send a write again with the same idempotency "
          "key (a stall after the commit may have stored it, and the key gives the first "
          "answer)."),
}  # fmt: skip


def ref(model: type[msgspec.Struct] | str) -> dict[str, str]:
    name = model if isinstance(model, str) else model.__name__
    return {"$ref": SCHEMA_REF.format(name=name)}


def json_content(schema: dict[str, Any], example: Any = None) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": schema}
    if example is not None:
        media["example"] = example
    return {JSON: media}


def answer(description: str, model: type[msgspec.Struct] | None = None, **extra: Any) -> Any:
    out: dict[str, Any] = {"description": description}
    if model is not None:
        out["content"] = json_content(ref(model))
    out.update(extra)
    return out


def error_refs(*statuses: int) -> dict[str, Any]:
    return {str(s): {"$ref": f"#/components/responses/{ERRORS[s][0]}"} for s in statuses}


def uuid_path(name: str, what: str) -> dict[str, Any]:
    return {
        "name": name, "in": "path", "required": True, "description": f"The {what}'s id.",
        "schema": {"type": "string", "format": "uuid"},
    }  # fmt: skip


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}  # fmt: skip


def op(
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
        op["requestBody"] = {"required": body_required, "content": json_content(body, example)}
    op["responses"] = responses
    return op


def error_responses() -> dict[str, Any]:
    """One shared response per error status, referenced by the operations (``error_refs``)."""
    responses = {}
    for status, (name, description) in ERRORS.items():
        shared = answer(description, ErrorBody)
        if status in (429, 503):
            shared["headers"] = {"Retry-After": {"$ref": "#/components/headers/RetryAfter"}}
        elif status == 405:
            shared["headers"] = {"Allow": {"description": "The path's methods.",
                                           "schema": {"type": "string"}}}  # fmt: skip
        responses[name] = shared
    return responses


def metrics_refusals() -> dict[str, Any]:
    """The answers of ``/metrics`` beside the metrics: its protection (README, *Protecting
    /metrics*)."""
    return {
        "400": answer("Two `Authorization` headers (`invalid_authorization`).", ErrorBody),
        "401": answer(
            "`ingest.metrics_token_env` is set and the request does not carry "
            "`Authorization: Bearer <that token>` (`unauthorized`).",
            ErrorBody,
            headers={
                "WWW-Authenticate": {
                    "description": '`Bearer realm="metrics"`',
                    "schema": {"type": "string"},
                }
            },
        ),
        "404": answer(
            "`ingest.metrics_bind` is set: `/metrics` is served on that address, not on the "
            "ingest port (`not_found`).",
            ErrorBody,
        ),
    }
