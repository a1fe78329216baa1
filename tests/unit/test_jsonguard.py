"""The JSON rules of request bodies (``notifier.ingest.jsonguard``), as a table."""

from __future__ import annotations

import contextlib
import json

import msgspec
import pytest

from notifier.ingest import jsonguard
from notifier.ingest.jsonguard import MAX_DEPTH, JsonRefused, check, depth

NUL = "text must not contain the NUL character"
SURROGATE = "lone UTF-16 surrogate"
DEEP = f"nested deeper than {MAX_DEPTH} levels"


def nested(levels: int, inner: bytes = b"1") -> bytes:
    """``levels`` nested objects around ``inner``: ``{"a":{"a":…inner…}}``."""
    return b'{"a":' * levels + inner + b"}" * levels


# name: (body, None when accepted, else (path, part of the problem))
CASES: dict[str, tuple[bytes, tuple[str, str] | None]] = {
    # accepted
    "plain": (b'{"type": "order.created", "payload": {"n": 1, "x": [1.5, -2, null]}}', None),
    "empty-object": (b"{}", None),
    "scalar": (b"12", None),
    "keys-in-many-objects": (b'[{"a": 1}, {"a": 2}, {"b": {"a": 3}}]', None),
    "same-key-at-two-levels": (b'{"a": {"a": {"a": 1}}}', None),
    "colon-and-quote-in-strings": (b'{"a": "x\\":y", "b\\":": ":", "c": "\\\\"}', None),
    "escaped-backslash-then-u0000-text": (b'{"a": "\\\\u0000"}', None),
    "three-backslashes-then-quote": (b'{"a": "\\\\\\"", "b": 1}', None),
    "surrogate-pair": (b'{"a": "\\ud83d\\ude00", "b": "\\uD83D\\uDE00"}', None),
    "other-escapes": (b'{"a": "caf\\u00e9 \\n \\t \\u0001"}', None),
    "raw-utf8": ('{"a": "café 😀"}'.encode(), None),
    f"depth-{MAX_DEPTH}": (nested(MAX_DEPTH - 1, b"[1]"), None),
    "int64-max": (b'{"n": 9223372036854775807}', None),
    "int64-min": (b'{"n": -9223372036854775808}', None),
    "19-digit-float": (b'{"n": 9223372036854775808.5}', None),
    "long-fraction": (b'{"n": 0.' + b"1" * 5000 + b"}", None),
    "big-finite-exponent": (b'{"n": 1.7976931348623157e308}', None),
    "underflow": (b'{"n": 1e-400}', None),
    "negative-exponent-digits": (b'{"n": 5e-0000000000000000000001}', None),
    "digits-in-strings": (b'{"n": "123456789012345678901234567890", "e": "1e999"}', None),
    "true-false-null": (b"[true, false, null, 1e5]", None),
    # depth
    f"depth-{MAX_DEPTH + 1}": (nested(MAX_DEPTH, b"[1]"), ("", DEEP)),
    "10000-nested-arrays": (b"[" * 10_000 + b"]" * 10_000, ("", DEEP)),
    "10000-unclosed-arrays": (b"[" * 10_000, ("", DEEP)),
    "deep-inside-a-payload": (b'{"payload": ' + b"[" * 100 + b"]" * 100 + b"}", ("", DEEP)),
    # numbers
    "thousands-of-digits": (
        b'{"payload": {"n": [1, ' + b"9" * 5000 + b"]}}",
        ("payload.n[1]", "more than 19 digits"),
    ),
    "int64-max-plus-one": (b'{"n": 9223372036854775808}', ("n", "signed 64-bit integer")),
    "int64-min-minus-one": (b'{"n": -9223372036854775809}', ("n", "signed 64-bit integer")),
    "20-digit-integer-part": (b'{"n": 12345678901234567890.5}', ("n", "more than 19 digits")),
    "float-overflow": (b'{"a": {"b": 1e400}}', ("a.b", "64-bit float")),
    "negative-float-overflow": (b'{"a": [-1.5E+309]}', ("a[0]", "64-bit float")),
    "number-in-a-batch": (
        b'{"events": [{"payload": {}}, {"payload": {"x": 1e999}}]}',
        ("events[1].payload.x", "64-bit float"),
    ),
    # duplicate keys
    "duplicate-key": (
        b'{"type": "a", "payload": {"x": 1, "x": 2}}',
        ("payload.x", 'duplicate key "x"'),
    ),
    "duplicate-key-at-the-root": (b'{"type": "a", "type": "b"}', ("type", 'duplicate key "type"')),
    "duplicate-key-written-escaped": (b'{"x": 1, "\\u0078": 2}', ("x", 'duplicate key "x"')),
    "duplicate-key-with-spaces": (b'{ "x" : 1 ,\n "x"\t: 2 }', ("x", 'duplicate key "x"')),
    "duplicate-key-in-an-array": (b'[{"a": 1}, {"b": 1, "b": 1}]', ("[1].b", 'duplicate key "b"')),
    # NUL
    "nul-in-a-value": (b'{"payload": {"note": "a\\u0000b"}}', ("payload.note", NUL)),
    "nul-in-a-key": (b'{"payload": {"a\\u0000": 1}}', ('payload."a\\u0000"', NUL)),
    "nul-after-an-escaped-backslash": (b'{"a": "\\\\\\u0000"}', ("a", NUL)),
    # lone surrogates
    "lone-high": (b'{"a": ["ok", "\\ud800"]}', ("a[1]", SURROGATE)),
    "lone-high-then-text": (b'{"a": "\\uD800x"}', ("a", SURROGATE)),
    "lone-low": (b'{"a": "\\udc00"}', ("a", SURROGATE)),
    "lone-low-in-a-key": (b'{"\\udfff": 1}', ('"\\udfff"', SURROGATE)),
    "high-then-high-low": (b'["\\ud800\\ud800\\udc00"]', ("[0]", SURROGATE)),
    "high-then-escaped-backslash": (b'["\\ud800\\\\udc00"]', ("[0]", SURROGATE)),
}


@pytest.mark.parametrize(("body", "expected"), CASES.values(), ids=CASES.keys())
def test_rules(body: bytes, expected: tuple[str, str] | None) -> None:
    if expected is None:
        check(body)
        return
    path, problem = expected
    with pytest.raises(JsonRefused) as refused:
        check(body)
    assert refused.value.path == path
    assert problem in refused.value.problem
    assert str(refused.value) == f"{path or 'body'}: {refused.value.problem}"
    msgspec.json.encode(str(refused.value))  # the message itself can always be sent


@pytest.mark.parametrize(
    "body",
    [b"{", b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}', b'{"a": 1, "b": }', b"[1, 2"],
)
def test_what_is_not_json_is_left_to_the_decoder(body: bytes) -> None:
    """Not JSON: either ``check`` passes it on (the typed decode then says 400) or it raises
    the decoder's own error, never ``JsonRefused``."""
    with contextlib.suppress(msgspec.DecodeError):
        check(body)


@pytest.mark.parametrize(
    ("skeleton", "levels"),
    [(b"", 0), (b"1", 0), (b"[]", 1), (b"[[],{}]", 2), (b'{"":[{"":[]}]}', 4), (b"[[][[]]]", 3)],
)
def test_depth(skeleton: bytes, levels: int) -> None:
    assert depth(skeleton) == levels


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("0", False),
        ("-9223372036854775808", False),
        ("9223372036854775807", False),
        ("9223372036854775808", True),
        ("99999999999999999999", True),
        ("1e308", False),
        ("1e309", True),
        ("-1E+400", True),
        ("1e-999", False),
        ("1234567890123456789.5e2", False),
        ("1-2", False),  # not a number at all: the decoder refuses it
    ],
)
def test_number_problem(text: str, refused: bool) -> None:
    assert (jsonguard.number_problem(text) is not None) is refused


def test_the_rules_agree_with_the_standard_library_on_what_is_kept() -> None:
    """A body that passes decodes to the same value with msgspec and the standard library."""
    for body, expected in CASES.values():
        if expected is None:
            assert msgspec.json.decode(body) == json.loads(body)
