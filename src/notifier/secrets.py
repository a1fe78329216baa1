"""The secrets notifier holds at run time, and the one way a text loses them.

A secret value read at start-up (the SMTP password, the bot token) is registered once with
``register_secret``; from then on the log handler's filter (``notifier.logs``) and the adapters'
error texts scrub it, raw and percent-encoded (as it appears in a URL). A text that quotes a
request (a webhook's custom header values and signing secrets) is scrubbed of those forms too,
given as ``extra``. ``SecretRegistry.scrub`` also replaces what a pattern recognises as a secret
(API keys, webhook secrets, bot tokens, ``Authorization`` values, passwords in URLs and in
``password=…`` pairs): that is for log lines, whose text nobody chose.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from urllib.parse import quote

REDACTED = "[redacted]"

_NOT_DONE = rf"(?!{re.escape(REDACTED)})"  # scrubbing twice changes nothing
_SECRET_KEY = r"[\w-]*(?:password|passwd|secret|token|api[_-]?key)"
_Sub = tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]


def _pair(m: re.Match[str]) -> str:
    quote_ = m["quote"] or ""
    return f"{m['key']}{m['sep']}{m['b'] or ''}{quote_}{REDACTED}{quote_}"


_PATTERNS: tuple[_Sub, ...] = (
    # An Authorization header's value, with or without its scheme.
    (
        re.compile(
            r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)"
            rf"((?>(?:(?:bearer|basic|digest|token)\s+)?)){_NOT_DONE}[^\s\"',;]+"
        ),
        rf"\1\2{REDACTED}",
    ),
    # Bearer credentials anywhere; Basic ones when they look like base64 (not "basic setup").
    (re.compile(rf"(?i)\b(bearer\s+){_NOT_DONE}[A-Za-z0-9._~+/=-]+"), rf"\1{REDACTED}"),
    (
        re.compile(r"(?i)\b(basic\s+)(?-i:(?![a-z]+\b))[A-Za-z0-9+/]{6,}={0,2}(?![\w+/=])"),
        rf"\1{REDACTED}",
    ),
    # A bot token in a Bot API URL path (/bot<id>:<secret>/sendMessage), whatever its shape.
    (re.compile(rf"(/bot\d+(?::|%3A)){_NOT_DONE}[^/\s?#\"']+"), rf"\1{REDACTED}"),
    # A bot token anywhere: <bot id>:<35-ish urlsafe characters>; the bot id is not a secret.
    # (A uuid after a number and a colon is not a token.)
    (
        re.compile(r"(?<!\d)(\d{3,}:)(?![0-9a-f]{8}-[0-9a-f]{4}-)[A-Za-z0-9_-]{30,}"),
        rf"\1{REDACTED}",
    ),
    # notifier API keys (nk_ + urlsafe token) and webhook secrets (whsec_ + base64).
    (re.compile(r"\bnk_[A-Za-z0-9_-]+"), f"nk_{REDACTED}"),
    (re.compile(r"\bwhsec_[A-Za-z0-9+/=_-]+"), f"whsec_{REDACTED}"),
    # A header value an HTTP library refuses and quotes (h11: ``Illegal header value b'…'``):
    # custom webhook headers carry credentials, and httpcore logs its errors at DEBUG. The
    # value ends h11's message but may be escaped any number of times: the line goes.
    (re.compile(rf"(?i)(illegal header value ){_NOT_DONE}[^\n]*"), rf"\1{REDACTED}"),
    # scheme://user:password@host → scheme://user:***@host
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*):[^/?#\s]*@"), r"\1:***@"),
    # password=…, "password": "…", token='…', api_key=… (the key is kept, the value goes).
    (
        re.compile(
            rf"(?i)(?P<key>\b{_SECRET_KEY})(?P<sep>\s*=\s*|[\"']\s*:\s*)"
            rf"(?:(?P<b>b?)(?P<quote>[\"'])(?:(?!(?P=quote))[^\\]|\\.)*(?P=quote)"
            rf"|{_NOT_DONE}[^\s,;&\"'()\[\]{{}}]+)"
        ),
        _pair,
    ),
)
SECRET_KEY_NAME = re.compile(rf"(?i){_SECRET_KEY}")
# What every pattern above needs somewhere in the text (a superset: one search rules them all
# out for the usual line of ids and numbers, which then costs one scan instead of nine).
_MAY_HOLD_SECRET = re.compile(
    r"(?i)authorization|bearer|basic|/bot|\d{3}(?::|%3A)[\w-]{30}|nk_|whsec_|://|passw|secret"
    r"|token|api[_-]?key|header value"
)
# Text of only these characters (ids, numbers) cannot hold anything a pattern looks for.
_PLAINLY_SAFE = "0123456789abcdefABCDEF-. "


def secret_forms(secret: str) -> set[str]:
    """The forms ``secret`` is written in: as it is, and percent-encoded (in a URL)."""
    return {secret, quote(secret, safe="")} if secret else set()


def replace_forms(text: str, forms: Iterable[str], marker: str = REDACTED) -> str:
    """``text`` with each of ``forms`` replaced by ``marker``, longest first (so a secret
    containing another one is replaced whole)."""
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, marker)
    return text


class SecretRegistry:
    """Exact secret strings known at run time, scrubbed wherever they appear (also
    percent-encoded, as they appear in URLs). A secret is never unregistered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forms: tuple[str, ...] = ()

    def register(self, secret: str) -> None:
        if not secret:
            return
        with self._lock:
            forms = {*self._forms, *secret_forms(secret)}
            self._forms = tuple(sorted(forms, key=len, reverse=True))

    def known(self, text: str, extra: Iterable[str] = (), *, marker: str = REDACTED) -> str:
        """``text`` without the registered secrets and the ``extra`` forms (a request's)."""
        forms = self._forms  # a tuple, replaced whole: safe to read while one is added
        if extra:
            forms = tuple(sorted({*forms, *extra}, key=len, reverse=True))
        for form in forms:
            text = text.replace(form, marker)
        return text

    def scrub(self, text: str) -> str:
        """``text`` without the registered secrets and without anything a pattern recognises."""
        text = self.known(text)
        if not text.strip(_PLAINLY_SAFE) or not _MAY_HOLD_SECRET.search(text):
            return text
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text


SECRETS = SecretRegistry()


def register_secret(secret: str) -> None:
    """Scrub ``secret`` from every log line and adapter error of this process from now on."""
    SECRETS.register(secret)


def scrub_known(text: str, extra: Iterable[str] = (), *, marker: str = REDACTED) -> str:
    """``text`` without the registered secrets and the ``extra`` forms: for the errors an
    adapter raises (which a pattern would mangle)."""
    return SECRETS.known(text, extra, marker=marker)
