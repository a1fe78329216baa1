"""Payload filters of channels: a small JSON language of conditions on an event's payload,
checked at fan-out beside the channel's type patterns (README "Payload filters",
docs/architecture.md §3).

A filter is a JSON object, either a condition::

    {"path": ["order", "lines", 0, "sku"], "op": "eq", "value": "A-1"}

or a combinator of filters: ``{"all": [...]}``, ``{"any": [...]}``, ``{"not": {...}}``.

A path is a JSON array of steps: a string is an object's key (any text but NUL: dots, quotes,
``$`` and unicode are plain characters of the key), an integer 0..``MAX_INDEX`` an array's
index. The operators: ``eq``/``ne`` a scalar (string, number, boolean, null); ``in``/``nin``
an array of 1..``MAX_VALUES`` scalars; ``lt``/``lte``/``gt``/``gte`` a number or a string
(strings in code-point order); ``exists`` takes no value.

Every filter is true or false for every payload, never an error: a condition whose path is
missing (a key absent, an index past the end, a step into a value of another kind) is false,
whatever its operator; ``eq``/``in``/``lt``… on values of different kinds (the string ``"1"``
and the number ``1``, ``true`` and ``1``) are false, and ``ne``/``nin`` true (the path exists
and its value is none of those given). ``not`` negates, so ``{"not": {"path": p, "op":
"exists"}}`` is how a filter asks for an absent path.

``parse`` checks a filter against the grammar and the limits, which bound what a filter costs
at fan-out; ``to_jsonpath`` compiles a parsed filter into the Postgres ``jsonpath`` predicate the
fan-out evaluates (``payload @@ filter_path``), built only from the parsed pieces, each key and
string quoted; ``matches`` is the same semantics in Python, for the in-memory fakes (a test puts
the same table of cases to both).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from notifier.errors import InvalidInput

MAX_CONDITIONS = 20  # conditions (leaves) in one filter
MAX_DEPTH = 8  # levels of filters: a lone condition is 1, {"not": condition} 2, …
MAX_VALUES = 50  # values of one in/nin
MAX_PATH_STEPS = 16  # steps of one path
MAX_INDEX = 9999  # the largest array index a path may name
MAX_FILTER_BYTES = 4096  # the filter as compact JSON
MAX_INTEGER = 2**63 - 1  # integers within 64 bits, as the payload's

SCALAR_OPS = ("eq", "ne")
LIST_OPS = ("in", "nin")
ORDER_OPS = ("lt", "lte", "gt", "gte")
OPS = (*SCALAR_OPS, *LIST_OPS, "exists", *ORDER_OPS)
_JSONPATH_ORDER = {"lt": "<", "lte": "<=", "gt": ">", "gte": ">="}

Filter = dict[str, Any]


class FilterError(InvalidInput):
    """A filter refused: ``where`` is the place inside the filter (``all[2].path[1]``, "" for
    the filter itself), ``problem`` what is wrong there."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where or 'filter'}: {problem}")
        self.where, self.problem = where, problem

    def at(self, field: str) -> str:
        """The message with the place given from the body's ``field`` (``filter.all[2].op``)."""
        sep = "" if not self.where or self.where.startswith("[") else "."
        return f"{field}{sep}{self.where}: {self.problem}"


# -- checking ------------------------------------------------------------------------------------


def parse(raw: Any) -> Filter:
    """``raw`` (decoded JSON) as a filter, checked against the grammar and every limit;
    ``FilterError`` naming the place of the first problem otherwise. What comes back is ``raw``
    itself, what is stored and shown (a path's index written ``3.0`` made ``3``)."""
    counter = _Counter()
    _check(raw, "", 1, counter)
    size = len(msgspec.json.encode(raw))
    if size > MAX_FILTER_BYTES:
        raise FilterError("", f"{size} bytes of JSON, more than {MAX_FILTER_BYTES}")
    assert isinstance(raw, dict)
    return raw


class _Counter:
    conditions = 0


def _join(where: str, step: str | int) -> str:
    if isinstance(step, int):
        return f"{where}[{step}]"
    return f"{where}.{step}" if where else step


def _unknown(key: str) -> str:
    """An unknown key as a message names it: as it is if it is a short plain word, else as a
    JSON string cut to 40 characters (a message never carries a long or unprintable text)."""
    if key.isidentifier() and len(key) <= 40:
        return key
    quoted = json.dumps(key)
    return quoted if len(quoted) <= 40 else quoted[:39] + '…"'


def _check(node: Any, where: str, depth: int, counter: _Counter) -> None:
    if depth > MAX_DEPTH:
        raise FilterError(where, f"nested deeper than {MAX_DEPTH} levels of filters")
    if not isinstance(node, dict):
        got = "an array" if isinstance(node, list) else _kind(node) or "something else"
        raise FilterError(where, f"a filter is a JSON object, got {got}")
    combinators = [k for k in ("all", "any", "not") if k in node]
    if combinators:
        key = combinators[0]
        if extra := sorted(k for k in node if k != key):
            raise FilterError(_join(where, _unknown(extra[0])), f"unknown key beside {key!r}")
        inner = node[key]
        at = _join(where, key)
        if key == "not":
            _check(inner, at, depth + 1, counter)
            return
        if not isinstance(inner, list) or not inner:
            raise FilterError(at, "a non-empty array of filters is expected")
        for i, item in enumerate(inner):
            _check(item, _join(at, i), depth + 1, counter)
        return
    _check_condition(node, where, counter)


def _check_condition(node: dict[str, Any], where: str, counter: _Counter) -> None:
    if extra := sorted(k for k in node if k not in ("path", "op", "value")):
        raise FilterError(
            _join(where, _unknown(extra[0])),
            "unknown key (a filter is a condition {path, op, value} or one of all, any, not)",
        )
    counter.conditions += 1
    if counter.conditions > MAX_CONDITIONS:
        raise FilterError(where, f"more than {MAX_CONDITIONS} conditions in the filter")
    for key in ("path", "op"):
        if key not in node:
            raise FilterError(_join(where, key), "missing required key")
    _check_path(node["path"], _join(where, "path"))
    op = node["op"]
    at_op = _join(where, "op")
    if op not in OPS:
        allowed = ", ".join(f'"{o}"' for o in OPS)
        raise FilterError(at_op, f"expected one of {allowed}, got {json.dumps(op)[:50]}")
    at_value = _join(where, "value")
    if op == "exists":
        if "value" in node:
            raise FilterError(at_value, '"exists" takes no value')
        return
    if "value" not in node:
        raise FilterError(at_value, "missing required key")
    value = node["value"]
    if op in SCALAR_OPS:
        _check_scalar(value, at_value)
    elif op in LIST_OPS:
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_VALUES:
            raise FilterError(at_value, f"an array of 1 to {MAX_VALUES} values is expected")
        for i, item in enumerate(value):
            _check_scalar(item, _join(at_value, i))
    else:
        _check_scalar(value, at_value)
        if _kind(value) not in ("number", "string"):
            raise FilterError(at_value, f'"{op}" compares a number or a string')


def _check_path(path: Any, where: str) -> None:
    if not isinstance(path, list) or not 1 <= len(path) <= MAX_PATH_STEPS:
        raise FilterError(where, f"an array of 1 to {MAX_PATH_STEPS} steps is expected")
    for i, step in enumerate(path):
        at = _join(where, i)
        if isinstance(step, str):
            _check_text(step, at)
        elif _kind(step) == "number" and (isinstance(step, int) or float(step).is_integer()):
            if not 0 <= step <= MAX_INDEX:
                raise FilterError(at, f"an array index is 0 to {MAX_INDEX}")
            path[i] = int(step)  # 3.0 is the integer 3, as JSON Schema counts it
        else:
            raise FilterError(at, "a step is a key (string) or an array index (integer)")


def _check_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise FilterError(where, "NUL is not allowed in a string")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise FilterError(where, "a lone surrogate is not allowed in a string")


def _check_scalar(value: Any, where: str) -> None:
    kind = _kind(value)
    if kind is None:
        raise FilterError(where, "a scalar is expected (string, number, boolean or null)")
    if kind == "string":
        _check_text(value, where)
    elif kind == "number":
        if isinstance(value, int) and not -MAX_INTEGER - 1 <= value <= MAX_INTEGER:
            raise FilterError(where, "an integer within 64 bits is expected")
        if isinstance(value, float) and not math.isfinite(value):
            raise FilterError(where, "a finite number is expected")


def _kind(value: Any) -> str | None:
    """The JSON kind of a scalar (``None`` for an object, an array or anything else)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


# -- Postgres ------------------------------------------------------------------------------------


def to_jsonpath(flt: Filter) -> str:
    """The strict-mode ``jsonpath`` predicate of a filter ``parse`` accepted.

    Each condition becomes ``exists($ ? (exists(<path> ? (<test of @>))))``: inside a filter
    expression a missing key or a comparison of different kinds is "unknown" and drops the
    item, so the condition is plainly false instead of unknown (or an error) and ``!`` negates
    it as the language says. Keys and strings are JSON string literals with every non-ASCII
    character escaped (``\\uXXXX``), numbers are written by ``_literal``: nothing of the filter
    reaches the text unquoted."""
    return "strict " + _predicate(flt)


def _predicate(node: Filter) -> str:
    if "all" in node:
        return "(" + " && ".join(_predicate(f) for f in node["all"]) + ")"
    if "any" in node:
        return "(" + " || ".join(_predicate(f) for f in node["any"]) + ")"
    if "not" in node:
        return f"!({_predicate(node['not'])})"
    path = "@" + "".join(
        f"[{step}]" if isinstance(step, int) else "." + _string(step) for step in node["path"]
    )
    op = node["op"]
    if op == "exists":
        return f"exists($ ? (exists({path})))"
    if op in ORDER_OPS:
        test = f"@ {_JSONPATH_ORDER[op]} {_literal(node['value'])}"
    else:
        values = node["value"] if op in LIST_OPS else [node["value"]]
        test = " || ".join(f"@ == {_literal(v)}" for v in values)
    # The value at the path, kept if it passes the test; the path is written once.
    found = f"exists($ ? (exists({path} ? ({test}))))"
    if op in ("ne", "nin"):  # present, and none of the values
        return f"(exists($ ? (exists({path}))) && !{found})"
    return found


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)


def _literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # finite: digits, '.', 'e', sign
    assert isinstance(value, str)
    return _string(value)


# -- Python --------------------------------------------------------------------------------------


def matches(flt: Mapping[str, Any], payload: Any) -> bool:
    """Whether ``payload`` passes the filter (one ``parse`` accepted): the semantics of
    ``to_jsonpath`` as Postgres evaluates it, in Python."""
    if "all" in flt:
        return all(matches(f, payload) for f in flt["all"])
    if "any" in flt:
        return any(matches(f, payload) for f in flt["any"])
    if "not" in flt:
        return not matches(flt["not"], payload)
    found, value = _lookup(payload, flt["path"])
    op = flt["op"]
    if op == "exists" or not found:
        return found
    if op in ORDER_OPS:
        return _ordered(op, value, flt["value"])
    values = flt["value"] if op in LIST_OPS else [flt["value"]]
    equal = any(_same(value, v) for v in values)
    return equal if op in ("eq", "in") else not equal


def _lookup(payload: Any, path: Sequence[str | int]) -> tuple[bool, Any]:
    at = payload
    for step in path:
        if isinstance(step, int):
            if not isinstance(at, list) or step >= len(at):
                return False, None
        elif not isinstance(at, dict) or step not in at:
            return False, None
        at = at[step]
    return True, at


def _same(a: Any, b: Any) -> bool:
    kind = _kind(a)
    return kind is not None and kind == _kind(b) and bool(a == b)


def _ordered(op: str, a: Any, b: Any) -> bool:
    kind = _kind(a)
    if kind not in ("number", "string") or kind != _kind(b):
        return False
    if op == "lt":
        return bool(a < b)
    if op == "lte":
        return bool(a <= b)
    if op == "gt":
        return bool(a > b)
    return bool(a >= b)
