"""The event-type catalog (``notifier.catalog``): which schemas can be registered and where a
refused one is wrong, how an event is checked (the failing path named), and the per-tenant cache
of compiled catalogs (its TTL on a clock that stands still, forgetting on a tenant change, one
lookup for concurrent readers). And the catalog routes of the API over the in-memory store."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from notifier.catalog import (
    CATALOG_CACHE_SECONDS,
    MAX_CATALOG_BYTES,
    MAX_EXPANDED_NODES,
    MAX_SCHEMA_BYTES,
    Catalog,
    Catalogs,
    EventRefused,
    SchemaRefused,
    StoredCatalog,
    compile_schema,
    compiled,
    expanded_size,
)
from notifier.config import parse_config
from notifier.ingest.app import create_app
from notifier.ingest.catalog_openapi import catalog_document
from notifier.ingest.tenants import TenantCaches, hash_api_key
from notifier.store.rows import EventType
from notifier.testing import RecordingAdapter
from notifier.testing.api import MemoryApiStore

ORDER = {
    "type": "object",
    "required": ["order"],
    "properties": {
        "order": {"type": "object", "properties": {"total": {"$ref": "#/$defs/money"}}},
        "tags": {"type": "array", "items": {"type": "string"}},
        "odd key": {"type": "string"},
    },
    "$defs": {"money": {"type": "number", "minimum": 0}},
}
TENANT = uuid.UUID(int=1)


def anyof_chain(links: int) -> dict[str, Any]:
    """``links`` chained ``$defs``, each ``anyOf`` two references to the next, ending in
    ``{"type": "string"}``: a check of ``{"x": 1}`` evaluates 2**links branches (18 links, a
    schema of 1.5 KB: some 25 s of the event loop before the expanded size was bounded)."""
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"},
                            {"$ref": f"#/$defs/d{i + 1}", "minimum": 0}]}
        for i in range(links)
    }  # fmt: skip
    defs[f"d{links}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


# anyOf over nested arrays, each branch the whole schema again (6.6 s at depth 10 before).
RECURSIVE_ANYOF = {
    "anyOf": [
        {"type": "array", "items": {"$ref": "#"}},
        {"type": "array", "items": {"$ref": "#"}, "minItems": 0},
        {"type": "integer"},
    ]
}
HOSTILE = {"anyOf-chain": anyof_chain(18), "recursive-anyOf": RECURSIVE_ANYOF}


@pytest.mark.parametrize(
    ("schema", "path", "reason"),
    [
        ([], "$", "must be a JSON object"),
        ({"type": "wat"}, "$.type", "is not valid"),
        ({"properties": {"a": {"minimum": "0"}}}, "$.properties.a.minimum", "is not of type"),
        ({"pattern": "("}, "$.pattern", 'is not a "regex"'),  # compiled here, not at ingest
        # The linear-time engine has no lookaround nor backreferences.
        ({"properties": {"a": {"pattern": "(?=x)"}}}, "$.properties.a.pattern", "regex"),
        ({"patternProperties": {"(a)\\1": {}}}, '$.patternProperties["(a)\\\\1"]', "regex"),
        ({"$ref": "https://example.com/s.json"}, '$["$ref"]', "only references inside"),
        ({"$ref": "s.json#/x"}, '$["$ref"]', "only references inside"),
        ({"items": {"$ref": "#/$defs/x"}}, '$.items["$ref"]', "points to nothing"),
        ({"$ref": "#nowhere"}, "$", "Anchor 'nowhere' does not exist"),
        ({"properties": {"a": {"$id": "a.json"}}}, '$.properties.a["$id"]', "only at the root"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, '$["$schema"]', "2020-12"),
        ({"description": "x" * MAX_SCHEMA_BYTES}, "$", f"at most {MAX_SCHEMA_BYTES} bytes"),
        # What a check costs is bounded at registration: no recursion, a bounded expansion.
        (HOSTILE["anyOf-chain"], "$", f"over {MAX_EXPANDED_NODES} nodes with every $ref"),
        (RECURSIVE_ANYOF, '$.anyOf[0].items["$ref"]', "recursive (a $ref cycle)"),
        ({"type": "object", "properties": {"next": {"$ref": "#"}}},
         '$.properties.next["$ref"]', "recursive"),
        ({"$ref": "#"}, '$["$ref"]', "recursive"),
        ({"$defs": {"a": {"$anchor": "a", "items": {"$ref": "#a"}}}},
         '$["$defs"].a.items["$ref"]', "recursive"),  # even unused
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"not": {"$ref": "#/$defs/a"}}}},
         '$["$defs"].b.not["$ref"]', "recursive"),
        ({"$dynamicRef": "#node"}, '$["$dynamicRef"]', "not supported"),
        ({"$recursiveRef": "#"}, '$["$recursiveRef"]', "not supported"),
        ({"$ref": "#/$defs/0", "$defs": {str(i): {"$ref": f"#/$defs/{i + 1}"}
                                         for i in range(2_000)} | {"2000": {}}},
         "$", "too deep"),  # fits in 64 KiB; a Python stack does not hold it
    ],
)  # fmt: skip
def test_a_schema_that_cannot_be_used_is_refused_naming_where(
    schema: Any, path: str, reason: str
) -> None:
    with pytest.raises(SchemaRefused) as refused:
        compile_schema(schema)
    assert refused.value.path == path
    assert reason in refused.value.reason


@pytest.mark.parametrize(
    "schema",
    [
        {},
        ORDER,
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"},
        {"$defs": {"a": {"$anchor": "money", "type": "number"}}, "$ref": "#money"},
        # Shared definitions, referenced many times: each counted where it is referenced.
        {
            "$defs": {
                "money": {"type": "number", "minimum": 0},
                "line": {
                    "type": "object",
                    "properties": {
                        "price": {"$ref": "#/$defs/money"},
                        "tax": {"$ref": "#/$defs/money"},
                    },
                },
            },
            "properties": {
                "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}},
                "total": {"$ref": "#/$defs/money"},
                "either": {"anyOf": [{"$ref": "#/$defs/line"}, {"$ref": "#/$defs/money"}]},
            },
        },
        anyof_chain(7),  # 2**7 branches: within the bound
        {"pattern": "^(a+)+$"},  # backtracks exponentially in Python's re; linear here
        {"const": {"$ref": "not a reference: data"}},  # values are not schemas
    ],
)
def test_schemas_that_are_taken(schema: dict[str, Any]) -> None:
    compile_schema(schema)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"order": {"total": "x"}}, 'payload at $.order.total: "x" is not of type "number"'),
        ({"order": {"total": -1}}, "payload at $.order.total: -1 is less than the minimum of 0"),
        ({}, 'payload at $: "order" is a required property'),
        ({"order": {}, "tags": ["a", 2]}, 'payload at $.tags[1]: 2 is not of type "string"'),
        ({"order": {}, "odd key": 1}, 'payload at $["odd key"]: 1 is not of type "string"'),
    ],
)
def test_an_event_that_does_not_match_is_refused_naming_the_path(
    payload: dict[str, Any], message: str
) -> None:
    catalog = Catalog(False, {"order.placed": compile_schema(ORDER)})
    with pytest.raises(EventRefused) as refused:
        catalog.check("order.placed", payload)
    assert refused.value.code == "schema_violation"
    assert refused.value.message == f"{message} (schema of event type 'order.placed')"


def test_format_is_not_checked_and_long_reasons_are_cut() -> None:
    catalog = Catalog(False, {
        "a": compile_schema({"properties": {"email": {"type": "string", "format": "email"}}}),
        "b": compile_schema({"properties": {"v": {"type": "integer"}}}),
    })  # fmt: skip
    catalog.check("a", {"email": "not an address"})
    with pytest.raises(EventRefused) as refused:
        catalog.check("b", {"v": "x" * 10_000})
    assert len(refused.value.message) < 500


def test_unregistered_types_pass_unless_strict() -> None:
    Catalog(False, {}).check("anything", {"x": 1})
    with pytest.raises(EventRefused) as refused:
        Catalog(True, {}).check("anything", {}, "events[2].")
    assert refused.value.code == "unregistered_event_type"
    assert refused.value.message.startswith("events[2].type: 'anything' is not in the tenant's")


def test_a_pattern_that_would_backtrack_is_matched_in_linear_time() -> None:
    """``^(a+)+$`` against 30 a's and a '!' takes Python's ``re`` minutes (it doubles with each
    a): a tenant could stall the ingest event loop with it. Here it is refused at once."""
    catalog = Catalog(False, {"t": compile_schema({"properties": {"s": {"pattern": "^(a+)+$"}}})})
    started = time.perf_counter()
    with pytest.raises(EventRefused) as refused:
        catalog.check("t", {"s": "a" * 30 + "!"})
    assert time.perf_counter() - started < 1.0
    assert "payload at $.s" in refused.value.message


def longest_chain_taken() -> int:
    links = 0
    while True:
        try:
            expanded_size(anyof_chain(links + 1))
        except SchemaRefused:
            return links
        links += 1


def test_the_expanded_size_counts_each_reference_and_the_cap_is_what_is_refused() -> None:
    money = {"type": "number", "minimum": 0}  # 3 values
    shared = {"$defs": {"m": money}, "items": [{"$ref": "#/$defs/m"}, {"$ref": "#/$defs/m"}]}
    # root, $defs (its definitions counted where referenced), items, 2 x (the object + 3)
    assert expanded_size(shared) == 1 + 1 + 1 + 2 * (1 + 3)
    links = longest_chain_taken()
    assert links == 9  # each link doubles the size: 3,581 nodes at 9 links, 7,165 at 10
    assert expanded_size(anyof_chain(9)) == 3_581
    compile_schema(anyof_chain(links))
    with pytest.raises(SchemaRefused):
        compile_schema(anyof_chain(links + 1))


def test_a_check_against_the_largest_schema_taken_is_fast() -> None:
    """The hostile shape at the largest size the cap takes: a refused payload (every branch
    evaluated and reported) is checked in milliseconds (about 5 ms measured), where 18 links
    took 25 s. The bound here is loose for a loaded machine."""
    links = longest_chain_taken()
    catalog = Catalog(False, {"t": compile_schema(anyof_chain(links))})
    started = time.perf_counter()
    with pytest.raises(EventRefused):
        catalog.check("t", {"x": 1})
    catalog.check("t", "a string")
    assert time.perf_counter() - started < 0.5


def test_a_deep_payload_is_checked() -> None:
    schema = {"type": "object", "properties": {"next": {"type": "object"}}}
    deep: dict[str, Any] = {"n": "x"}
    for _ in range(1_000):  # far deeper than the JSON guard lets a body be (64)
        deep = {"next": deep}
    catalog = Catalog(False, {"chain": compile_schema(schema)})
    catalog.check("chain", deep)
    with pytest.raises(EventRefused) as refused:
        catalog.check("chain", {"next": "x"})
    assert 'payload at $.next: "x" is not of type "object"' in refused.value.message


def test_a_stored_schema_that_no_longer_compiles_checks_nothing() -> None:
    catalog = compiled(StoredCatalog(True, {"ok": {"type": "object"}, "bad": {"type": "wat"},
                                            "cycle": {"$ref": "#"}, "list": [1]}))  # type: ignore[dict-item]  # fmt: skip
    assert set(catalog.validators) == {"ok"}
    assert catalog.strict


def test_only_the_types_that_changed_are_compiled_again() -> None:
    known: dict[str, Any] = {}
    first = compiled(StoredCatalog(False, {"a": ORDER, "b": {"type": "object"}}), known)
    second = compiled(StoredCatalog(False, {"a": ORDER, "b": {"type": "array"}}), known)
    assert second.validators["a"] is first.validators["a"]  # the same schema: kept
    assert second.validators["b"] is not first.validators["b"]
    second.check("b", [])
    # The store's digest, when it gives one, is what tells a change.
    stored = StoredCatalog(False, {"a": ORDER}, {"a": "v1"})
    third = compiled(stored, known)
    assert third.validators["a"] is not second.validators["a"]  # another digest
    assert set(known) == {"a"}  # a type gone is dropped
    assert compiled(stored, known).validators["a"] is third.validators["a"]


class CountingStore:
    def __init__(self) -> None:
        self.catalogs: dict[uuid.UUID, StoredCatalog] = {}
        self.lookups: list[uuid.UUID] = []
        self.gate: trio.Event | None = None

    async def event_catalog(self, tenant_id: uuid.UUID) -> StoredCatalog:
        self.lookups.append(tenant_id)
        if self.gate is not None:
            await self.gate.wait()
        await trio.lowlevel.checkpoint()
        return self.catalogs.get(tenant_id, StoredCatalog(False, {}))


async def test_a_catalog_is_kept_for_its_ttl(mock_clock: trio.testing.MockClock) -> None:
    store = CountingStore()
    catalogs = Catalogs(store.event_catalog)
    assert (await catalogs.of(TENANT)).empty
    await trio.sleep(CATALOG_CACHE_SECONDS - 1)
    await catalogs.of(TENANT)
    assert store.lookups == [TENANT]
    await trio.sleep(1)
    await catalogs.of(TENANT)
    assert store.lookups == [TENANT, TENANT]


async def test_a_tenant_change_forgets_its_catalog_at_once(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = CountingStore()
    caches = TenantCaches()
    catalogs = Catalogs(store.event_catalog)
    caches.register(catalogs)
    other = uuid.UUID(int=2)
    await catalogs.of(TENANT)
    await catalogs.of(other)
    store.catalogs[TENANT] = StoredCatalog(True, {})
    caches.forget(TENANT)  # what the NOTIFY of the tenant's id does
    assert (await catalogs.of(TENANT)).strict
    await catalogs.of(other)
    assert store.lookups == [TENANT, other, TENANT]
    caches.forget_all()  # the LISTEN connection came back: anything may have changed
    await catalogs.of(other)
    assert store.lookups == [TENANT, other, TENANT, other]


async def test_concurrent_readers_share_one_lookup_and_a_forgotten_one_is_not_kept(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = CountingStore()
    store.gate = trio.Event()
    catalogs = Catalogs(store.event_catalog)
    got: list[Catalog] = []

    async def read() -> None:
        got.append(await catalogs.of(TENANT))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        catalogs.forget(TENANT)  # a change while the lookup is under way
        store.gate.set()
    assert len(got) == 3
    assert store.lookups == [TENANT]  # the three readers shared one lookup
    store.gate = None
    await catalogs.of(TENANT)  # its answer, read before the change, was not kept
    assert store.lookups == [TENANT, TENANT]
    await catalogs.of(TENANT)  # this one was
    assert store.lookups == [TENANT, TENANT]


def test_the_export_moves_a_types_references_into_its_component() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    doc = catalog_document(str(TENANT), [EventType(
        name="order.placed", description="", schema={"$id": "https://x/o.json", **ORDER},
        created_at=now, updated_at=now,
    )])  # fmt: skip
    component = doc["components"]["schemas"]["EventType_order.placed"]
    assert "$id" not in component
    total = component["properties"]["order"]["properties"]["total"]
    assert total == {"$ref": "#/components/schemas/EventType_order.placed/$defs/money"}
    assert doc["webhooks"]["order.placed"]["post"]["summary"] == "An event of type order.placed"


async def test_the_api_forgets_its_own_changes_at_once(mock_clock: trio.testing.MockClock) -> None:
    """Over the in-memory store (no NOTIFY): a PUT, a DELETE and a PATCH of the tenant apply to
    the next event in this process without waiting for the cache's TTL."""
    store = MemoryApiStore()
    await store.create_tenant("a", hash_api_key("key-a"))
    app = create_app(store, parse_config({"workers": {"webhook": {}}}, env={}),
                     {"webhook": RecordingAdapter("webhook")})  # fmt: skip
    client = app.test_client()
    auth = {"Authorization": "Bearer key-a"}

    async def post(event_type: str, payload: dict[str, Any]) -> int:
        resp = await client.post(
            "/v1/events", json={"type": event_type, "payload": payload}, headers=auth
        )
        return resp.status_code

    assert await post("order.placed", {}) == 202  # the empty catalog is cached now
    put = await client.put("/v1/event-types/order.placed", json={"schema": ORDER}, headers=auth)
    assert put.status_code == 201
    assert await post("order.placed", {}) == 422
    assert (await client.delete("/v1/event-types/order.placed", headers=auth)).status_code == 204
    assert await post("order.placed", {}) == 202
    patch = await client.patch("/v1/tenant", json={"strict_event_types": True}, headers=auth)
    assert (await patch.get_json()) == {"id": str(next(iter(store.tenants.values()))),
                                        "strict_event_types": True}  # fmt: skip
    assert await post("order.placed", {}) == 422


async def test_a_rebuilt_catalog_compiles_only_the_types_that_changed(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Every TTL expiry and every change reads the catalog again: a type whose schema did not
    change keeps its validator (compiling is synchronous, on the event loop)."""
    store = CountingStore()
    store.catalogs[TENANT] = StoredCatalog(False, {"a": ORDER, "b": {"type": "object"}})
    catalogs = Catalogs(store.event_catalog)
    first = await catalogs.of(TENANT)
    await trio.sleep(CATALOG_CACHE_SECONDS)  # expired: read again, nothing changed
    again = await catalogs.of(TENANT)
    assert store.lookups == [TENANT, TENANT]
    assert again.validators["a"] is first.validators["a"]
    assert again.validators["b"] is first.validators["b"]
    store.catalogs[TENANT] = StoredCatalog(False, {"a": ORDER, "b": {"type": "array"}})
    catalogs.forget(TENANT)  # what the NOTIFY on notifier_catalogs does
    changed = await catalogs.of(TENANT)
    assert changed.validators["a"] is first.validators["a"]
    assert changed.validators["b"] is not first.validators["b"]
    changed.check("b", [])


def api_app(store: MemoryApiStore) -> Any:
    return create_app(store, parse_config({"workers": {"webhook": {}}}, env={}),
                      {"webhook": RecordingAdapter("webhook")})  # fmt: skip


async def test_the_api_refuses_a_schema_whose_check_is_unbounded(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = MemoryApiStore()
    await store.create_tenant("a", hash_api_key("key-a"))
    client = api_app(store).test_client()
    auth = {"Authorization": "Bearer key-a"}
    for name, schema in HOSTILE.items():
        resp = await client.put(f"/v1/event-types/{name}", json={"schema": schema}, headers=auth)
        assert resp.status_code == 422
        body = await resp.get_json()
        assert body["error"]["code"] == "invalid_schema", body
        assert ("recursive" if name == "recursive-anyOf" else "nodes with every $ref inlined") in (
            body["error"]["message"]
        )
    assert store.event_types == {}
    shared = await client.put("/v1/event-types/order.placed", json={"schema": ORDER}, headers=auth)
    assert shared.status_code == 201


async def test_a_tenants_schemas_are_bounded_in_all(mock_clock: trio.testing.MockClock) -> None:
    store = MemoryApiStore()
    await store.create_tenant("a", hash_api_key("key-a"))
    client = api_app(store).test_client()
    auth = {"Authorization": "Bearer key-a"}
    schema = {"description": "x" * 60_000}
    fit = MAX_CATALOG_BYTES // len(msgspec.json.encode(schema))
    for i in range(fit):
        put = await client.put(f"/v1/event-types/t{i}", json={"schema": schema}, headers=auth)
        assert put.status_code == 201
    resp = await client.put("/v1/event-types/one.more", json={"schema": schema}, headers=auth)
    assert resp.status_code == 422
    body = await resp.get_json()
    assert body["error"]["code"] == "catalog_too_large"
    assert f"at most {MAX_CATALOG_BYTES} in all" in body["error"]["message"]
    assert len(store.event_types) == fit
    # Replacing a type counts its new schema instead of its old one.
    put = await client.put("/v1/event-types/t0", json={"schema": {}}, headers=auth)
    assert put.status_code == 200
    resp = await client.put("/v1/event-types/one.more", json={"schema": schema}, headers=auth)
    assert resp.status_code == 201
