"""Payload filters (``notifier.filters``): the Python evaluator and the in-memory fan-out give
every case of the shared table its answer (tests/integration/test_filters.py puts the same table
to Postgres); refused filters name the place of the problem; the limits hold; the compiled
jsonpath quotes every key and string; and the HTTP API takes, shows, changes and clears a
channel's filter, on the in-memory store."""

from __future__ import annotations

import copy
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from notifier import filters, filters_spec
from notifier.store.rows import Channel
from notifier.testing import fanout_targets
from tests.filter_cases import CASES, HOSTILE_KEYS, PAYLOAD, c
from tests.unit.test_api_unit import Api, api, error_code

__all__ = ["api"]  # the fixture, shared with the API's unit tests

TENANT = uuid.UUID(int=1)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def channel(name: str, flt: dict[str, Any] | None, **fields: Any) -> Channel:
    return Channel(
        id=uuid.uuid5(uuid.NAMESPACE_OID, name), tenant_id=TENANT, type="webhook", name=name,
        config={}, recipient=None, event_types=["*"], enabled=True, max_attempts=None,
        created_at=NOW, updated_at=NOW, filter=flt, **fields,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("flt", "passes"), [(f, p) for _, f, p in CASES], ids=[n for n, *_ in CASES]
)
def test_the_python_evaluator_gives_each_case_its_answer(flt: dict[str, Any], passes: bool) -> None:
    assert filters.parse(copy.deepcopy(flt)) == flt  # accepted as it is
    assert filters.matches(flt, PAYLOAD) is passes


def test_the_in_memory_fanout_sends_an_event_to_the_channels_whose_filter_it_passes() -> None:
    """One channel per case plus one without a filter; addressed or not, the filter decides."""
    channels = [channel(name, flt) for name, flt, _ in CASES] + [channel("unfiltered", None)]
    want = {name for name, _, passes in CASES if passes} | {"unfiltered"}

    got = fanout_targets(channels, tenant_id=TENANT, event_type="x", recipient=None,
                         payload=PAYLOAD)  # fmt: skip
    assert {ch.name for ch in got} == want

    addressed = fanout_targets(
        channels, tenant_id=TENANT, event_type="x", recipient=None, payload=PAYLOAD,
        channel_ids=[ch.id for ch in channels],
    )  # fmt: skip
    assert {ch.name for ch in addressed} == want


# -- refused filters -----------------------------------------------------------------------------

BAD: list[tuple[Any, str]] = [
    ([], "filter: a filter is a JSON object, got an array"),
    ({}, "path: missing required key"),
    ({"path": ["a"]}, "op: missing required key"),
    ({"path": ["a"], "op": "like", "value": "x"},
     'op: expected one of "eq", "ne", "in", "nin", "exists", "lt", "lte", "gt", "gte", got "like"'),
    ({"path": ["a"], "op": "eq"}, "value: missing required key"),
    ({"path": ["a"], "op": "exists", "value": True}, 'value: "exists" takes no value'),
    ({"path": ["a"], "op": "eq", "value": 1, "extra": 1},
     "extra: unknown key (a filter is a condition {path, op, value} or one of all, any, not)"),
    ({"path": "$.a", "op": "exists"}, "path: an array of 1 to 16 steps is expected"),
    ({"path": [], "op": "exists"}, "path: an array of 1 to 16 steps is expected"),
    ({"path": ["a"] * 17, "op": "exists"}, "path: an array of 1 to 16 steps is expected"),
    ({"path": ["a", -1], "op": "exists"}, "path[1]: an array index is 0 to 9999"),
    ({"path": ["a", 10000], "op": "exists"}, "path[1]: an array index is 0 to 9999"),
    ({"path": ["a", 1.5], "op": "exists"},
     "path[1]: a step is a key (string) or an array index (integer)"),
    ({"path": [True], "op": "exists"},
     "path[0]: a step is a key (string) or an array index (integer)"),
    ({"path": ["a\x00b"], "op": "exists"}, "path[0]: NUL is not allowed in a string"),
    ({"path": ["a"], "op": "eq", "value": {"b": 1}},
     "value: a scalar is expected (string, number, boolean or null)"),
    ({"path": ["a"], "op": "eq", "value": [1]},
     "value: a scalar is expected (string, number, boolean or null)"),
    ({"path": ["a"], "op": "eq", "value": 2**64}, "value: an integer within 64 bits is expected"),
    ({"path": ["a"], "op": "eq", "value": "\ud800"},
     "value: a lone surrogate is not allowed in a string"),
    ({"path": ["a"], "op": "in", "value": []}, "value: an array of 1 to 50 values is expected"),
    ({"path": ["a"], "op": "in", "value": list(range(51))},
     "value: an array of 1 to 50 values is expected"),
    ({"path": ["a"], "op": "nin", "value": 1}, "value: an array of 1 to 50 values is expected"),
    ({"path": ["a"], "op": "in", "value": [1, [2]]},
     "value[1]: a scalar is expected (string, number, boolean or null)"),
    ({"path": ["a"], "op": "lt", "value": True}, 'value: "lt" compares a number or a string'),
    ({"path": ["a"], "op": "gte", "value": None}, 'value: "gte" compares a number or a string'),
    ({"all": []}, "all: a non-empty array of filters is expected"),
    ({"any": {"path": ["a"], "op": "exists"}}, "any: a non-empty array of filters is expected"),
    ({"all": [c("a", "exists")], "any": [c("a", "exists")]}, "any: unknown key beside 'all'"),
    ({"not": c("a", "exists"), "path": ["a"]}, "path: unknown key beside 'not'"),
    ({"all": [c("a", "exists"), {"any": [c("a", "exists"), {"path": ["b"], "op": "eq"}]}]},
     "all[1].any[1].value: missing required key"),
    ({"not": {"not": "x"}}, "not.not: a filter is a JSON object, got string"),
    ({"not": c("a", "exists"), "\n" + "x" * 100: 1},
     '"\\n' + "x" * 36 + "…\": unknown key beside 'not'"),
    ({"any": [c("a", "exists")] * 21}, "any[20]: more than 20 conditions in the filter"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "message"), BAD, ids=[m for _, m in BAD])
def test_a_refused_filter_names_the_place_and_the_problem(raw: Any, message: str) -> None:
    with pytest.raises(filters.FilterError) as caught:
        filters.parse(raw)
    assert str(caught.value) == message


def nested(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = c("a", "exists")
    for _ in range(levels - 1):
        node = {"not": node}
    return node


def test_nesting_is_bounded_at_eight_levels() -> None:
    assert filters.parse(nested(8))
    with pytest.raises(filters.FilterError) as caught:
        filters.parse(nested(9))
    assert str(caught.value) == (
        "not.not.not.not.not.not.not.not: nested deeper than 8 levels of filters"
    )


def test_the_filter_is_bounded_at_4096_bytes_of_json() -> None:
    def sized(size: int) -> dict[str, Any]:
        bare = len(json.dumps(c("", "exists"), separators=(",", ":")))
        return c("k" * (size - bare), "exists")

    assert filters.parse(sized(4096))
    with pytest.raises(filters.FilterError) as caught:
        filters.parse(sized(4097))
    assert str(caught.value) == "filter: 4097 bytes of JSON, more than 4096"


def test_the_largest_filter_is_at_every_limit_and_its_payload_passes_it() -> None:
    flt, payload = filters_spec.largest_filter()
    text = json.dumps(flt, separators=(",", ":"))
    assert filters.MAX_FILTER_BYTES - 100 < len(text) <= filters.MAX_FILTER_BYTES
    assert text.count('"op"') == filters.MAX_CONDITIONS
    assert filters.matches(flt, payload)
    deeper = copy.deepcopy(flt)
    node = deeper
    while any("all" in item for item in node["all"]):
        node = next(item for item in node["all"] if "all" in item)
    node["all"][0] = {"not": node["all"][0]}  # one level more
    with pytest.raises(filters.FilterError, match="nested deeper than 8 levels"):
        filters.parse(deeper)


def test_a_path_index_written_as_a_whole_decimal_is_that_integer() -> None:
    assert filters.parse({"path": ["a", 2.0], "op": "exists"})["path"] == ["a", 2]


def test_every_key_and_string_is_a_quoted_ascii_literal_in_the_jsonpath() -> None:
    """Quotes, backslashes and jsonpath's own signs stay inside their literal; nothing but
    ASCII reaches the text (tests/integration/test_filters.py runs these in Postgres)."""
    for key in HOSTILE_KEYS:
        path = filters.to_jsonpath(c(key, "eq", key))
        assert path.isascii()
        literal = json.dumps(key, ensure_ascii=True)
        assert path == (f"strict exists($ ? (exists(@.{literal} ? (@ == {literal}))))")
    assert filters.to_jsonpath(c(["a", 3], "ne", -1.5)) == (
        'strict (exists($ ? (exists(@."a"[3]))) && !exists($ ? (exists(@."a"[3] ? (@ == -1.5)))))'
    )
    assert filters.to_jsonpath(
        {"any": [c("a", "lt", 1e300), {"not": c("b", "in", [None, True])}]}
    ) == (
        'strict (exists($ ? (exists(@."a" ? (@ < 1e+300)))) || '
        '!(exists($ ? (exists(@."b" ? (@ == null || @ == true))))))'
    )


def test_the_error_message_is_placed_under_the_body_field() -> None:
    error = filters.FilterError("all[2].op", "bad")
    assert error.at("filter") == "filter.all[2].op: bad"
    assert filters.FilterError("[1]", "bad").at("x") == "x[1]: bad"


# -- through the HTTP API, on the in-memory store ------------------------------------------------

ORDERS_IN_EUR = {"all": [c("currency", "eq", "EUR"), c("amount", "gte", 100)]}


async def test_a_channels_filter_is_taken_shown_changed_and_cleared(api: Api) -> None:
    created = await api.channel(filter=ORDERS_IN_EUR)
    assert created["filter"] == ORDERS_IN_EUR
    path = f"/v1/channels/{created['id']}"
    assert (await api.call("GET", path)).body["filter"] == ORDERS_IN_EUR

    other = c("currency", "eq", "USD")
    patched = await api.call("PATCH", path, json={"filter": other})
    assert patched.status == 200, patched.body
    assert patched.body["filter"] == other
    renamed = await api.call("PATCH", path, json={"name": "kept"})
    assert renamed.body["filter"] == other  # not named: kept
    cleared = await api.call("PATCH", path, json={"filter": None})
    assert cleared.body["filter"] is None
    assert (await api.channel())["filter"] is None  # no filter unless given


async def test_an_event_goes_only_to_the_channels_whose_filter_it_passes(api: Api) -> None:
    eur = await api.channel(name="eur", filter=ORDERS_IN_EUR)
    everything = await api.channel(name="all")
    cases = [
        ({"currency": "EUR", "amount": 150}, {eur["id"], everything["id"]}),
        ({"currency": "EUR", "amount": "150"}, {everything["id"]}),  # a string: no match
        ({"currency": "USD", "amount": 150}, {everything["id"]}),
        ({}, {everything["id"]}),  # missing paths: no match
    ]
    for payload, want in cases:
        event = await api.event(payload=payload)
        assert {d["channel_id"] for d in event["deliveries"]} == want, payload
    # addressed by id, the filter still decides
    event = await api.event(payload={"currency": "USD"}, channel_ids=[eur["id"]])
    assert event["deliveries"] == []


@pytest.mark.parametrize(("flt", "message"), [
    ({"path": ["a"], "op": "like", "value": 1},
     'filter.op: expected one of "eq", "ne", "in", "nin", "exists", "lt", "lte", "gt", "gte", '
     'got "like"'),
    ({"all": [c("a", "exists"), {"not": {"path": ["a", -2], "op": "exists"}}]},
     "filter.all[1].not.path[1]: an array index is 0 to 9999"),
    (nested(9), "filter.not.not.not.not.not.not.not.not: nested deeper than 8 levels of filters"),
    ({"path": ["k" * 4100], "op": "exists"}, "filter: 4127 bytes of JSON, more than 4096"),
    ("x", "filter: Expected `object | null`, got `str`"),
])  # fmt: skip
async def test_a_bad_filter_is_a_422_naming_its_place_and_writes_nothing(
    api: Api, flt: Any, message: str
) -> None:
    before = api.rows()
    answer = await api.call("POST", "/v1/channels", json={**api_webhook(), "filter": flt})
    assert (answer.status, error_code(answer)) == (422, "validation_error")
    assert answer.body["error"]["message"] == message
    assert api.rows() == before

    created = await api.channel(filter=ORDERS_IN_EUR)
    path = f"/v1/channels/{created['id']}"
    answer = await api.call("PATCH", path, json={"filter": flt, "name": "not written"})
    assert (answer.status, answer.body["error"]["message"]) == (422, message)
    stored = (await api.call("GET", path)).body
    assert (stored["filter"], stored["name"]) == (ORDERS_IN_EUR, "hook")


def api_webhook() -> dict[str, Any]:
    return {"type": "webhook", "config": {"url": "https://hooks.example.com/in"}}
