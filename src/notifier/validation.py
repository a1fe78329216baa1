"""Turn msgspec's validation messages into ``path: problem`` form, naming the offending key."""

from __future__ import annotations

import re

import msgspec

_AT = re.compile(r"(.*) - at `\$(.*)`", flags=re.DOTALL)
_FIELD = re.compile(r"Object (contains unknown|missing required) field `(.+)`")


def locate(exc: msgspec.ValidationError) -> tuple[str, str]:
    """Return ``(path, problem)`` for a validation error; ``path`` is ``""`` for the root.

    msgspec writes ``Expected `int`, got `str` - at `$.relay.batch_size```, and leaves the
    suffix out for problems at the root. Unknown and missing fields are reported at the field
    itself, so ``{"foo": 1}`` gives ``("foo", "unknown key")``.
    """
    message = str(exc)
    match = _AT.fullmatch(message)
    text, path = (match.group(1), match.group(2).lstrip(".")) if match else (message, "")
    field = _FIELD.fullmatch(text)
    if field:
        kind, name = field.groups()
        path = f"{path}.{name}" if path else name
        text = "unknown key" if kind == "contains unknown" else "missing required key"
    return path, text


def describe(exc: msgspec.ValidationError, root: str = "") -> tuple[str, str]:
    """Like ``locate``, with the path prefixed by ``root`` (``config`` → ``config.url``)."""
    path, text = locate(exc)
    if root:
        path = f"{root}.{path}" if path else root
    return path, text
