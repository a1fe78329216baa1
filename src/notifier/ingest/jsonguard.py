"""The JSON rules a request body must keep beyond being JSON (README, *Input limits*).

``check`` refuses a body that breaks one with ``JsonRefused`` (answered 422) before it is
decoded into a model, so nothing is ever written from it:

- at most ``MAX_DEPTH`` levels of nested arrays and objects (the body itself is level 1), so
  no decoder, encoder or ``jsonb`` operation recurses deeply;
- an integer must fit a signed 64-bit integer, any other number a finite 64-bit float, and no
  number may have more than ``MAX_INTEGER_DIGITS`` digits before its decimal point (``NaN``
  and ``Infinity`` are not JSON at all: the decoder answers those, 400);
- no object may repeat a key (a decoder would silently keep one of the values);
- no ``\\u0000`` (Postgres cannot store it) and no lone UTF-16 surrogate (``"\\ud800"``, which
  UTF-8 text cannot carry) in any key or string. (One contrived spelling, a lone low half
  right after the text ``\\\\ud800``, is left to the decoder, which refuses it with 400.)

The checks are C-speed passes over the raw bytes (bytes methods and literal-led regular
expressions) plus one msgspec decode and re-encode to count keys, a few microseconds for a
typical body. Only a refused body pays for the message: it is parsed once more with the standard
library, keeping every key and number as written, to name the offending path.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import re
from collections.abc import Iterator
from typing import Any, TypeVar

import msgspec

from notifier.errors import InvalidInput
from notifier.validation import locate

T = TypeVar("T")

MAX_DEPTH = 64
MAX_INTEGER_DIGITS = 19  # as many as the largest int64 has
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

NUL_MESSAGE = "text must not contain the NUL character (\\u0000): Postgres cannot store it"
SURROGATE_MESSAGE = "text must not contain a lone UTF-16 surrogate (\\ud800-\\udfff)"
DEPTH_MESSAGE = f"nested deeper than {MAX_DEPTH} levels of arrays and objects"

_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_OPEN_AS_2 = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
# Numbers that need a closer look: 19 digits in a row (an integer part that may be too long,
# or an integer that may not fit), or a positive exponent of three digits or more (the only way
# a float with at most 19 digits before the point overflows). Searched for as fixed strings in
# the skeleton (strings removed: the only letters left are those of true/false/null and
# exponents) with every digit made 0 and every E an e.
_DIGITS_AS_0 = bytes.maketrans(b"0123456789E", b"0000000000e")
_SUSPECTS = (b"0" * MAX_INTEGER_DIGITS, b"e000", b"e+000")
_SUSPECT = re.compile(rb"[0-9]{%d}|[eE]\+?[0-9]{3}" % MAX_INTEGER_DIGITS)
_NUMBER = re.compile(rb"-?[0-9][0-9.eE+\-]*")
_INTEGER = re.compile(r"-?[0-9]+")
# A \u escape of NUL, of a high surrogate not followed by a low one, or of a low surrogate not
# preceded by a high one. Led by a literal, so the engine skips ahead; only when it finds one is
# the body searched again, slowly, with the backslash before it known to be unescaped.
_HEX2 = rb"[0-9a-fA-F]{2}"
_BAD = (
    rb"\\u(?:0000"
    rb"|[dD][89abAB]" + _HEX2 + rb"(?!\\u[dD][c-fC-F]" + _HEX2 + rb")"
    rb"|(?<!\\u[dD][89abAB]" + _HEX2 + rb"\\u)[dD][c-fC-F]" + _HEX2 + rb")"
)
_BAD_ESCAPE_CANDIDATE = re.compile(_BAD)
_BAD_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*" + _BAD)


class JsonRefused(InvalidInput):
    """A body that breaks one of the rules above; ``path`` is where (``""``: the body)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or 'body'}: {problem}")
        self.path, self.problem = path, problem


class BodyRefused(InvalidInput):
    """Why a body cannot be decoded: ``code`` ``invalid_json`` (not JSON: 400) or
    ``validation_error`` (a rule above, or the model, refuses it: 422), and a message naming
    the path."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _not_json(exc: msgspec.DecodeError) -> BodyRefused:
    return BodyRefused(400, "invalid_json", f"body is not valid JSON: {exc}")


def decode(data: bytes, kind: type[T]) -> T:
    """``data`` checked against the rules above, then decoded into ``kind``; ``BodyRefused``
    otherwise. The one way a body becomes a model, for the HTTP API and AMQP ingest alike."""
    try:
        check(data)
    except JsonRefused as exc:
        raise BodyRefused(422, "validation_error", str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise _not_json(exc) from exc
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        # Typed decoding stops at the first misfit, so `[1, 2` or `{"x": ` would be a 422;
        # on this error path only, check that the body is JSON at all.
        try:
            msgspec.json.decode(data)
        except msgspec.DecodeError as bad:
            raise _not_json(bad) from bad
        path, text = locate(exc)
        raise BodyRefused(422, "validation_error", f"{path or 'body'}: {text}") from exc
    except msgspec.DecodeError as exc:
        raise _not_json(exc) from exc


def check(data: bytes) -> None:
    """Raise ``JsonRefused`` if ``data`` breaks a rule, ``msgspec.DecodeError`` if it is not
    JSON (for a body that is both, whichever is found first). Return None for a good body."""
    skeleton = _skeleton(data)
    if depth(skeleton) > MAX_DEPTH:
        raise JsonRefused("", DEPTH_MESSAGE)
    masked = skeleton.translate(_DIGITS_AS_0)
    if any(suspect in masked for suspect in _SUSPECTS):
        for token in filter(_SUSPECT.search, _NUMBER.findall(skeleton)):
            if (problem := number_problem(token.decode())) is not None:
                raise _explain(data, "number", JsonRefused("", problem))
    if b"\\u" in data:
        _check_escapes(data)
    keys = skeleton.count(b":")  # one colon per key, outside strings
    if keys > 1:
        decoded = msgspec.json.decode(data)  # the depth is bounded: no deep recursion
        if _skeleton(msgspec.json.encode(decoded)).count(b":") != keys:
            raise _explain(data, "duplicate", JsonRefused("", "an object repeats a key"))


def _skeleton(data: bytes) -> bytes:
    """``data`` with every string emptied: structure, numbers and literals are left. Escaped
    backslashes, then escaped quotes, are dropped first (left to right, as JSON pairs them),
    so every quote left opens or closes a string."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(data.split(b'"')[::2])


def depth(skeleton: bytes) -> int:
    """How deeply arrays and objects nest (the largest prefix count of opening brackets less
    closing ones), computed by C iterators: ``[`` counts 2, ``]`` 0, less one per bracket."""
    marks = skeleton.translate(None, _NOT_BRACKET).translate(_OPEN_AS_2)
    return max(map(operator.sub, itertools.accumulate(marks), itertools.count(1)), default=0)


def number_problem(text: str) -> str | None:
    """Why the JSON number ``text`` is refused, or None."""
    shown = text if len(text) <= 40 else f"{text[:20]}…{text[-10:]} ({len(text)} characters)"
    integer_part = re.split(r"[.eE]", text.lstrip("-"), maxsplit=1)[0]
    if len(integer_part) > MAX_INTEGER_DIGITS:
        return f"number {shown} has more than {MAX_INTEGER_DIGITS} digits before the decimal point"
    if _INTEGER.fullmatch(text):
        if not INT64_MIN <= int(text) <= INT64_MAX:
            return f"integer {shown} does not fit a signed 64-bit integer"
    else:
        try:
            if math.isinf(float(text)):
                return f"number {shown} does not fit a 64-bit float"
        except ValueError:
            return None  # not a JSON number at all: the decoder says so
    return None


def _check_escapes(data: bytes) -> None:
    if _BAD_ESCAPE_CANDIDATE.search(data) and (match := _BAD_ESCAPE.search(data)):
        if match.group().endswith(b"\\u0000"):
            raise _explain(data, "nul", JsonRefused("", NUL_MESSAGE))
        raise _explain(data, "surrogate", JsonRefused("", SURROGATE_MESSAGE))


# -- naming the path (refused bodies only) ------------------------------------------------------


class _Pairs(list[tuple[str, Any]]):
    """An object as written: every key, in order, repeated ones kept."""


class _Number(str):
    """A number as written."""


def _walk(value: Any, path: str) -> Iterator[tuple[str, str, Any]]:
    """``(kind, path, item)`` for every key, string and number, depth first, in order; kind is
    ``key``, ``repeated`` (a key seen before in its object), ``string`` or ``number``."""
    if isinstance(value, _Pairs):
        seen: set[str] = set()
        for key, item in value:
            shown = key if key.isprintable() and key.isascii() else json.dumps(key)
            where = f"{path}.{shown}" if path else shown
            yield ("repeated" if key in seen else "key"), where, key
            seen.add(key)
            yield from _walk(item, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")
    elif isinstance(value, _Number):
        yield "number", path, value
    elif isinstance(value, str):
        yield "string", path, value


def _offends(rule: str, kind: str, item: Any) -> bool:
    if rule == "duplicate":
        return kind == "repeated"
    if rule == "number":
        return kind == "number" and number_problem(item) is not None
    if kind not in ("key", "repeated", "string"):
        return False
    if rule == "nul":
        return "\x00" in item
    return any("\ud800" <= c <= "\udfff" for c in item)


def _explain(data: bytes, rule: str, fallback: JsonRefused) -> JsonRefused:
    """``fallback`` with the path of the first key or value that breaks ``rule``, when the body
    parses (its depth is within the limit, so the parser's recursion is bounded)."""
    try:
        tree = json.loads(
            data.decode("utf-8"), object_pairs_hook=_Pairs, parse_int=_Number, parse_float=_Number
        )
    except (ValueError, RecursionError):
        return fallback
    for kind, path, item in _walk(tree, ""):
        if _offends(rule, kind, item):
            if rule == "duplicate":
                return JsonRefused(path, f"duplicate key {json.dumps(item)}")
            if rule == "number":
                return JsonRefused(path, number_problem(item) or fallback.problem)
            return JsonRefused(path, fallback.problem)
    return fallback
