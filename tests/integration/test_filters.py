"""Payload filters on the real Postgres: the compiled jsonpath gives every case of the shared table
(tests/filter_cases.py) the answer the Python evaluator gives, and so does the fan-out of an event
posted through the API, addressed or not; what a channel stores (``filter``, ``filter_path``)
follows the API's create, change and clear; a bad filter is a 422 that writes nothing.

The ingest role runs on the shared database of the API's tests (tests/integration/test_api.py),
each test with tenants of its own."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from notifier import filters, filters_spec
from tests.filter_cases import CASES, PAYLOAD, c
from tests.integration.conftest import sql
from tests.integration.test_api import (
    Api,
    api_db,
    make_channel,
    open_api,
    post_event,
    refused,
)

__all__ = ["api_db"]  # the fixture, shared with the API's tests


@pytest.fixture
async def api(api_db: str) -> AsyncIterator[Api]:
    async with open_api(api_db) as running:
        yield running


async def test_postgres_gives_each_case_the_answer_of_the_python_evaluator(api: Api) -> None:
    paths = [filters.to_jsonpath(flt) for _, flt, _ in CASES]
    largest, passing = filters_spec.largest_filter()
    rows = await sql(
        api.db,
        "SELECT f.i, $1::jsonb @@ f.p::jsonpath AS passes, $3::jsonb @@ $4::jsonpath AS largest "
        "FROM unnest($2::text[]) WITH ORDINALITY AS f(p, i) ORDER BY f.i",
        json.dumps(PAYLOAD), paths, json.dumps(passing), filters.to_jsonpath(largest),
    )  # fmt: skip
    got = {name: row["passes"] for (name, _, _), row in zip(CASES, rows, strict=True)}
    want = {name: passes for name, _, passes in CASES}
    assert got == want
    assert {name: filters.matches(flt, PAYLOAD) for name, flt, _ in CASES} == want
    assert rows[0]["largest"] is True


async def test_an_event_fans_out_to_the_channels_whose_filter_it_passes(api: Api) -> None:
    """One channel per case, each through the API; the event goes to those whose filter it
    passes (and to tenant A's channel without a filter), addressed by id or not."""
    names = {api.a_channel["id"]: "unfiltered"}
    for name, flt, _ in CASES:
        made = await make_channel(api.a, name=name[:200], filter=flt)
        assert made["filter"] == flt
        names[made["id"]] = name[:200]
    want = {name[:200] for name, _, passes in CASES if passes} | {"unfiltered"}

    event = await post_event(api.a, payload=PAYLOAD)
    assert {names[d["channel_id"]] for d in event["deliveries"]} == want
    in_db = await sql(
        api.db,
        "SELECT d.channel_id FROM deliveries d JOIN outbox o ON o.delivery_id = d.id "
        "WHERE d.event_id = $1",
        uuid.UUID(event["id"]),
    )
    assert sorted(names[str(r["channel_id"])] for r in in_db) == sorted(want)

    ids = list(names)
    got: set[str] = set()
    for start in range(0, len(ids), 100):  # at most 100 channel ids an event
        addressed = await post_event(api.a, payload=PAYLOAD, channel_ids=ids[start : start + 100])
        got |= {names[d["channel_id"]] for d in addressed["deliveries"]}
    assert got == want


async def stored_filter(api: Api, channel_id: str) -> tuple[Any, str | None]:
    [row] = await sql(
        api.db, "SELECT filter, filter_path::text AS path FROM channels WHERE id = $1",
        uuid.UUID(channel_id),
    )  # fmt: skip
    return (json.loads(row["filter"]) if row["filter"] is not None else None), row["path"]


async def test_a_channel_stores_its_filter_and_jsonpath_and_clears_both(api: Api) -> None:
    flt = {"any": [c("tier", "eq", "gold"), c(["total"], "gte", 100)]}
    made = await make_channel(api.a, filter=flt)
    assert await stored_filter(api, made["id"]) == (flt, await compiled(api, flt))
    path = f"/v1/channels/{made['id']}"
    assert (await api.a.get(path)).json()["filter"] == flt

    assert (await post_event(api.a, payload={"tier": "gold"}))["deliveries"]
    other = c("tier", "eq", "silver")
    resp = await api.a.patch(path, json={"filter": other})
    assert resp.status_code == 200, resp.text
    assert await stored_filter(api, made["id"]) == (other, await compiled(api, other))
    gold = await post_event(api.a, payload={"tier": "gold"})
    assert {d["channel_id"] for d in gold["deliveries"]} == {api.a_channel["id"]}

    resp = await api.a.patch(path, json={"filter": None})
    assert resp.json()["filter"] is None
    assert await stored_filter(api, made["id"]) == (None, None)
    gold = await post_event(api.a, payload={"tier": "gold"})
    assert len(gold["deliveries"]) == 2


async def compiled(api: Api, flt: dict[str, Any]) -> str:
    """The jsonpath of ``flt`` as Postgres writes it back."""
    [row] = await sql(api.db, "SELECT $1::jsonpath::text AS p", filters.to_jsonpath(flt))
    text: str = row["p"]
    return text


async def test_a_bad_filter_is_a_422_naming_its_place_and_writes_nothing(api: Api) -> None:
    webhook = {"type": "webhook", "config": {"url": "https://hooks.example.com/in"}}
    too_many = {"any": [c("a", "exists")] * 21}
    for flt, message in [
        (too_many, "filter.any[20]: more than 20 conditions in the filter"),
        ({"path": ["a"], "op": "in", "value": list(range(51))},
         "filter.value: an array of 1 to 50 values is expected"),
        ({"not": {"path": "$.a", "op": "exists"}},
         "filter.not.path: an array of 1 to 16 steps is expected"),
        ({"path": ["a"], "op": "eq", "value": "x\")) || true || ((\"", "extra": 1},
         "filter.extra: unknown key"),
    ]:  # fmt: skip
        await refused(
            api, 422, "validation_error", message, method="POST", path="/v1/channels",
            json={**webhook, "filter": flt},
        )  # fmt: skip
        await refused(
            api, 422, "validation_error", message, method="PATCH",
            path=f"/v1/channels/{api.a_channel['id']}", json={"filter": flt},
        )  # fmt: skip
    assert await stored_filter(api, api.a_channel["id"]) == (None, None)


async def test_any_character_but_nul_and_lone_surrogates_is_a_plain_key_and_value(
    api: Api,
) -> None:
    """Every control character, newlines, non-ASCII and past the BMP, as a filter's key and
    value: stored, compiled, and matched by exactly the payload holding that key and value.
    NUL and a lone surrogate, which Postgres cannot hold, are refused writing nothing."""
    texts = {f"U+{c:04X}": chr(c) for c in [*range(1, 0x20), 0x7F]} | {
        "e-acute": "é", "line-separator": "\u2028", "byte-order-mark": "\ufeff",
        "emoji": "\U0001f600", "quote-backslash": '"\\', "dollar-at": "$@", "crlf": "\r\n",
    }  # fmt: skip
    made = {}
    for name, t in texts.items():
        channel = await make_channel(api.a, name=name, filter=c(f"k{t}", "eq", f"v{t}"))
        made[channel["id"]] = name
    passing = await post_event(api.a, payload={f"k{t}": f"v{t}" for t in texts.values()})
    got = {made.get(d["channel_id"]) for d in passing["deliveries"]}
    assert got == {*texts, None}  # None: tenant A's channel without a filter
    failing = await post_event(api.a, payload={f"k{t}": f"w{t}" for t in texts.values()})
    assert [d["channel_id"] for d in failing["deliveries"]] == [api.a_channel["id"]]

    for raw in ('"k\\u0000"', '"k\\ud800"'):  # JSON escapes, as a client sends them
        body = '{"type": "webhook", "config": {"url": "https://hooks.example.com/in"}, '
        body += f'"filter": {{"path": [{raw}], "op": "exists"}}}}'
        await refused(
            api, 422, "validation_error", "filter.path[0]", method="POST", path="/v1/channels",
            content=body.encode(), headers={"content-type": "application/json"},
        )  # fmt: skip
