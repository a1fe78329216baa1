"""The OpenAPI document (``notifier.ingest.openapi``): every route of the app and nothing else,
schemas generated from the models, the error answers and the security of each operation."""

from __future__ import annotations

import base64
import re
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest

from notifier.adapters.base import InvalidChannelConfig
from notifier.adapters.webhook.channels import WebhookChannels
from notifier.adapters.webhook.headers import RESERVED_HEADERS, header_problem
from notifier.config import parse_config
from notifier.ingest.api.docs import BUNDLE_PATH
from notifier.ingest.api.http import ApiError, decode_body
from notifier.ingest.api.pagination import DEFAULT_PAGE, MAX_PAGE
from notifier.ingest.app import create_app
from notifier.ingest.models import EVENT_TYPE_RE, ChannelIn, ChannelPatch, EventIn, ReplayIn
from notifier.ingest.openapi import build_openapi
from notifier.ingest.views import ChannelView, DeliveryDetail
from notifier.store.pg import Store
from notifier.testing import RecordingAdapter

PUBLIC = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", BUNDLE_PATH}
WITH_BODY = {  # operation id: the error statuses a request body can add
    "createChannel": {400, 413, 415, 422},
    "createPortalLink": {400, 413, 415, 422},
    "patchChannel": {400, 413, 415, 422},
    "postEvent": {400, 413, 415, 422},
    "postEventBatch": {400, 413, 415, 422},
    "retryDeliveries": {400, 413, 415, 422},
    "retryDelivery": {413, 422},  # no body, or {}: anything else is a 422
    "putEventType": {400, 413, 415, 422},
    "patchTenant": {400, 413, 415, 422},
}
# Operations on a path with a parameter that answer no 404: PUT creates what is not there.
NO_404 = {"putEventType"}


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
    console's and the portal's HTML pages, ``/console`` and ``/portal``, are no part of the API)."""
    config = parse_config({"workers": {"webhook": {}}}, env={})
    # not called while building
    store = cast(Store, SimpleNamespace(metrics_snapshot=None, event_catalog=None))
    app = create_app(store, config, {"webhook": RecordingAdapter("webhook")})
    routes = {
        (method, re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule))
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static" and not rule.endpoint.startswith(("console.", "portal."))
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    assert routes == set(operations(document("webhook")))


def test_security_and_error_answers_of_each_operation() -> None:
    doc = document("webhook")
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "A tenant's API key.",
    }  # fmt: skip
    for (_method, path), op in operations(doc).items():
        statuses = {int(s) for s in op["responses"]}
        if path in PUBLIC:
            assert op["security"] == [], path
            # /metrics has a token of its own (ingest.metrics_token_env), not a tenant's key
            assert (401 in statuses) == (path == "/metrics"), path
            continue
        assert op["security"] == [{"bearer": []}], path
        # 429: an ingest over its rate, and any keyed request after too many 401s from its
        # address (too_many_unauthorized)
        assert {401, 429, 503} <= statuses, path
        assert (404 in statuses) == ("{" in path and op["operationId"] not in NO_404), path
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
        "delivered", "retry", "rate_limited", "deferred", "dead", "panic", "replayed",
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
        "type", "recipient", "customer", "limit", "cursor",
    }  # fmt: skip
    doc = document("webhook")
    for path, item in doc["paths"].items():
        for param in item.get("parameters", []):
            assert param["in"] == "path"
            assert f"{{{param['name']}}}" in path
            if param["name"] == "name":  # an event type's, as POST /v1/events takes it
                assert param["schema"]["pattern"] == EVENT_TYPE_RE, path
            else:
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


# -- the document says what the server takes ----------------------------------------------------


def webhook_config(schemas: dict[str, Any], name: str) -> dict[str, Any]:
    properties: dict[str, Any] = schemas[name]["properties"]
    return properties


def refusal(validator: WebhookChannels, config: dict[str, Any]) -> str | None:
    try:
        validator.prepare_config(config)
    except InvalidChannelConfig as exc:
        return str(exc)
    return None


def test_a_webhook_secret_is_documented_as_the_server_checks_it() -> None:
    """The pattern of `config.secret` matches exactly the secrets the server takes: whsec_ and
    the padded standard base64 of 24 to 64 bytes."""
    schemas = document("webhook")["components"]["schemas"]
    created = webhook_config(schemas, "WebhookConfig")["secret"]["anyOf"]
    pattern = re.compile(created[0]["pattern"])
    validator = WebhookChannels(timeout_seconds=1, allow_private_networks=True)
    url = "https://hooks.example.com/in"
    for size in range(0, 80):
        raw = bytes(range(size % 256))[:size] + b"\xff" * max(0, size - 256)
        for secret in [
            "whsec_" + base64.b64encode(raw).decode(),
            "whsec_" + base64.b64encode(raw).decode().rstrip("="),  # unpadded
            "whsec_" + base64.urlsafe_b64encode(raw).decode(),
            base64.b64encode(raw).decode(),  # no prefix
        ]:
            problem = refusal(validator, {"url": url, "secret": secret})
            assert problem is None or problem.startswith("config.secret: must be whsec_")
            taken = problem is None
            assert taken == bool(pattern.search(secret)), (size, secret)
            assert taken <= (24 <= size <= 64), (size, secret)
    assert {"type": "null"} in created, "a create without a secret gets a generated one"


def test_a_patch_cannot_set_the_secret_to_null_in_the_document_or_the_server() -> None:
    doc = document("webhook")
    schemas = doc["components"]["schemas"]
    assert schemas["ChannelPatchIn"]["properties"]["config"] == {
        "$ref": "#/components/schemas/WebhookConfigUpdate"
    }
    secret = webhook_config(schemas, "WebhookConfigUpdate")["secret"]
    assert secret["type"] == "string"
    assert "anyOf" not in secret
    assert (
        secret["pattern"]
        == webhook_config(schemas, "WebhookConfig")["secret"]["anyOf"][0]["pattern"]
    )
    validator = WebhookChannels(timeout_seconds=1, allow_private_networks=True)
    stored = validator.prepare_config({"url": "https://hooks.example.com/in"})
    with pytest.raises(InvalidChannelConfig, match=r"config\.secret: a PATCH must give"):
        validator.prepare_config_update(
            {"url": "https://hooks.example.com/in", "secret": None}, stored
        )


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/notifier", "http://10.0.0.1:8080/a?b=c#d",
        "HTTPS://[2001:db8:0:0:0:0:0:1]:65535/", "http://_svc-1.internal./x/%zz~",
    ],
)  # fmt: skip
def test_urls_of_the_documented_form_are_taken(url: str) -> None:
    properties = webhook_config(document("webhook")["components"]["schemas"], "WebhookConfig")
    assert properties["url"]["maxLength"] == 2048
    assert re.search(properties["url"]["pattern"], url)
    WebhookChannels(timeout_seconds=1, allow_private_networks=True).prepare_config({"url": url})


@pytest.mark.parametrize(
    "url",
    ["ftp://hooks.example.com/", "https://user@hooks.example.com/", "https://", "https://a.1/",
     "https://a.example.com:65536/", "https://a.example.com/ space", "https://a.example.com\n"],
)  # fmt: skip
def test_urls_the_server_refuses_do_not_have_the_documented_form(url: str) -> None:
    properties = webhook_config(document("webhook")["components"]["schemas"], "WebhookConfig")
    assert not re.search(properties["url"]["pattern"], url)


def test_header_names_and_values_are_documented_as_the_rule_says() -> None:
    headers = webhook_config(document("webhook")["components"]["schemas"], "WebhookConfig")[
        "headers"
    ]
    name = re.compile(headers["propertyNames"]["pattern"])
    value = re.compile(headers["additionalProperties"]["pattern"])
    for header in [*RESERVED_HEADERS, "webhook-id", "Webhook-Signature", "a b", "", "é"]:
        for spelled in (header, header.upper(), header.title()):
            assert header_problem(spelled, "v") is not None
            assert not name.search(spelled), spelled
    for header in ["X-Team", "x-hosts", "Hostname", "Webhooks", "!#$%&'*+-.^_`|~"]:
        assert header_problem(header, "v") is None
        assert name.search(header), header
    for text, ok in [("", True), ("a b\tc", True), (" a", False), ("a ", False), ("é", False),
                     ("a\nb", False), ("a\n", False)]:  # fmt: skip
        assert (header_problem("X", text) is None) == ok == bool(value.search(text)), text


def test_text_without_nul_and_64_bit_integers_in_a_payload() -> None:
    schemas = document("webhook")["components"]["schemas"]
    payload = schemas["EventIn"]["properties"]["payload"]
    assert payload["additionalProperties"] == {"$ref": "#/components/schemas/JsonValue"}
    number = next(v for v in schemas["JsonValue"]["anyOf"] if v["type"] == "number")
    assert (number["minimum"], number["maximum"]) == (-(2**63), 2**63 - 1)
    for field in ("name", "recipient"):
        (text, *_) = [
            s for s in schemas["ChannelIn"]["properties"][field].get("anyOf", [])
            or [schemas["ChannelIn"]["properties"][field]] if s.get("type") == "string"
        ]  # fmt: skip
        assert not re.search(text["pattern"], "a\x00b"), field
        assert re.search(text["pattern"], "a\nb"), field


@pytest.mark.parametrize(
    ("body", "kind", "field", "value"),
    [
        (b'{"limit": 229.0}', ReplayIn, "limit", 229),
        (b'{"limit": 2.29e2}', ReplayIn, "limit", 229),
        (b'{"max_attempts": 3.0}', ChannelPatch, "max_attempts", 3),
        (b'{"type": "webhook", "config": {"x": 1.0}, "max_attempts": 3.0}', ChannelIn,
         "max_attempts", 3),
    ],
)  # fmt: skip
def test_an_integer_may_be_written_with_a_zero_fraction(
    body: bytes, kind: type[Any], field: str, value: int
) -> None:
    """JSON Schema counts 229.0 an integer, so the document's integers take it."""
    decoded = decode_body(body, kind)
    got = getattr(decoded, field)
    assert (got, type(got)) == (value, int)
    if kind is ChannelIn:
        assert decoded.config == {"x": 1.0}, "other numbers are left as they are"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"limit": 229.5}', "limit: Expected `int`, got `float`"),
        (b'{"limit": 2000.0}', "limit: Expected `int` <= 1000"),
        (b'{"limit": 1e300}', "limit: Expected `int` <= 1000"),
        (b'{"limit": "229"}', "limit: Expected `int`, got `str`"),
    ],
)  # fmt: skip
def test_other_numbers_are_still_refused(body: bytes, message: str) -> None:
    with pytest.raises(ApiError) as refused:
        decode_body(body, ReplayIn)
    assert (refused.value.status, refused.value.message) == (422, message)


def test_an_event_links_to_its_deliveries() -> None:
    ops = operations(document("webhook"))
    targets = {op["operationId"]: op for op in ops.values()}
    listing = targets["listDeliveries"]
    assert "event_id" in {p["name"] for p in listing["parameters"] if p["in"] == "query"}
    for (method, path), status, source in [
        (("POST", "/v1/events"), "202", "$response.body#/id"),
        (("POST", "/v1/events"), "200", "$response.body#/id"),
        (("GET", "/v1/events/{event_id}"), "200", "$response.body#/id"),
        (("POST", "/v1/events/batch"), "202", "$response.body#/events/0/id"),
    ]:
        links = ops[method, path]["responses"][status]["links"]
        (link,) = [v for v in links.values() if v["operationId"] == "listDeliveries"]
        assert link["parameters"] == {"query.event_id": source}, (method, path, status)


def test_metrics_lists_the_answers_of_its_protection() -> None:
    responses = operations(document("webhook"))[("GET", "/metrics")]["responses"]
    assert {"200", "400", "401", "404", "503"} == set(responses)
    assert "WWW-Authenticate" in responses["401"]["headers"]
    for status in ("400", "401", "404"):
        assert responses[status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorBody"
        }
