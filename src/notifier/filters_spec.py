"""The payload filter language described for others (notifier.filters is the language itself):
its grammar as JSON Schema, for the OpenAPI document, and the costliest filter its limits allow,
for the tests and bench/filters.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from notifier.filters import (
    LIST_OPS,
    MAX_CONDITIONS,
    MAX_DEPTH,
    MAX_FILTER_BYTES,
    MAX_INDEX,
    MAX_INTEGER,
    MAX_PATH_STEPS,
    MAX_VALUES,
    ORDER_OPS,
    SCALAR_OPS,
    Filter,
    parse,
)

# -- JSON Schema ---------------------------------------------------------------------------------


def json_schema(ref: str, no_nul: str) -> dict[str, Any]:
    """The grammar as JSON Schema (the OpenAPI document's component at ``ref``, which it names
    for the filters inside a combinator); ``no_nul`` is the pattern of a text without NUL. The
    limits on the whole filter (conditions, nesting, bytes) are told in its description: JSON
    Schema bounds one level at a time."""
    text = {"type": "string", "pattern": no_nul}
    number = {"type": "number", "minimum": -MAX_INTEGER - 1, "maximum": MAX_INTEGER}
    scalar = {"anyOf": [{"type": "null"}, {"type": "boolean"}, number, text]}
    path = {
        "type": "array", "minItems": 1, "maxItems": MAX_PATH_STEPS,
        "description": "Keys (strings) and array indexes (integers) from the payload down.",
        "items": {"anyOf": [text, {"type": "integer", "minimum": 0, "maximum": MAX_INDEX}]},
    }  # fmt: skip

    def condition(ops: Sequence[str], value: dict[str, Any] | None) -> dict[str, Any]:
        properties: dict[str, Any] = {"path": path, "op": {"enum": list(ops)}}
        if value is not None:
            properties["value"] = value
        return {
            "type": "object", "properties": properties, "additionalProperties": False,
            "required": ["path", "op"] + (["value"] if value is not None else []),
        }  # fmt: skip

    def combinator(key: str, inner: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "properties": {key: inner}, "required": [key],
                "additionalProperties": False}  # fmt: skip

    filters = {"type": "array", "minItems": 1, "maxItems": MAX_CONDITIONS, "items": {"$ref": ref}}
    values = {"type": "array", "minItems": 1, "maxItems": MAX_VALUES, "items": scalar}
    return {
        "description": (
            'A payload filter (README "Payload filters"): a condition `{path, op, value}` or '
            "`{all: [...]}`, `{any: [...]}`, `{not: {...}}`. A condition on a missing path is "
            "false; comparing values of different kinds is false for eq/in/lt/lte/gt/gte and "
            f"true for ne/nin. At most {MAX_CONDITIONS} conditions, {MAX_DEPTH} levels of "
            f"nesting and {MAX_FILTER_BYTES} bytes of JSON in one filter."
        ),
        "anyOf": [
            condition(SCALAR_OPS, scalar),
            condition(LIST_OPS, values),
            condition(ORDER_OPS, {"anyOf": [number, text]}),
            condition(["exists"], None),
            combinator("all", filters),
            combinator("any", filters),
            combinator("not", {"$ref": ref}),
        ],
    }


# -- the costliest filter ------------------------------------------------------------------------


def largest_filter() -> tuple[Filter, dict[str, Any]]:
    """A filter at the limits at once, and a payload that passes it only after every one of its
    conditions has been evaluated in full: ``MAX_CONDITIONS`` ``nin`` conditions on paths of
    ``MAX_PATH_STEPS`` steps, each with as many values as ``MAX_FILTER_BYTES`` leaves room for
    (none of them the payload's), under ``all`` nested to ``MAX_DEPTH`` levels. What a filter
    can cost at fan-out is bounded by this one's (bench/filters.py measures it)."""
    keys = [chr(ord("a") + i) for i in range(MAX_PATH_STEPS)]
    payload: Any = -1
    for key in reversed(keys):
        payload = {key: payload}
    levels = MAX_DEPTH - 1  # `all`s; the innermost one's conditions are at MAX_DEPTH
    outer = 2  # conditions beside each inner `all`

    def build(values: int) -> Filter:
        def cond() -> Filter:
            return {"path": list(keys), "op": "nin", "value": list(range(values))}

        inner = MAX_CONDITIONS - outer * (levels - 1)
        node: Filter = {"all": [cond() for _ in range(inner)]}
        for _ in range(levels - 1):
            node = {"all": [*(cond() for _ in range(outer)), node]}
        return node

    values = MAX_VALUES
    while len(msgspec.json.encode(build(values))) > MAX_FILTER_BYTES:
        values -= 1
    return parse(build(values)), payload
