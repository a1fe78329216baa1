"""Turn msgspec's validation messages into ``path: problem`` form, naming the offending key; and
``whole``, the form of every pattern that must match a whole text."""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, Literal

import msgspec

_AT = re.compile(r"(.*) - at `\$(.*)`", flags=re.DOTALL)
_FIELD = re.compile(r"Object (contains unknown|missing required) field `(.+)`")
# A struct's own check (``__post_init__``) about one of its keys: see ``key_error``.
_KEY = re.compile(r"`(.+?)`: (.*)", flags=re.DOTALL)
_ENUM = re.compile(r"Invalid enum value (.*)", flags=re.DOTALL)
# A step of a path: a key, an array's index `[3]`, a mapping's key as msgspec writes it `[...]`.
_STEP = re.compile(r"\[(?:\d+|\.\.\.)\]|[^.\[\]]+")


def whole(body: str) -> str:
    r"""A pattern that matches when ``body`` matches the whole text, and only then.

    msgspec matches a pattern with ``re.search``, and Python's ``$`` also matches just before a
    final newline (``^a$`` takes ``"a\n"``); ``(?!\n)`` after it rules that out. The pattern is
    also published in the OpenAPI document, whose regex dialect (ECMA-262) has no ``\A`` or
    ``\Z``: this form means the same in both dialects."""
    return rf"^(?:{body})$(?!\n)"


def key_error(key: str, problem: str) -> ValueError:
    """The error a struct's ``__post_init__`` raises about its key ``key`` (a path below the
    struct: ``bind``, ``allowed_cidrs[2]``, ``tenants.billing``). msgspec reports it at the
    struct; ``locate`` moves it to the key, so the message names the whole path
    (``ingest.bind: ...``)."""
    return ValueError(f"`{key}`: {problem}")


def locate(exc: msgspec.ValidationError, model: Any = None) -> tuple[str, str]:
    """Return ``(path, problem)`` for a validation error; ``path`` is ``""`` for the root.

    msgspec writes ``Expected `int`, got `str` - at `$.relay.batch_size```, and leaves the
    suffix out for problems at the root. Unknown and missing fields are reported at the field
    itself, so ``{"foo": 1}`` gives ``("foo", "unknown key")``, and so are the problems a
    struct's own check raised with ``key_error``. Given the ``model`` that was decoded, a value
    outside a set of allowed values (a ``Literal``) is told with the values allowed there.
    """
    message = str(exc)
    match = _AT.fullmatch(message)
    text, path = (match.group(1), match.group(2).lstrip(".")) if match else (message, "")
    field = _FIELD.fullmatch(text)
    if field:
        kind, name = field.groups()
        path = f"{path}.{name}" if path else name
        text = "unknown key" if kind == "contains unknown" else "missing required key"
    elif keyed := _KEY.fullmatch(text):
        name, text = keyed.groups()
        path = f"{path}.{name}" if path else name
    elif (
        model is not None
        and (enum := _ENUM.fullmatch(text))
        and (allowed := allowed_values(model, path))
    ):
        got = enum.group(1)
        if len(got) >= 2 and got[0] == got[-1] == "'":
            got = f'"{got[1:-1]}"'  # as TOML writes a string
        text = f"expected {allowed}, got {got}"
    return path, text


def allowed_values(model: Any, path: str) -> str | None:
    """What may be written at ``path`` (dotted, as ``locate`` gives it) of ``model`` when a
    ``Literal`` says so: ``one of "DEBUG", "INFO"`` (in the order declared), or ``an integer >= 1
    or "auto"`` for a union holding one; None when no ``Literal`` applies there."""
    hint: Any = model
    for step in _STEP.findall(path):
        hint = _step_type(hint, step)
    literals: list[Any] = []
    others: list[str] = []
    for member in _members(hint):
        bare, metas = _bare(member)
        if typing.get_origin(bare) is Literal:
            literals.extend(typing.get_args(bare))
        elif bare is type(None):
            continue  # TOML has no null
        elif bare is int:
            bounds = [f" >= {m.ge}" for m in metas if m.ge is not None]
            others.append("an integer" + "".join(bounds))
        else:
            others.append(getattr(bare, "__name__", str(bare)))
    if not literals:
        return None
    values = ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in literals)
    if others:
        return " or ".join([*others, values])
    return f"one of {values}" if len(literals) > 1 else values


def _bare(hint: Any) -> tuple[Any, list[msgspec.Meta]]:
    """``hint`` without ``Annotated``, and the ``msgspec.Meta`` it carried."""
    if typing.get_origin(hint) is Annotated:
        base, *extra = typing.get_args(hint)
        return base, [m for m in extra if isinstance(m, msgspec.Meta)]
    return hint, []


def _members(hint: Any) -> tuple[Any, ...]:
    """The members of a union (``X | None``), or ``hint`` alone."""
    hint = _bare(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _step_type(hint: Any, step: str) -> Any:
    """The type one step below ``hint``: of the field encoded as ``step`` of a struct (or of the
    struct in a union such as ``X | None``), of a mapping's values (a step ``[...]``, or a key),
    or of an array's items (a step ``[i]``); ``Any`` when there is none."""
    for member in _members(hint):
        bare = _bare(member)[0]
        origin, args = typing.get_origin(bare), typing.get_args(bare)
        if step == "[...]":
            if origin is dict and len(args) == 2:
                return args[1]
        elif step.startswith("["):
            if origin in (list, tuple) and args:
                return args[0]
        elif isinstance(bare, type) and issubclass(bare, msgspec.Struct):
            for field in msgspec.structs.fields(bare):
                if field.encode_name == step:
                    return field.type
        elif origin is dict and len(args) == 2:
            return args[1]
    return Any


def describe(exc: msgspec.ValidationError, root: str = "") -> tuple[str, str]:
    """Like ``locate``, with the path prefixed by ``root`` (``config`` → ``config.url``)."""
    path, text = locate(exc)
    if root:
        path = f"{root}.{path}" if path else root
    return path, text
