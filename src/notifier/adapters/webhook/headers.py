"""A webhook channel's custom headers: the one rule for what a channel may send (checked at
create, at PATCH and before each delivery), and keeping their values and the signing secrets out
of the text of errors that quote a request."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from notifier.adapters.webhook.signing import SECRET_PREFIX

# Headers a channel may not set: the signature headers and what HTTP itself owns.
RESERVED_HEADERS = frozenset(
    {
        "host", "content-length", "content-type", "transfer-encoding", "connection",
        "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
        "trailer", "upgrade",
    }
)  # fmt: skip
# RFC 9110 §5.1: a field name is a token (tchar: letters, digits and !#$%&'*+-.^_`|~).
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 9110 §5.5, narrowed to what every HTTP stack sends as it is: visible ASCII, with spaces
# and tabs only between visible characters (no leading or trailing whitespace, no obs-text).
_FIELD_VALUE = re.compile(r"([\x21-\x7e]+([ \t]+[\x21-\x7e]+)*)?")


def header_field(name: str) -> str:
    """``config.headers.<name>``, the name shown as a Python literal when it is not a token (so
    a control character in it is visible and cannot break a log line)."""
    shown = name if _FIELD_NAME.fullmatch(name) else ascii(name)
    return f"config.headers.{shown}"


def header_problem(name: str, value: object) -> str | None:
    """Why a channel may not send the header ``name: value``, or None when it may. The one rule
    for custom headers: checked at create and PATCH, and again before each delivery (a channel
    stored before the rule existed). The text never quotes the value, which may be a secret."""
    lowered = name.lower()
    if lowered in RESERVED_HEADERS or lowered.startswith("webhook-"):
        return "may not be set by a channel"
    if not _FIELD_NAME.fullmatch(name):
        return "is not a valid header name (a token: ASCII letters, digits and !#$%&'*+-.^_`|~)"
    if not isinstance(value, str):
        return "the value must be a string"
    if not _FIELD_VALUE.fullmatch(value):
        return (
            "the value must be visible ASCII, with spaces or tabs only between visible "
            "characters (no control characters, no non-ASCII, no leading or trailing whitespace)"
        )
    return None


def headers_problem(headers: object) -> tuple[str, str] | None:
    """The first header of a channel's ``headers`` that may not be sent, as ``(field,
    problem)``, or None when every one may."""
    if not isinstance(headers, dict):
        return "config.headers", "must be an object of header names to values"
    for name, value in headers.items():
        problem = header_problem(str(name), value)
        if problem is not None:
            return header_field(str(name)), problem
    return None


# Shorter quoted forms are left alone: they would match all over an error's text.
MIN_SCRUBBED_CHARS = 4


def request_secrets(headers: Mapping[str, object], secrets: Sequence[str]) -> tuple[str, ...]:
    """What an error that quotes a request could reveal, in the forms it could be quoted in:
    each custom header value (as it is, stripped, as a ``str`` or ``bytes`` repr shows it, and
    each long word of it, such as the token after ``Bearer``) and each signing secret (with
    its key material alone), for ``notifier.secrets.scrub_known``. Longest first, so a value
    containing another goes whole."""
    forms: set[str] = set()
    for value in [*headers.values(), *secrets]:
        if isinstance(value, str):
            as_bytes = repr(value.encode("utf-8", "backslashreplace"))[2:-1]
            forms |= {value, value.strip(), value.removeprefix(SECRET_PREFIX), repr(value)[1:-1]}
            forms |= {as_bytes, *value.split()}
    long_enough = (form for form in forms if len(form) >= MIN_SCRUBBED_CHARS)
    return tuple(sorted(long_enough, key=len, reverse=True))
