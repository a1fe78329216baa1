"""The OpenAPI document (``notifier.ingest.openapi``): every route of the app and nothing else,
schemas generated from the models, the error answers and the security of each operation."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest

from notifier.config import parse_config
from notifier.ingest.api.pagination import DEFAULT_PAGE, MAX_PAGE
from notifier.ingest.app import create_app
from notifier.ingest.models import EVENT_TYPE_RE, EventIn, ReplayIn
from notifier.ingest.openapi import build_openapi
from notifier.ingest.views import ChannelView, DeliveryDetail
from notifier.store.pg import Store
from notifier.testing import RecordingAdapter

PUBLIC = {"/healthz", "/readyz", "/metrics", "/openapi.json"}
WITH_BODY = {  # operation id: the error statuses a request body can add
    "createChannel": {400, 413, 415, 422},
    "patchChannel": {400, 413, 415, 422},
    "postEvent": {400, 413, 415, 422},
    "postEventBatch": {400, 413, 415, 422},
    "retryDeliveries": {400, 413, 415, 422},
    "retryDelivery": {413, 422},  # no body, or {}: anything else is a 422
}


def document(*channel_types: str, max_batch_events: int = 100) -> dict[str, Any]:
    return build_openapi(
        channel_types=channel_types, max_body_bytes=1_048_576, max_batch_events=max_batch_events,
        max_page=MAX_PAGE, default_page=DEFAULT_PAGE,
    )  # fmt: skip


def operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): op
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method != "parameters"
    }


def test_every_route_of_the_app_is_documented_and_nothing_else() -> None:
    """The app's url map, in OpenAPI's path syntax, is the document's list of operations (the
    console's HTML pages, ``/console``, are no part of the API)."""
    config = parse_config({"workers": {"webhook": {}}}, env={})
    store = cast(Store, SimpleNamespace(metrics_snapshot=None))  # not called while building
    app = create_app(store, config, {"webhook": RecordingAdapter("webhook")})
    routes = {
        (method, re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule))
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static" and not rule.endpoint.startswith("console.")
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    assert routes == set(operations(document("webhook")))


def test_security_and_error_answers_of_each_operation() -> None:
    doc = document("webhook")
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "A tenant's API key.",
    }  # fmt: skip
    for (method, path), op in operations(doc).items():
        statuses = {int(s) for s in op["responses"]}
        if path in PUBLIC:
            assert op["security"] == [], path
            assert 401 not in statuses, path
            continue
        assert op["security"] == [{"bearer": []}], path
        assert {401, 503} <= statuses, path
        assert (404 in statuses) == ("{" in path), path
        ingests = method == "POST" and path.startswith("/v1/events")
        assert (429 in statuses) == ingests, path
        body_errors = WITH_BODY.get(op["operationId"], set())
        assert body_errors <= statuses, path
        assert "requestBody" in op if body_errors else "requestBody" not in op, path
        for status in statuses - {200, 201, 202, 204}:
            ref = op["responses"][str(status)]["$ref"]
            answer = doc["components"]["responses"][ref.rsplit("/", 1)[1]]
            assert answer["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorBody"
            }
            assert ("Retry-After" in answer.get("headers", {})) == (status in (429, 503))


def test_schemas_are_the_models_own() -> None:
    doc = document("webhook")
    schemas = doc["components"]["schemas"]
    _, generated = msgspec.json.schema_components(
        [EventIn, ReplayIn, ChannelView, DeliveryDetail], ref_template="#/components/schemas/{name}"
    )
    for name, schema in generated.items():
        assert schemas[name] == schema, name
    event_type = schemas["EventIn"]["properties"]["type"]
    assert event_type == {"type": "string", "maxLength": 200, "minLength": 1,
                          "pattern": EVENT_TYPE_RE}  # fmt: skip
    assert schemas["ReplayIn"]["properties"]["created_after"]["anyOf"][0] == {
        "type": "string", "format": "date-time",
    }  # fmt: skip
    assert schemas["AttemptView"]["properties"]["outcome"]["enum"] == [
        "delivered", "retry", "rate_limited", "dead", "panic", "replayed",
    ]  # fmt: skip
    assert schemas["ChannelView"]["properties"]["health"] == {
        "$ref": "#/components/schemas/ChannelHealth"
    }
    assert schemas["ChannelView"]["additionalProperties"] is False


def test_query_and_path_parameters() -> None:
    ops = operations(document("webhook"))
    names = {p["name"]: p for p in ops["GET", "/v1/deliveries"]["parameters"]}
    assert set(names) == {"status", "channel_id", "event_id", "limit", "cursor"}
    assert names["limit"]["schema"] == {
        "type": "integer", "minimum": 1, "maximum": 500, "default": 50,
    }  # fmt: skip
    assert names["status"]["schema"]["enum"] == ["PENDING", "RETRYING", "DELIVERED", "DEAD"]
    assert {p["name"] for p in ops["GET", "/v1/channels"]["parameters"]} == {
        "type", "recipient", "limit", "cursor",
    }  # fmt: skip
    doc = document("webhook")
    for path, item in doc["paths"].items():
        for param in item.get("parameters", []):
            assert param["in"] == "path"
            assert f"{{{param['name']}}}" in path
            assert param["schema"] == {"type": "string", "format": "uuid"}


@pytest.mark.parametrize(
    ("types", "variants"),
    [
        ((), None),
        (("webhook",), ["WebhookChannelIn"]),
        (("webhook", "email", "telegram"),
         ["EmailChannelIn", "TelegramChannelIn", "WebhookChannelIn"]),
        (("pigeon",), ["PigeonChannelIn"]),  # a type with no known config struct
    ],
)  # fmt: skip
def test_a_channel_body_per_enabled_type(
    types: tuple[str, ...], variants: list[str] | None
) -> None:
    doc = document(*types)
    schemas = doc["components"]["schemas"]
    create = doc["paths"]["/v1/channels"]["post"]["requestBody"]["content"]["application/json"]
    if variants is None:
        assert create["schema"] == {"$ref": "#/components/schemas/ChannelIn"}
        return
    assert [ref["$ref"].rsplit("/", 1)[1] for ref in create["schema"]["oneOf"]] == variants
    for channel_type, name in zip(sorted(types), variants, strict=True):
        properties = schemas[name]["properties"]
        assert properties["type"] == {"type": "string", "const": channel_type}
        config = properties["config"]
        assert config == {"type": "object"} or config["$ref"].endswith("Config")
    patch_config = schemas["ChannelPatchIn"]["properties"]["config"]
    assert ("anyOf" in patch_config) == (len(types) > 1)


def test_limits_come_from_the_config() -> None:
    doc = document("webhook", max_batch_events=7)
    assert doc["components"]["schemas"]["BatchIn"]["properties"]["events"]["maxItems"] == 7
    assert "1048576 bytes" in doc["info"]["description"]
    assert msgspec.json.decode(msgspec.json.encode(doc)) == doc, "plain JSON"


def test_a_channels_rate_limit_is_documented_where_it_is_set_and_shown() -> None:
    schemas = document("webhook")["components"]["schemas"]
    for name in ("ChannelIn", "ChannelPatch"):
        number, null = schemas[name]["properties"]["rate_limit_per_second"]["anyOf"]
        assert (number["type"], null) == ("number", {"type": "null"})
        assert number["minimum"] == 1 / 3600  # one an hour: a bucket's period is 1/rate
        assert "exclusiveMinimum" not in number
        assert "across every worker process" in number["description"]
        assert "at least 1/3600 (one an hour)" in number["description"]
    view = schemas["ChannelView"]
    assert "rate_limit_per_second" in view["required"]  # always shown, null when unlimited
    assert {"type": "null"} in view["properties"]["rate_limit_per_second"]["anyOf"]
