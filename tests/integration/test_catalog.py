"""The event-type catalog through the HTTP API, against the real service on the real Postgres:
a type registered with its JSON Schema, events of it checked (422 naming the failing path,
nothing written), unregistered types stored unless the tenant is strict, a type deleted, the
schemas themselves checked, the catalog exported as an OpenAPI 3.1 document, and a change
made outside this process (another ingest process, a tool) reaching it through the NOTIFY."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import trio
from schemathesis.specs.openapi.definitions import OPENAPI_31

from notifier.catalog import MAX_CATALOG_BYTES, MAX_EXPANDED_NODES, MAX_SCHEMA_BYTES
from notifier.ingest.tenants import TenantCaches
from tests.integration.conftest import make_config, poll, run_notifier, sql
from tests.integration.test_api import Api, api_db, assert_error, open_api, refused
from tests.integration.test_cli import config_file, notifier
from tests.unit.test_catalog import HOSTILE

__all__ = ["api_db"]  # the fixture, shared with test_api

ORDER = {
    "type": "object",
    "required": ["order"],
    "properties": {
        "order": {
            "type": "object",
            "required": ["total"],
            "properties": {"total": {"$ref": "#/$defs/money"}, "note": {"type": "string"}},
        }
    },
    "$defs": {"money": {"type": "number", "minimum": 0}},
}
GOOD = {"order": {"total": 12.5}}


@pytest.fixture
async def api(api_db: str) -> AsyncIterator[Api]:
    async with open_api(api_db) as running:
        yield running


async def register(
    client: httpx.AsyncClient, name: str, schema: dict[str, Any], description: str = ""
) -> httpx.Response:
    return await client.put(
        f"/v1/event-types/{name}", json={"schema": schema, "description": description}
    )


async def post(client: httpx.AsyncClient, event_type: str, payload: Any) -> httpx.Response:
    return await client.post("/v1/events", json={"type": event_type, "payload": payload})


async def test_a_registered_type_is_checked_until_it_is_deleted(api: Api) -> None:
    created = await register(api.a, "order.placed", ORDER, "An order was placed.")
    assert created.status_code == 201, created.text
    view = created.json()
    assert (view["name"], view["description"], view["schema"]) == (
        "order.placed", "An order was placed.", ORDER,
    )  # fmt: skip
    assert (await api.a.get("/v1/event-types/order.placed")).json() == view
    listed = (await api.a.get("/v1/event-types")).json()
    assert [t["name"] for t in listed["items"]] == ["order.placed"]
    # Another tenant sees none of it, and its events of that type are not checked.
    assert (await api.b.get("/v1/event-types")).json() == {"items": []}
    assert_error(await api.b.get("/v1/event-types/order.placed"), 404, "not_found")
    assert (await post(api.b, "order.placed", {"order": "anything"})).status_code == 202

    assert (await post(api.a, "order.placed", GOOD)).status_code == 202
    await refused(
        api, 422, "schema_violation", "payload at $.order.total", '"twelve" is not of type',
        "order.placed", method="POST", path="/v1/events",
        json={"type": "order.placed", "payload": {"order": {"total": "twelve"}}},
    )  # fmt: skip
    await refused(
        api, 422, "schema_violation", "payload at $.order", '"total" is a required property',
        method="POST", path="/v1/events", json={"type": "order.placed", "payload": {"order": {}}},
    )  # fmt: skip
    # A batch is stored whole or not at all: one refused event refuses it, by its index.
    await refused(
        api, 422, "schema_violation", "events[1].payload at $.order.total", "less than the minimum",
        method="POST", path="/v1/events/batch",
        json={"events": [{"type": "order.placed", "payload": GOOD},
                         {"type": "order.placed", "payload": {"order": {"total": -1}}}]},
    )  # fmt: skip
    batch = await api.a.post(
        "/v1/events/batch",
        json={"events": [{"type": "order.placed", "payload": GOOD},
                         {"type": "order.other", "payload": {"anything": [1]}}]},
    )  # fmt: skip
    assert batch.status_code == 202, batch.text
    # An unregistered type is stored unchecked (strict_event_types is off by default).
    assert (await post(api.a, "order.unregistered", {"x": 1})).status_code == 202

    # Replaced: the new schema applies at once in this process.
    replaced = await register(api.a, "order.placed", {"type": "object", "required": ["id"]})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["created_at"] == view["created_at"]
    assert (await post(api.a, "order.placed", GOOD)).status_code == 422
    assert (await post(api.a, "order.placed", {"id": 1})).status_code == 202

    deleted = await api.a.delete("/v1/event-types/order.placed")
    assert deleted.status_code == 204
    assert (await post(api.a, "order.placed", {"order": "unchecked"})).status_code == 202
    assert_error(await api.a.get("/v1/event-types/order.placed"), 404, "not_found")
    assert_error(await api.a.delete("/v1/event-types/order.placed"), 404, "not_found")


async def test_strict_mode_refuses_unregistered_types(api: Api) -> None:
    assert (await api.a.get("/v1/tenant")).json() == {
        "id": str(api.tenant_a), "strict_event_types": False,
    }  # fmt: skip
    assert (await register(api.a, "order.placed", ORDER)).status_code == 201
    on = await api.a.patch("/v1/tenant", json={"strict_event_types": True})
    assert on.json() == {"id": str(api.tenant_a), "strict_event_types": True}
    await refused(
        api, 422, "unregistered_event_type", "'order.unknown'", "strict_event_types",
        method="POST", path="/v1/events", json={"type": "order.unknown", "payload": {}},
    )  # fmt: skip
    await refused(
        api, 422, "unregistered_event_type", "events[0].type",
        method="POST", path="/v1/events/batch",
        json={"events": [{"type": "order.unknown", "payload": {}}]},
    )  # fmt: skip
    assert (await post(api.a, "order.placed", GOOD)).status_code == 202
    assert (await post(api.b, "order.unknown", {})).status_code == 202  # B is not strict
    assert (await api.a.patch("/v1/tenant", json={})).json()["strict_event_types"] is True
    await refused(
        api, 422, "validation_error", "strict_event_types",
        method="PATCH", path="/v1/tenant", json={"strict_event_types": "yes"},
    )  # fmt: skip
    off = await api.a.patch("/v1/tenant", json={"strict_event_types": False})
    assert off.json()["strict_event_types"] is False
    assert (await post(api.a, "order.unknown", {})).status_code == 202


SCHEMA_REFUSALS = {
    "not-draft-2020-12": ({"type": "wat"}, "schema at $.type"),
    "bad-regex": ({"properties": {"a": {"pattern": "("}}}, "$.properties.a.pattern"),
    "remote-ref": ({"$ref": "https://example.com/schema.json"}, "only references inside"),
    "dangling-ref": ({"$ref": "#/$defs/nothing"}, "points to nothing"),
    "dangling-anchor": ({"$ref": "#nowhere"}, "Anchor 'nowhere' does not exist"),
    "lookaround": ({"pattern": "(?=x)"}, "$.pattern"),  # the regex engine never backtracks
    "other-draft": ({"$schema": "http://json-schema.org/draft-07/schema#"}, '$["$schema"]'),
    "too-big": ({"description": "x" * MAX_SCHEMA_BYTES}, f"at most {MAX_SCHEMA_BYTES} bytes"),
    # Checks whose work has no bound: refused before any event is checked with them.
    "anyOf-chain": (HOSTILE["anyOf-chain"], f"over {MAX_EXPANDED_NODES} nodes with every $ref"),
    "recursive-anyOf": (HOSTILE["recursive-anyOf"], "recursive (a $ref cycle)"),
    "dynamic-ref": ({"$dynamicRef": "#node"}, "$dynamicRef is not supported"),
}
# Definitions shared by many references are fine: each is counted where it is referenced.
SHARED_DEFS = {
    "$defs": {
        "money": {"type": "number", "minimum": 0},
        "line": {
            "type": "object",
            "properties": {"price": {"$ref": "#/$defs/money"}, "tax": {"$ref": "#/$defs/money"}},
        },
    },
    "type": "object",
    "properties": {
        "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}},
        "total": {"anyOf": [{"$ref": "#/$defs/money"}, {"$ref": "#/$defs/line"}]},
    },
}


async def test_a_schema_that_cannot_be_used_is_refused_naming_where(api: Api) -> None:
    for schema, mention in SCHEMA_REFUSALS.values():
        resp = await register(api.a, "order.placed", schema)
        assert_error(resp, 422, "invalid_schema", mention)
    await refused(
        api, 422, "validation_error", "name", method="PUT", path="/v1/event-types/not a type",
        json={"schema": {}},
    )  # fmt: skip
    await refused(
        api, 422, "validation_error", "schema", method="PUT", path="/v1/event-types/a.b",
        json={"schema": [1]},
    )  # fmt: skip
    await refused(
        api, 422, "validation_error", "description", method="PUT", path="/v1/event-types/a.b",
        json={"schema": {}, "description": "x" * 2001},
    )  # fmt: skip
    assert (await api.a.get("/v1/event-types")).json() == {"items": []}
    assert (await register(api.a, "order.shared", SHARED_DEFS)).status_code == 201
    assert (
        await post(api.a, "order.shared", {"lines": [{"price": 1}], "total": 2})
    ).status_code == 202
    assert (await post(api.a, "order.shared", {"lines": [{"price": -1}]})).status_code == 422


async def test_a_tenants_schemas_are_bounded_in_all(api: Api) -> None:
    """At most ``MAX_CATALOG_BYTES`` of schemas per tenant (as Postgres prints them): what an
    ingest process holds and compiles for one tenant is bounded."""
    schema = {"description": "x" * 60_000}
    stored = 0
    while True:
        resp = await register(api.a, f"t.{stored}", schema)
        if resp.status_code != 201:
            break
        stored += 1
    assert_error(resp, 422, "catalog_too_large", f"at most {MAX_CATALOG_BYTES} in all")
    assert stored == MAX_CATALOG_BYTES // (60_000 + len('{"description": ""}'))
    assert len((await api.a.get("/v1/event-types")).json()["items"]) == stored
    # Another tenant has a bound of its own; a replaced type counts its new schema only.
    assert (await register(api.b, "t.0", schema)).status_code == 201
    assert (await register(api.a, "t.0", {})).status_code == 200
    assert (await register(api.a, "t.last", schema)).status_code == 201


async def test_the_catalog_is_exported_as_an_openapi_31_document(api: Api) -> None:
    for name, description in (("order.placed", "An order was placed."), ("user.signed_up", "")):
        assert (await register(api.a, name, ORDER, description)).status_code == 201
    resp = await api.a.get("/v1/catalog/openapi.json")
    assert resp.status_code == 200
    doc = resp.json()
    jsonschema.Draft202012Validator(OPENAPI_31).validate(doc)  # the OpenAPI 3.1 schema
    assert doc["openapi"] == "3.1.0"
    assert sorted(doc["webhooks"]) == ["order.placed", "user.signed_up"]
    webhook = doc["webhooks"]["order.placed"]["post"]
    assert webhook["summary"] == "An order was placed."
    body_schema = webhook["requestBody"]["content"]["application/json"]["schema"]
    # What a webhook channel sends for such an event matches it, with the type's own $refs.
    check = jsonschema.Draft202012Validator({**body_schema, "components": doc["components"]})
    sent = {"type": "order.placed", "timestamp": "2026-01-01T00:00:00Z", "data": GOOD}
    check.validate(sent)
    assert not check.is_valid(sent | {"data": {"order": {"total": -1}}})
    assert not check.is_valid(sent | {"type": "user.signed_up"})
    assert (await api.b.get("/v1/catalog/openapi.json")).json()["webhooks"] == {}


async def test_a_change_made_elsewhere_reaches_ingest_through_the_notify(api: Api) -> None:
    """A change written by another process (here: SQL) is NOTIFYed: this process forgets the
    tenant's cached catalog within moments, not after its 30 s TTL."""
    assert (await post(api.a, "order.placed", {"x": 1})).status_code == 202  # catalog cached
    await sql(
        api.db,
        "INSERT INTO event_types (tenant_id, name, schema) "
        "VALUES ($1, 'order.placed', $2::text::jsonb)",
        api.tenant_a, '{"type": "object", "required": ["id"]}',
    )  # fmt: skip

    async def refused_now() -> bool:
        return (await post(api.a, "order.placed", {"x": 1})).status_code == 422

    with trio.fail_after(5):
        await poll(refused_now)
    await sql(api.db, "UPDATE tenants SET strict_event_types = true WHERE id = $1", api.tenant_a)

    async def strict_now() -> bool:
        return (await post(api.a, "order.other", {})).status_code == 422

    with trio.fail_after(5):
        await poll(strict_now)
    assert uuid.UUID((await api.a.get("/v1/tenant")).json()["id"]) == api.tenant_a


async def test_an_operator_turns_strict_mode_on_and_off_with_the_cli(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    cfg = str(config_file(tmp_path, database_url))

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return await trio.to_thread.run_sync(lambda: notifier(*args, "--config", cfg))

    created = await cli("tenant", "create", "acme")
    key = json.loads(created.stdout)["api_key"]
    async with (
        run_notifier(make_config(database_url, broker_url), ("ingest",)) as running,
        running.client(key) as client,
    ):
        assert (await post(client, "order.unknown", {})).status_code == 202
        on = await cli("tenant", "strict-event-types", "acme", "on")
        assert on.returncode == 0, on.stderr
        assert json.loads(on.stdout) == {"name": "acme", "strict_event_types": True}
        assert (await client.get("/v1/tenant")).json()["strict_event_types"] is True

        async def strict_now() -> bool:  # the running process hears the tenant's NOTIFY
            return (await post(client, "order.unknown", {})).status_code == 422

        with trio.fail_after(5):
            await poll(strict_now)
        off = await cli("tenant", "strict-event-types", "acme", "off")
        assert json.loads(off.stdout) == {"name": "acme", "strict_event_types": False}
    missing = await cli("tenant", "strict-event-types", "nobody", "on")
    assert (missing.returncode, missing.stderr) == (2, "notifier: no tenant named 'nobody'\n")
    wrong = await cli("tenant", "strict-event-types", "acme", "maybe")
    assert wrong.returncode == 2
    assert "invalid choice: 'maybe'" in wrong.stderr


class Forgotten:
    """A cache registered with a process's ``TenantCaches`` as the caches of API keys are (not
    as a catalog): records each tenant it is told to forget."""

    def __init__(self) -> None:
        self.tenants: list[uuid.UUID] = []

    def forget(self, tenant_id: uuid.UUID) -> None:
        self.tenants.append(tenant_id)

    def forget_all(self) -> None:
        pass


async def test_a_type_change_reaches_another_process_on_its_own_channel(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    """A type registered through one ingest process reaches another's cached catalog (TTL
    30 s) within moments, through ``notifier_catalogs``; the other's caches of API keys are
    not touched (a tenant writing its catalog must not empty them for every tenant), while a
    change of the tenant itself still reaches both."""
    cfg = str(config_file(tmp_path, database_url))
    created = await trio.to_thread.run_sync(
        lambda: notifier("tenant", "create", "acme", "--config", cfg)
    )
    key = json.loads(created.stdout)["api_key"]
    tenant_id = uuid.UUID(json.loads(created.stdout)["id"])
    keys_of_b = Forgotten()
    caches_b = TenantCaches(ttl_seconds=60)
    caches_b.register(keys_of_b)
    config = make_config(database_url, broker_url)
    async with (
        run_notifier(config, ("ingest",)) as a,
        run_notifier(config, ("ingest",), tenant_caches=caches_b) as b,
        a.client(key) as client_a,
        b.client(key) as client_b,
    ):
        assert (await post(client_b, "order.placed", {"x": 1})).status_code == 202  # cached
        put = await register(client_a, "order.placed", {"type": "object", "required": ["id"]})
        assert put.status_code == 201, put.text

        async def refused_by_b() -> bool:
            return (await post(client_b, "order.placed", {"x": 1})).status_code == 422

        with trio.fail_after(5):
            await poll(refused_by_b)
        assert (await client_a.delete("/v1/event-types/order.placed")).status_code == 204

        async def taken_by_b() -> bool:
            return (await post(client_b, "order.placed", {"x": 1})).status_code == 202

        with trio.fail_after(5):
            await poll(taken_by_b)
        assert keys_of_b.tenants == []  # the key caches heard nothing of it
        await sql(
            database_url, "UPDATE tenants SET strict_event_types = true WHERE id = $1", tenant_id
        )

        async def heard() -> bool:
            return keys_of_b.tenants == [tenant_id]

        with trio.fail_after(5):
            await poll(heard)  # the tenants' channel still reaches every cache
        assert (await post(client_b, "order.other", {})).status_code == 422  # strict now
