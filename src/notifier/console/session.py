"""The console's session: a signed, expiring cookie holding the API key's hash (never the key)
and the session's CSRF token, and the slowing down of repeated failed sign-ins from one address.

Kept free of the web framework: ``Sessions`` signs and reads cookie values, ``SignInThrottle``
decides from the time it is given (``trio.current_time()`` in the app, a ``MockClock`` in tests).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections import OrderedDict
from collections.abc import Mapping

import msgspec
from itsdangerous import BadSignature, URLSafeTimedSerializer

log = logging.getLogger("notifier.console")

COOKIE_NAME = "notifier_console"
_SALT = "notifier.console.session"


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """``key_hash`` None: not signed in (the session still carries the sign-in form's token)."""

    csrf: str
    key_hash: str | None = None


def new_session(key_hash: str | None = None) -> Session:
    """A session with a fresh CSRF token (a new one at every sign-in and sign-out)."""
    return Session(csrf=secrets.token_urlsafe(32), key_hash=key_hash)


def session_secret(env_var: str, environ: Mapping[str, str]) -> str:
    """The secret in ``env_var``; without one a random secret for this process, with a warning:
    sessions then end when it restarts and do not hold across several processes."""
    secret = environ.get(env_var, "")
    if secret:
        return secret
    log.warning(
        "console: %s is not set; sessions are signed with a random secret of this process "
        "(they end when it restarts and hold on this process only)", env_var,
    )  # fmt: skip
    return secrets.token_urlsafe(32)


class Sessions:
    """Sessions signed with ``secret``, valid ``max_age_seconds`` after they were issued."""

    def __init__(self, secret: str, max_age_seconds: int) -> None:
        self._serializer = URLSafeTimedSerializer(secret, salt=_SALT)
        self.max_age_seconds = max_age_seconds

    def dump(self, session: Session) -> str:
        return self._serializer.dumps({"c": session.csrf, "k": session.key_hash})

    def load(self, value: str | None) -> Session | None:
        """The session ``value`` holds; None if it is missing, forged, malformed or expired."""
        if not value:
            return None
        try:
            data = self._serializer.loads(value, max_age=self.max_age_seconds)
        except BadSignature:  # also SignatureExpired
            return None
        if not isinstance(data, dict):
            return None
        csrf, key_hash = data.get("c"), data.get("k")
        if not isinstance(csrf, str) or not (key_hash is None or isinstance(key_hash, str)):
            return None
        return Session(csrf=csrf, key_hash=key_hash)


@dataclasses.dataclass
class _Failures:
    count: int
    last_at: float


class SignInThrottle:
    """Failed sign-ins per address: the first ``free`` cost nothing; after them each further
    attempt waits ``base_seconds``, doubling with every failure, up to ``max_seconds``, counted
    from the last failure. A success forgets the address. At most ``max_addresses`` are kept
    (the longest quiet go first), so that addresses at random fill nothing."""

    def __init__(
        self, *, free: int = 5, base_seconds: float = 1.0, max_seconds: float = 60.0,
        max_addresses: int = 10_000,
    ) -> None:  # fmt: skip
        self._free = free
        self._base = base_seconds
        self._max = max_seconds
        self._max_addresses = max_addresses
        self._failures: OrderedDict[str, _Failures] = OrderedDict()

    def wait_seconds(self, address: str, now: float) -> float:
        """How long ``address`` must wait before its next attempt is heard (0: now)."""
        failures = self._failures.get(address)
        if failures is None or failures.count < self._free:
            return 0.0
        delay: float = min(self._max, self._base * 2.0 ** (failures.count - self._free))
        return max(0.0, failures.last_at + delay - now)

    def failed(self, address: str, now: float) -> None:
        failures = self._failures.pop(address, None) or _Failures(0, now)
        failures.count += 1
        failures.last_at = now
        self._failures[address] = failures
        while len(self._failures) > self._max_addresses:
            self._failures.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)
