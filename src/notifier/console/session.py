"""The console's session: a random id in a signed, expiring cookie, whose row in the store
(``ConsoleStore``) says which tenant signed in with which API key hash; its CSRF token is an
HMAC of the id. And the slowing down of repeated failed sign-ins from one client address,
counted in the store (shared by the fleet), with the client's address told from the
connection's and ``X-Forwarded-For`` when the connection comes from a trusted proxy.

Kept free of the web framework: ``Sessions`` signs and reads cookie values and makes CSRF
tokens, ``SignInThrottle`` decides from the store's count, ``client_address`` is pure.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
from collections.abc import Iterable, Mapping, MutableMapping, Sequence

from itsdangerous import BadSignature, URLSafeTimedSerializer

from notifier.store.console_sessions import SIGNIN_FORGET_AFTER_SECONDS, ConsoleStore

log = logging.getLogger("notifier.console")

COOKIE_NAME = "notifier_console"
_SALT = "notifier.console.session"
_CSRF_SALT = b"notifier.console.csrf"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def new_session_id() -> str:
    """A new random session id (256 bits): one at every sign-in and sign-out."""
    return secrets.token_urlsafe(32)


def session_id_hash(session_id: str) -> str:
    """What the store keeps of a session id: its SHA-256, in hex."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def session_secret(env_var: str, environ: Mapping[str, str]) -> str:
    """The secret in ``env_var``; without one a random secret for this process, with a warning:
    sessions then end when it restarts and do not hold across several processes. (A launch of
    several processes sets one for all of them: ``share_session_secret``.)"""
    secret = environ.get(env_var, "")
    if secret:
        return secret
    log.warning(
        "console: %s is not set; sessions are signed with a random secret of this process "
        "(they end when it restarts and hold on this process only)", env_var,
    )  # fmt: skip
    return secrets.token_urlsafe(32)


def share_session_secret(env_var: str, environ: MutableMapping[str, str]) -> bool:
    """In the parent of a launch: when ``env_var`` is unset or empty, set it in ``environ`` (the
    environment its processes inherit) to a random secret, so that every process signs and
    reads the same cookies and tokens. Whether it did (not without a variable to set)."""
    if not env_var or environ.get(env_var):
        return False
    environ[env_var] = secrets.token_urlsafe(32)
    log.warning(
        "console: %s is not set; the processes of this launch share a random secret made for "
        "it (console sessions end when the launch restarts)", env_var,
    )  # fmt: skip
    return True


class Sessions:
    """Cookie values holding a session id, signed with ``secret`` and readable
    ``max_age_seconds`` after they were issued, and the CSRF token of each id."""

    def __init__(self, secret: str, max_age_seconds: int) -> None:
        self._serializer = URLSafeTimedSerializer(secret, salt=_SALT)
        self._csrf_key = hmac.new(secret.encode(), _CSRF_SALT, hashlib.sha256).digest()
        self.max_age_seconds = max_age_seconds

    def dump(self, session_id: str) -> str:
        return self._serializer.dumps(session_id)

    def load(self, value: str | None) -> str | None:
        """The session id ``value`` holds; None if it is missing, forged, malformed or
        expired."""
        if not value:
            return None
        try:
            data = self._serializer.loads(value, max_age=self.max_age_seconds)
        except BadSignature:  # also SignatureExpired
            return None
        return data if isinstance(data, str) and data else None

    def csrf(self, session_id: str) -> str:
        """The CSRF token of the session ``session_id``: an HMAC of it."""
        return hmac.new(self._csrf_key, session_id.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session_id: str | None, sent: str) -> bool:
        if session_id is None:
            return False
        return hmac.compare_digest(sent.encode(), self.csrf(session_id).encode())


def trusted_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """``console.trusted_proxies`` as networks (checked by the config already)."""
    return tuple(ipaddress.ip_network(cidr, strict=True) for cidr in cidrs)


def _trusted(address: str, trusted: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def client_address(
    peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[Network]
) -> str:
    """The address a sign-in is counted against. ``peer`` is the connection's; only when it is
    a trusted proxy are ``forwarded_for`` (the ``X-Forwarded-For`` headers, in order) read: the
    right-most entry that is not itself a trusted proxy, which the nearest trusted proxy wrote
    (the ones left of it the client could have made up). Every entry trusted: the left-most."""
    address = peer or "unknown"
    if not trusted or not _trusted(address, trusted):
        return address
    entries = [e.strip() for header in forwarded_for for e in header.split(",") if e.strip()]
    for entry in reversed(entries):
        if not _trusted(entry, trusted):
            return entry[:64]
    return entries[0][:64] if entries else address


class SignInThrottle:
    """Failed sign-ins per address, counted in ``store`` for the whole fleet: the first
    ``free`` cost nothing; after them each further attempt waits ``base_seconds``, doubling
    with every failure, up to ``max_seconds``, counted from the last failure. A success
    forgets the address; so does ``SIGNIN_FORGET_AFTER_SECONDS`` without a failure."""

    def __init__(
        self, store: ConsoleStore, *, free: int = 5, base_seconds: float = 1.0,
        max_seconds: float = 60.0, forget_after_seconds: float = SIGNIN_FORGET_AFTER_SECONDS,
    ) -> None:  # fmt: skip
        self._store = store
        self._free = free
        self._base = base_seconds
        self._max = max_seconds
        self._forget_after = forget_after_seconds

    def delay(self, failures: int) -> float:
        """How long after the last of ``failures`` failures in a row the next is heard."""
        if failures < self._free:
            return 0.0
        return min(self._max, self._base * 2.0 ** (failures - self._free))

    async def wait_seconds(self, address: str) -> float:
        """How long ``address`` must wait before its next attempt is heard (0: now)."""
        failures = await self._store.signin_failures(
            address, forget_after_seconds=self._forget_after
        )
        if failures is None:
            return 0.0
        return max(0.0, self.delay(failures.count) - failures.quiet_seconds)

    async def failed(self, address: str) -> None:
        await self._store.signin_failed(address, forget_after_seconds=self._forget_after)

    async def succeeded(self, address: str) -> None:
        await self._store.signin_succeeded(address)
