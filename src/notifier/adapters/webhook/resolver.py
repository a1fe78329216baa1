"""How a webhook's host name becomes addresses (docs/architecture.md §9), without trio's thread
pool: a name whose nameserver never answers must not stall anyone else's deliveries.

- ``/etc/hosts`` first, read once at start (as the system resolver would answer those names);
- then DNS, asked directly (dnspython over trio sockets, no thread) of ``dns_servers`` or the
  nameservers of ``/etc/resolv.conf``, A and AAAA together, each name as written (absolute: no
  search domains);
- at most one question in flight per name: every other delivery to that name waits for its
  answer (and stops waiting at its own deadline), so a stalled name costs one socket, not a
  thread per delivery;
- answers kept for their TTL, clamped to 5 to 300 s; a failure (no such name, no address, the
  nameservers failing, or silent for half an attempt's time) kept for 5 s, so deliveries to a dead
  name fail at once meanwhile instead of waiting again; at most 10,000 names (the least
  recently stored go first).

Error texts name the host only, never a nameserver's address: they reach a delivery's
``last_error``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path

import dns.asyncbackend
import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver
import trio

from notifier.config import nameserver_address
from notifier.errors import ConfigError, NotifierError

log = logging.getLogger("notifier.webhook")

HOSTS_FILE = Path("/etc/hosts")
MIN_TTL_SECONDS = 5.0
MAX_TTL_SECONDS = 300.0
FAILURE_TTL_SECONDS = 5.0
MAX_NAMES = 10_000
# The longest one question may take: half an attempt, and never more than this.
MAX_QUESTION_SECONDS = 5.0
# Once A or AAAA has given addresses, how much longer the other may take (a nameserver that
# drops AAAA questions must not cost a name its IPv4 addresses).
SECOND_FAMILY_GRACE_SECONDS = 0.25


class ResolutionError(NotifierError, OSError):
    """A name did not resolve; the text says why without naming a nameserver. An ``OSError``
    as ``getaddrinfo``'s failures are, so a caller handles both alike."""


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    """A name's addresses and how long they may be kept."""

    addresses: tuple[str, ...]
    ttl_seconds: float


# name (lowercase, no trailing dot) -> its addresses; raises ResolutionError
Lookup = Callable[[str], Awaitable[Resolved]]


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    expires_at: float
    addresses: tuple[str, ...]
    error: str | None


def read_hosts(path: Path = HOSTS_FILE) -> dict[str, tuple[str, ...]]:
    """The names of a hosts file (lowercase) and their addresses, in the file's order; lines
    that are not ``address name...`` are skipped. A missing file has no names."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return parse_hosts(text)


def parse_hosts(text: str) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        try:
            address = str(ipaddress.ip_address(fields[0]))
        except ValueError:
            continue
        for name in fields[1:]:
            key = name.lower().removesuffix(".")
            if address not in out.get(key, ()):
                out[key] = (*out.get(key, ()), address)
    return out


class CachingResolver:
    """A ``ssrf.Resolver``: names from the hosts table, then ``lookup``, one question per name
    at a time, answers and failures cached (module docstring). Trio-flavoured; time is
    ``trio.current_time()``."""

    def __init__(
        self,
        lookup: Lookup,
        *,
        hosts: Mapping[str, Sequence[str]] | None = None,
        timeout_seconds: float = 5.0,
        min_ttl_seconds: float = MIN_TTL_SECONDS,
        max_ttl_seconds: float = MAX_TTL_SECONDS,
        failure_ttl_seconds: float = FAILURE_TTL_SECONDS,
        max_names: int = MAX_NAMES,
    ) -> None:
        """``hosts`` is read from ``/etc/hosts`` when None; ``timeout_seconds`` bounds one
        question (what every delivery waiting for it may wait at most)."""
        table = read_hosts() if hosts is None else hosts
        self._hosts = {name.lower(): tuple(addrs) for name, addrs in table.items()}
        self._lookup = lookup
        self._timeout = timeout_seconds
        self._min_ttl = min_ttl_seconds
        self._max_ttl = max_ttl_seconds
        self._failure_ttl = failure_ttl_seconds
        self._max_names = max_names
        self._cache: dict[str, _Entry] = {}  # the least recently stored first
        self._asking: dict[str, trio.Event] = {}

    @property
    def names_cached(self) -> int:
        return len(self._cache)

    @property
    def names_in_flight(self) -> int:
        return len(self._asking)

    async def __call__(self, host: str, port: int) -> tuple[str, ...]:
        """``host``'s addresses (``port`` is not part of the question); ``ResolutionError``
        when it does not resolve."""
        name = host.lower().removesuffix(".")
        if (listed := self._hosts.get(name)) is not None:
            return listed
        entry = self._cached(name)
        while entry is None and (asked := self._asking.get(name)) is not None:
            await asked.wait()  # then: its answer, or ask again if it was cancelled
            entry = self._cached(name)
        if entry is None:
            entry = await self._ask(name)
        if entry.error is not None:
            raise ResolutionError(entry.error)
        return entry.addresses

    def _cached(self, name: str) -> _Entry | None:
        entry = self._cache.get(name)
        if entry is not None and entry.expires_at <= trio.current_time():
            del self._cache[name]
            return None
        return entry

    async def _ask(self, name: str) -> _Entry:
        done = self._asking[name] = trio.Event()
        try:
            entry = await self._answer(name)
            self._store(name, entry)
            return entry
        finally:
            del self._asking[name]
            done.set()

    async def _answer(self, name: str) -> _Entry:
        error: str | None = f"no answer within {self._timeout:g} s"
        resolved = Resolved((), 0.0)
        with trio.move_on_after(self._timeout):
            try:
                resolved = await self._lookup(name)
                error = None if resolved.addresses else "no address"
            except ResolutionError as exc:
                error = str(exc)
        now = trio.current_time()
        if error is not None:
            return _Entry(now + self._failure_ttl, (), error)
        ttl = min(max(resolved.ttl_seconds, self._min_ttl), self._max_ttl)
        return _Entry(now + ttl, resolved.addresses, None)

    def _store(self, name: str, entry: _Entry) -> None:
        self._cache.pop(name, None)
        self._cache[name] = entry
        while len(self._cache) > self._max_names:
            del self._cache[next(iter(self._cache))]


class DnsLookup:
    """A ``Lookup`` that asks nameservers directly with dnspython over trio sockets (no
    thread): A and AAAA together, the name taken as absolute; once one of them has addresses,
    the other has ``SECOND_FAMILY_GRACE_SECONDS`` more. Trio-flavoured."""

    def __init__(self, nameservers: Iterable[str] = ()) -> None:
        """``nameservers`` as ``workers.webhook.dns_servers`` gives them (``ip`` or
        ``ip:port``); none: those of ``/etc/resolv.conf`` (``ConfigError`` without any)."""
        servers = [nameserver_address(text) for text in nameservers]
        try:
            self._resolver = dns.asyncresolver.Resolver(configure=not servers)
        except dns.resolver.NoResolverConfiguration as exc:
            raise ConfigError(
                "workers.webhook.dns_servers: /etc/resolv.conf names no nameserver; list them"
            ) from exc
        if servers:
            self._resolver.nameservers = [
                dns.nameserver.Do53Nameserver(ip, port) for ip, port in servers
            ]
        # The caller bounds a question; dnspython's own limit only must not come first.
        self._resolver.lifetime = 3600.0
        self._backend = dns.asyncbackend.get_backend("trio")

    async def __call__(self, name: str) -> Resolved:
        answers: list[dns.resolver.Answer] = []
        errors: list[dns.exception.DNSException] = []

        async def ask(rdtype: str, scope: trio.CancelScope) -> None:
            try:
                answer = await self._resolver.resolve(
                    f"{name}.", rdtype, search=False, raise_on_no_answer=False,
                    backend=self._backend,
                )  # fmt: skip
            except dns.exception.DNSException as exc:
                errors.append(exc)
                return
            answers.append(answer)
            if answer.rrset is not None:
                grace = trio.current_time() + SECOND_FAMILY_GRACE_SECONDS
                scope.deadline = min(scope.deadline, grace)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "A", nursery.cancel_scope)
            nursery.start_soon(ask, "AAAA", nursery.cancel_scope)
        addresses = tuple(
            dict.fromkeys(
                str(rdata.address)
                for answer in answers if answer.rrset is not None
                for rdata in answer.rrset
            )
        )  # fmt: skip
        if not addresses:
            raise ResolutionError(_why(errors[0]) if errors else "no address")
        ttl = min(a.chaining_result.minimum_ttl for a in answers if a.rrset is not None)
        return Resolved(addresses, float(ttl))


def _why(exc: dns.exception.DNSException) -> str:
    """What a failed question means, naming no nameserver (dnspython's texts list them)."""
    if isinstance(exc, dns.resolver.NXDOMAIN):
        return "no such name"
    if isinstance(exc, dns.resolver.NoNameservers):
        return "the nameservers failed to answer"
    if isinstance(exc, dns.exception.Timeout):
        return "no answer from the nameservers"
    log.info("webhook DNS question failed: %s", exc)
    return f"DNS error ({type(exc).__name__})"


def dns_resolver(dns_servers: Iterable[str] = (), *, timeout_seconds: float) -> CachingResolver:
    """The resolver of webhooks in production: ``/etc/hosts``, then ``dns_servers`` (or those of
    ``/etc/resolv.conf``), cached, one question per name at a time. A question may take half of
    an attempt's ``timeout_seconds`` (5 s at most): a silent nameserver is then recorded as a
    failure before any attempt waiting for it runs out, and the other half is the exchange's."""
    question = min(timeout_seconds / 2, MAX_QUESTION_SECONDS)
    return CachingResolver(DnsLookup(dns_servers), timeout_seconds=question)
