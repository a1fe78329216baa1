"""The SSRF guard of webhooks (docs/architecture.md §9): the table of blocked addresses, the checks
of a URL that need no network (literal addresses in any notation, IDNA-mapped hosts, loopback
names), the always-closed metadata endpoints, what a tenant is told about a refusal, and the
rules a destination is judged by (``NetworkRules``; names are resolved by ``resolver``).

Every delivery resolves the host itself and checks every address with ``check_address``; the
checked addresses are then the only ones dialed (``client.WebhookClient``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from urllib.parse import urlsplit

import httpx
import trio

from notifier.adapters.base import InvalidChannelConfig

log = logging.getLogger("notifier.webhook")

MAX_URL_LENGTH = 2048

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# host, port -> the addresses it resolves to (strings as getaddrinfo gives them)
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


def _nets(*pairs: tuple[str, str]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), reason) for net, reason in pairs)


# First match wins, so the narrower entries come first.
_BLOCKED_V4 = _nets(
    ("0.0.0.0/8", "unspecified ('this network')"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "carrier-grade NAT"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignment"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved"),
)
_BLOCKED_V6 = _nets(
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/32", "Teredo"),
    ("2001:2::/48", "benchmarking"),
    ("2001:db8::/32", "documentation"),
    ("2001::/23", "IETF protocol assignment"),
    ("3fff::/20", "documentation"),
    ("fc00::/7", "unique local (private)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)
# Cloud metadata and credential endpoints: always closed, whatever allow_private_networks and
# allowed_cidrs say (an allowed network that holds one is opened around it), in every form that
# reaches them (IPv4-mapped, NAT64, 6to4, IPv4-compatible).
_CLOSED = _nets(
    ("169.254.169.254/32", "cloud metadata"),  # AWS, GCP, Azure, Oracle, DigitalOcean ...
    ("169.254.170.2/32", "container metadata"),  # ECS task credentials
    ("169.254.170.23/32", "container metadata"),  # EKS Pod Identity
    ("100.100.100.200/32", "cloud metadata"),  # Alibaba Cloud
    ("168.63.129.16/32", "cloud metadata"),  # Azure WireServer
    ("fd00:ec2::254/128", "cloud metadata"),  # AWS IMDS over IPv6
    ("fd00:ec2::23/128", "container metadata"),  # EKS Pod Identity over IPv6
)
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")


def _first_match(addr: IPAddress, table: tuple[tuple[IPNetwork, str], ...]) -> str | None:
    for net, reason in table:
        if addr.version == net.version and addr in net:
            return reason
    return None


def _blocked_v4(addr: ipaddress.IPv4Address) -> str | None:
    reason = _first_match(addr, _BLOCKED_V4)
    if reason is None and not addr.is_global:
        reason = "not globally routable"
    return reason


def _embedded_v4(addr: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address a NAT64 or 6to4 address leads to, with the form's name."""
    if addr in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr in _SIX_TO_FOUR and addr.sixtofour is not None:
        return "6to4", addr.sixtofour
    return None


def _closed(addr: IPAddress) -> str | None:
    """Why ``addr`` is a closed (metadata or credential) endpoint, also in a NAT64, 6to4 or
    IPv4-compatible form; None when it is not one."""
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = _embedded_v4(addr)
        if embedded is None and addr in _IPV4_COMPATIBLE and int(addr) > 1:
            embedded = "IPv4-compatible", ipaddress.IPv4Address(int(addr))
        if embedded is not None:
            form, v4 = embedded
            inner = _first_match(v4, _CLOSED)
            return f"{form} of {v4}, {inner}" if inner else None
    return _first_match(addr, _CLOSED)


def is_closed(ip: str) -> bool:
    """Whether ``ip`` is an address no setting opens (``_CLOSED``)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return _closed(addr) is not None


def check_address(
    ip: str | IPAddress,
    allow_private: bool = False,
    allowed_cidrs: Iterable[str | IPNetwork] = (),
) -> str | None:
    """Why a webhook may not be sent to ``ip`` (``"loopback"``, ``"private"``, ...), or None
    when it may. The cloud metadata and credential endpoints (``_CLOSED``) are always refused;
    any other address inside one of ``allowed_cidrs`` is allowed, and ``allow_private`` opens
    every one. An IPv4-mapped IPv6 address is judged as its IPv4 address; NAT64 and 6to4
    addresses by the IPv4 address they embed as well. Not an address: blocked."""
    try:
        addr = ip if not isinstance(ip, str) else ipaddress.ip_address(ip)
    except ValueError:
        return "not an IP address"
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # the kernel dials the IPv4 address
    if (closed := _closed(addr)) is not None:
        return closed
    for cidr in allowed_cidrs:
        net = ipaddress.ip_network(cidr) if isinstance(cidr, str) else cidr
        if addr.version == net.version and addr in net:
            return None
    if allow_private:
        return None
    if isinstance(addr, ipaddress.IPv4Address):
        return _blocked_v4(addr)
    if embedded := _embedded_v4(addr):
        form, v4 = embedded
        if inner := _blocked_v4(v4):
            return f"{form} of {v4}, {inner}"
        if form == "NAT64":
            return None  # a public IPv4 address behind a NAT64 gateway
    reason = _first_match(addr, _BLOCKED_V6)
    if reason is None and addr not in _GLOBAL_UNICAST_V6:
        reason = "reserved"
    if reason is None and not addr.is_global:
        reason = "not globally routable"
    return reason


_EMBEDDED_REASON = re.compile(r"(?P<form>\S+) of [^,]+, (?P<inner>.+)")


def blocked_message(host: str, ip: str, reason: str, *, resolved: bool = True) -> str:
    """The error a tenant reads when ``host`` is refused because of ``ip`` (why: ``reason``).
    An address the tenant wrote (``resolved=False``: a literal in any notation, a loopback
    name) is named; one a name resolved to is not, nor the address a NAT64 or 6to4 form
    embeds: the texts reach channel API answers and a delivery's ``last_error``, and the
    addresses behind an internal name are the operator's to know (``log_blocked``)."""
    if host.strip("[]") == ip:
        subject = f"{ip} is a {reason}"
    elif not resolved:
        subject = f"{host} is {ip}, a {reason}"
    else:
        if m := _EMBEDDED_REASON.fullmatch(reason):
            reason = f"{m['inner']} ({m['form']})"
        subject = f"{host} resolves to a {reason}"
    if is_closed(ip):
        hint = "metadata and credential endpoints are always closed"
    else:
        hint = (
            "set allow_private_networks = true or list it in allowed_cidrs under "
            "[workers.webhook] to allow it"
        )
    return f"destination blocked: {subject} address ({hint})"


def log_blocked(host: str, ip: str, reason: str, *, at: str) -> None:
    """The operator's record of a refused destination, with the address (``blocked_message``
    leaves it out of what the tenant reads)."""
    log.warning("webhook destination refused at %s: %s resolves to %s (%s)", at, host, ip, reason)


_NUMBER = re.compile(r"0x[0-9a-f]*|[0-9]+", flags=re.IGNORECASE)
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
_HOSTNAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")  # after IDNA encoding


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells, in any notation a resolver accepts (``2130706433``,
    ``0x7f.1``, ``127.1``, ``[::1]``), or None for a name. A host whose last label is a number
    is an IPv4 address (as WHATWG URL parsing says); one that is not valid raises
    ``ValueError``."""
    bare = host.strip("[]")
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    labels = bare.removesuffix(".").split(".")
    if not _NUMBER.fullmatch(labels[-1]):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(bare.removesuffix(".")))
    except OSError as exc:
        raise ValueError(f"{host!r} is not a valid IPv4 address") from exc


def dial_host(url: httpx.URL) -> str:
    """The host a request to ``url`` connects to, as httpx normalises it (IDNA-mapped and
    lowercased; an IPv6 address without brackets): what the SSRF guard checks, at create and
    at delivery alike."""
    return url.raw_host.decode("ascii")


def default_port(url: httpx.URL) -> int:
    """The port a request to ``url`` connects to."""
    return url.port or (443 if url.scheme == "https" else 80)


def validate_url(
    url: str, *, allow_private_networks: bool, allowed_cidrs: Iterable[str | IPNetwork] = ()
) -> None:
    """The checks of a webhook URL that need no network: http(s), a host, no user info, at most
    2,048 characters, and not a literal blocked address (or a loopback name).

    The host checked is the one ``deliver`` dials: httpx's, after IDNA mapping, which turns
    ``127。0。0。1`` (ideographic full stops; fullwidth ones too) into ``127.0.0.1``. What
    ``urlsplit`` reads is only a second opinion on whether the URL parses at all."""
    if len(url) > MAX_URL_LENGTH:
        raise InvalidChannelConfig("config.url", f"longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        _ = parts.port
        host = dial_host(httpx.URL(url))
    except (ValueError, httpx.InvalidURL) as exc:
        raise InvalidChannelConfig("config.url", f"not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidChannelConfig("config.url", "scheme must be http or https")
    if not host or not parts.hostname:
        raise InvalidChannelConfig("config.url", "has no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidChannelConfig("config.url", "must not contain user info")
    try:
        literal = literal_address(host)
    except ValueError as exc:
        raise InvalidChannelConfig("config.url", f"not a valid URL: {exc}") from exc
    name = host.lower().removesuffix(".")
    if literal is not None:
        ip = str(literal)
    elif not _HOSTNAME.fullmatch(host):
        raise InvalidChannelConfig("config.url", f"{host!r} is not a valid host name")
    elif name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        ip = "127.0.0.1"  # RFC 6761: always loopback
    else:
        return
    reason = check_address(ip, allow_private_networks, allowed_cidrs)
    if reason is not None:
        raise InvalidChannelConfig("config.url", blocked_message(host, ip, reason, resolved=False))


@dataclasses.dataclass(frozen=True)
class NetworkRules:
    """Where ``[workers.webhook]`` lets a webhook go, and how its host is resolved: the same at
    channel create and at every delivery."""

    timeout_seconds: float
    allow_private_networks: bool
    allowed: tuple[IPNetwork, ...]
    resolver: Resolver

    @classmethod
    def of(
        cls, timeout_seconds: float, allow_private_networks: bool, allowed_cidrs: Iterable[str],
        resolver: Resolver,
    ) -> NetworkRules:  # fmt: skip
        allowed = tuple(ipaddress.ip_network(c) for c in allowed_cidrs)
        return cls(timeout_seconds, allow_private_networks, allowed, resolver)

    def check(self, ip: str) -> str | None:
        """Why ``ip`` is blocked under these rules, or None."""
        return check_address(ip, self.allow_private_networks, self.allowed)

    def first_blocked(self, addresses: Iterable[str]) -> tuple[str, str] | None:
        """The first of ``addresses`` these rules refuse, with why; None when none is."""
        for ip in addresses:
            if (reason := self.check(ip)) is not None:
                return ip, reason
        return None

    async def resolve(
        self, host: str, port: int, *, deadline: float | None = None
    ) -> tuple[str, ...]:
        """Trio-flavoured. ``host``'s addresses: ``trio.TooSlowError`` at ``deadline`` (after
        the timeout when None), ``OSError`` if it does not resolve."""
        if deadline is None:
            deadline = trio.current_time() + self.timeout_seconds
        with trio.fail_at(deadline):
            return tuple(await self.resolver(host, port))
