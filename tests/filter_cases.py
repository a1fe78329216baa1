"""One table of payload-filter cases (``notifier.filters``): a payload, and filters with whether
it passes each. The unit tests put it to the Python evaluator and to the in-memory fan-out, the
integration tests to Postgres (``payload @@ filter_path``) and to its fan-out through the API:
every one must give the answer written here."""

from __future__ import annotations

from typing import Any

# Keys a path must take as plain characters: dots, quotes, backslashes, jsonpath's own signs,
# unicode beyond the BMP, an empty key, a newline.
HOSTILE_KEYS = [
    "a.b", 'q"uote', "back\\slash", "$", "@", "*", "", "n\nl", "ключ", "emoji😀",
    '") || true || ("', "'single'", "x)) || exists($", "\\u0041",
]  # fmt: skip

PAYLOAD: dict[str, Any] = {
    "amount": 120,
    "price": 9.5,
    "currency": "EUR",
    "paid": True,
    "note": None,
    "count": "5",
    "when": "2024-05-01T10:00:00Z",
    "big": 9007199254740993,  # past a double's exact integers
    "neg": -3,
    "zero": 0,
    "tags": ["vip", "new"],
    "customer": {"tier": "gold", "address": {"country": "DE"}},
    "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-2", "qty": 1}],
    **{key: f"value of {key}" for key in HOSTILE_KEYS},
}


def c(path: list[str | int] | str, op: str, *value: Any) -> dict[str, Any]:
    """A condition; a path of one key may be given as that key."""
    steps = [path] if isinstance(path, str) else path
    return {"path": steps, "op": op, **({"value": value[0]} if value else {})}


EUR = c("currency", "eq", "EUR")
USD = c("currency", "eq", "USD")

# (name, filter, whether PAYLOAD passes it)
CASES: list[tuple[str, dict[str, Any], bool]] = [
    # eq / ne: kinds must agree; a missing path is false for both
    ("eq number", c("amount", "eq", 120), True),
    ("eq number written as a decimal", c("amount", "eq", 120.0), True),
    ("eq other number", c("amount", "eq", 121), False),
    ("eq number vs string", c("amount", "eq", "120"), False),
    ("ne number vs string", c("amount", "ne", "120"), True),
    ("ne same number", c("amount", "ne", 120), False),
    ("eq decimal", c("price", "eq", 9.5), True),
    ("eq string", EUR, True),
    ("eq string, other case", c("currency", "eq", "eur"), False),
    ("eq true", c("paid", "eq", True), True),
    ("eq boolean vs 1", c("paid", "eq", 1), False),
    ("ne boolean vs 1", c("paid", "ne", 1), True),
    ("eq 0 vs false", c("zero", "eq", False), False),
    ("eq null", c("note", "eq", None), True),
    ("ne null vs null", c("note", "ne", None), False),
    ("ne null vs number", c("note", "ne", 1), True),
    ("eq null on a missing key", c("missing", "eq", None), False),
    ("ne on a missing key", c("missing", "ne", 1), False),
    ("eq negative", c("neg", "eq", -3), True),
    ("eq big integer exactly", c("big", "eq", 9007199254740993), True),
    ("eq big integer off by one", c("big", "eq", 9007199254740992), False),
    # paths: objects, arrays, steps into the wrong kind
    ("nested keys", c(["customer", "address", "country"], "eq", "DE"), True),
    ("array index", c(["lines", 1, "sku"], "eq", "B-2"), True),
    ("array index past the end", c(["lines", 2, "sku"], "exists"), False),
    ("array index 0 of tags", c(["tags", 0], "eq", "vip"), True),
    ("key step into an array", c(["lines", "0"], "exists"), False),
    ("index step into an object", c(["customer", 0], "exists"), False),
    ("step into a string", c(["customer", "tier", "x"], "exists"), False),
    ("index into a string", c(["currency", 0], "exists"), False),
    ("eq array vs scalar", c("tags", "eq", "vip"), False),
    ("ne array vs scalar", c("tags", "ne", "vip"), True),
    ("eq object vs scalar", c("customer", "eq", "gold"), False),
    ("a dotted path is one key", c(["a", "b"], "exists"), False),
    # exists
    ("exists a null", c("note", "exists"), True),
    ("exists an object", c("customer", "exists"), True),
    ("exists a missing key", c("missing", "exists"), False),
    ("not exists a missing key", {"not": c("missing", "exists")}, True),
    ("not exists a present key", {"not": c("note", "exists")}, False),
    # in / nin
    ("in", c("currency", "in", ["USD", "EUR"]), True),
    ("in, not there", c("currency", "in", ["USD", "GBP"]), False),
    ("nin", c("currency", "nin", ["USD", "GBP"]), True),
    ("nin, there", c("currency", "nin", ["USD", "EUR"]), False),
    ("nin on a missing key", c("missing", "nin", ["x"]), False),
    ("in of mixed kinds", c("amount", "in", ["120", 120, None]), True),
    ("in, only other kinds", c("amount", "in", ["120", True]), False),
    ("nin, only other kinds", c("amount", "nin", ["120", True]), True),
    ("in null", c("note", "in", [None]), True),
    # order: numbers with numbers, strings with strings (code points), else false
    ("lt", c("amount", "lt", 200), True),
    ("gt", c("amount", "gt", 200), False),
    ("lte equal", c("amount", "lte", 120), True),
    ("lt equal", c("amount", "lt", 120), False),
    ("gte decimal", c("price", "gte", 9.5), True),
    ("gt decimal", c("price", "gt", 9.49), True),
    ("lt negative", c("neg", "lt", -2.5), True),
    ("lt string vs number", c("count", "lt", 10), False),
    ("gt string vs number", c("count", "gt", 1), False),
    ("gt strings in code-point order", c("count", "gt", "10"), True),
    ("lt timestamps as text", c("when", "lt", "2025-01-01"), True),
    ("gte timestamps as text", c("when", "gte", "2024-05-02"), False),
    ("gt cyrillic", c("ключ", "gt", "value of ж"), True),
    ("lt cyrillic", c("ключ", "lt", "value of я"), True),
    ("gt cyrillic, later letter", c("ключ", "gt", "value of я"), False),
    ("gt past the BMP", c("emoji😀", "gte", "value of emoji"), True),
    ("lt boolean vs number", c("paid", "lt", 2), False),
    ("gt null vs number", c("note", "gt", -1), False),
    ("lt array vs number", c("tags", "lt", 1), False),
    ("lt on a missing key", c("missing", "lt", 1), False),
    ("not lt of other kinds", {"not": c("count", "lt", 10)}, True),
    # combinators
    ("all true", {"all": [EUR, c("amount", "gte", 100)]}, True),
    ("all, one false", {"all": [EUR, USD]}, False),
    ("any, one true", {"any": [USD, EUR]}, True),
    ("any, none true", {"any": [USD, c("missing", "exists")]}, False),
    ("not false", {"not": USD}, True),
    ("not not", {"not": {"not": EUR}}, True),
    ("not of a missing eq", {"not": c("missing", "eq", 1)}, True),
    ("nested", {"any": [{"all": [USD, EUR]}, {"not": {"any": [USD, c("paid", "eq", False)]}}]},
     True),
    # hostile keys and values: plain characters, never the language's
    *[(f"key {key!r}", c(key, "eq", f"value of {key}"), True) for key in HOSTILE_KEYS],
    *[(f"key {key!r} not equal", c(key, "eq", "other"), False) for key in HOSTILE_KEYS[:4]],
    ("a value that closes the literal", c("currency", "eq", '" || true || "'), False),
    ("a value that closes the filter", c("currency", "eq", 'EUR")) || exists($ ? (true'), False),
    ("a key that closes the filter", c('x")) || exists($ ? (@', "exists"), False),
    ("a value with a backslash", c("back\\slash", "eq", "value of back\\slash"), True),
    ("an escaped-looking key is literal", c("\\u0041", "exists"), True),
    ("the key A is not \\u0041", c("A", "exists"), False),
]  # fmt: skip
