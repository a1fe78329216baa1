"""OAuth2 client credentials toward receivers that want a bearer token (docs/architecture.md §9).

A channel's ``oauth2`` names a token endpoint, a client id and scope/audience; its client secret
is kept beside them as ``oauth2_client_secret`` (a secret field: never shown by the API after
creation). Before an attempt the adapter asks ``Tokens`` for an access token: a cached one until
shortly before it expires, else one fetched with ``grant_type=client_credentials`` (the client
authenticated with HTTP Basic, RFC 6749 §2.3.1). Concurrent attempts of one channel wait for the
same fetch. The token endpoint is an HTTPS destination like any other: resolved, checked by the
SSRF rules and dialed only at the checked addresses (the caller's ``fetch``). A receiver's 401
drops the token, so the next attempt fetches a new one.

A failing token endpoint fails the attempt as retriable, with an error that names the endpoint
and never quotes the client secret or a token.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio

from notifier.errors import PermanentError, RetriableError
from notifier.secrets import scrub_known

CLIENT_SECRET_FIELD = "oauth2_client_secret"
# A token without expires_in is trusted this long (a 401 drops it sooner).
DEFAULT_EXPIRES_IN_SECONDS = 300.0
# A token is renewed this long before it expires (half its life when that is shorter).
RENEW_MARGIN_SECONDS = 30.0
TOKENS_KEPT = 1024
# RFC 6750 §2.1's b64token: what a bearer token may be, so it is a valid header value.
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


@dataclasses.dataclass(frozen=True, slots=True)
class Credentials:
    """A channel's OAuth2 client credentials (hashable: the token cache's key)."""

    token_url: str
    client_id: str
    client_secret: str = dataclasses.field(repr=False)
    scope: str | None = None
    audience: str | None = None

    @classmethod
    def of(cls, cfg: dict[str, Any]) -> Credentials | None:
        """The credentials of a stored channel config, or None without ``oauth2``.
        ``PermanentError`` for a config no attempt could use (written around the API)."""
        oauth = cfg.get("oauth2")
        if oauth is None:
            return None
        secret = cfg.get(CLIENT_SECRET_FIELD)
        try:
            creds = cls(oauth["token_url"], oauth["client_id"], secret,  # type: ignore[arg-type]
                        oauth.get("scope"), oauth.get("audience"))  # fmt: skip
        except (TypeError, KeyError, AttributeError):
            creds = None
        fields = (creds.token_url, creds.client_id, creds.client_secret) if creds else ()
        if creds is None or not all(isinstance(f, str) and f for f in fields):
            raise PermanentError("config.oauth2 needs token_url, client_id and a client secret")
        return creds

    def secrets(self) -> tuple[str, ...]:
        """The forms an error could quote the client secret in (with the Basic credentials)."""
        return (self.client_secret, urllib.parse.quote(self.client_secret, safe=""),
                basic_credentials(self))  # fmt: skip


def basic_credentials(creds: Credentials) -> str:
    """The client's HTTP Basic credentials: id and secret form-encoded (RFC 6749 §2.3.1)."""
    pair = (
        f"{urllib.parse.quote_plus(creds.client_id)}:{urllib.parse.quote_plus(creds.client_secret)}"
    )
    return base64.b64encode(pair.encode()).decode("ascii")


def token_request(creds: Credentials) -> tuple[list[tuple[str, str]], bytes]:
    """The headers (without ``Host`` and ``Content-Length``) and body of a token request."""
    form = {"grant_type": "client_credentials"}
    if creds.scope:
        form["scope"] = creds.scope
    if creds.audience:
        form["audience"] = creds.audience
    headers = [
        ("authorization", f"Basic {basic_credentials(creds)}"),
        ("content-type", "application/x-www-form-urlencoded"),
        ("accept", "application/json"),
    ]
    return headers, urllib.parse.urlencode(form).encode("ascii")


@dataclasses.dataclass(frozen=True, slots=True)
class Token:
    value: str = dataclasses.field(repr=False)
    renew_at: float  # clock seconds


def read_token(
    status: int, body: bytes, now: float, *, endpoint: str, secrets: Iterable[str] = ()
) -> Token:
    """The access token of a token endpoint's answer, renewed ``RENEW_MARGIN_SECONDS`` (or half
    its life) before ``expires_in``. ``RetriableError`` for any other answer: its text quotes
    the start of an error answer, scrubbed of ``secrets``, and never a token."""
    where = f"OAuth2 token endpoint {endpoint}"
    if not 200 <= status < 300:
        text = scrub_known(body.decode("utf-8", "replace")[:200], tuple(secrets))
        raise RetriableError(f"{where}: HTTP {status}" + (f": {text}" if text else ""))
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise RetriableError(f"{where}: the answer is not a JSON object")
    token, kind = data.get("access_token"), data.get("token_type", "Bearer")
    if not isinstance(token, str) or not _B64TOKEN.fullmatch(token):
        raise RetriableError(f"{where}: the answer has no valid access_token")
    if not isinstance(kind, str) or kind.lower() != "bearer":
        raise RetriableError(f"{where}: token_type must be Bearer")
    expires_in = data.get("expires_in", DEFAULT_EXPIRES_IN_SECONDS)
    if isinstance(expires_in, str) and expires_in.isdigit():
        expires_in = int(expires_in)
    if (not isinstance(expires_in, int | float) or isinstance(expires_in, bool)
            or not math.isfinite(expires_in) or expires_in <= 0):  # fmt: skip
        raise RetriableError(f"{where}: expires_in must be a positive number of seconds")
    life = float(expires_in)
    return Token(token, now + max(life - RENEW_MARGIN_SECONDS, life / 2))


Fetch = Callable[[Credentials], Awaitable[Token]]


class _Pending:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: RetriableError | PermanentError | None = None


class _Entry:
    __slots__ = ("pending", "token")

    def __init__(self) -> None:
        self.token: Token | None = None
        self.pending: _Pending | None = None


class Tokens:
    """Access tokens by credentials, each kept until its ``renew_at`` on ``clock``; at most
    ``kept`` credentials' (the least recently used go first)."""

    def __init__(self, clock: Callable[[], float], *, kept: int = TOKENS_KEPT) -> None:
        self._clock = clock
        self._kept = kept
        self._entries: dict[Credentials, _Entry] = {}
        self.fetches = 0  # how many fetches were started (statistics, tests)

    def _entry(self, creds: Credentials) -> _Entry:
        entry = self._entries.pop(creds, None) or _Entry()
        self._entries[creds] = entry  # the most recently used last
        if len(self._entries) > self._kept:
            for old in list(self._entries)[: len(self._entries) - self._kept]:
                if self._entries[old].pending is None:
                    del self._entries[old]
        return entry

    async def get(self, creds: Credentials, fetch: Fetch) -> str:
        """Trio-flavoured. A valid access token for ``creds``: the cached one, or one fetched
        with ``fetch``, which concurrent callers for the same credentials wait for and share
        (its failure too)."""
        entry = self._entry(creds)
        while True:
            if entry.token is not None and self._clock() < entry.token.renew_at:
                return entry.token.value
            if entry.pending is None:
                break
            pending = entry.pending
            await pending.done.wait()
            if (error := pending.error) is not None:  # the same failure, as an error of its own
                raise type(error)(str(error), status_code=error.status_code)
            # cancelled without an answer, or the token expired at once: try again
        pending = entry.pending = _Pending()
        self.fetches += 1
        try:
            entry.token = await fetch(creds)
        except (RetriableError, PermanentError) as exc:
            pending.error = exc
            raise
        finally:
            entry.pending = None
            pending.done.set()
        return entry.token.value

    def drop(self, creds: Credentials, value: str) -> None:
        """Forget ``value`` (a receiver refused it), unless another has replaced it already."""
        entry = self._entries.get(creds)
        if entry is not None and entry.token is not None and entry.token.value == value:
            entry.token = None
