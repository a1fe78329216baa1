"""The limit of 401s per client address: a flood of made-up API keys costs the store one lookup
per key, so each address (an IPv6 client by its /64, which one host or customer usually holds
whole) may have at most ``burst`` requests refused for their key at once, then ``rate`` a
second. A request takes a token before its key is looked up and gives it back when the key
turns out valid, so a tenant's requests never spend the limit; one whose key is cached as
valid, or was valid at its latest lookup, takes none (``api.auth``), so a tenant behind the
address of a flood is not refused with it. Over the limit the key is not looked up at all: 429.

Kept in the process (not in the store: each ingest process limits on its own, so a fleet of N
admits N times the rate), in a table of at most ``max_addresses`` addresses, the least recently
seen dropped first (a dropped address starts again with a full bucket).
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict

import trio

MAX_ADDRESSES = 10_000
IPV6_PREFIX = 64


def address_key(address: str | None) -> str:
    """What ``address`` is limited as: an IPv4 address itself (an IPv4-mapped IPv6 address as
    its IPv4 address), an IPv6 address by its /64; anything else (a Unix socket, no address) as
    the text it is."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return address or ""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))
    return str(ip)


class UnauthorizedLimit:
    """A token bucket of ``burst`` per address key, refilled at ``rate_per_second``; its time is
    trio's clock."""

    def __init__(
        self, rate_per_second: float, burst: int, *, max_addresses: int = MAX_ADDRESSES
    ) -> None:
        if rate_per_second <= 0 or burst < 1 or max_addresses < 1:
            raise ValueError("the rate, the burst and the table size must be positive")
        self.rate = rate_per_second
        self.burst = burst
        self._max = max_addresses
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def _tokens(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.rate)

    def take(self, address: str | None) -> float | None:
        """Take a token for ``address``: None when taken, else the seconds until one is back
        (the request is then refused without a lookup)."""
        key, now = address_key(address), trio.current_time()
        tokens = self._tokens(key, now)
        if tokens < 1:
            self._put(key, tokens, now)
            return (1 - tokens) / self.rate
        self._put(key, tokens - 1, now)
        return None

    def give_back(self, address: str | None) -> None:
        """Return the token ``take`` took (the key was valid)."""
        key, now = address_key(address), trio.current_time()
        tokens = self._tokens(key, now) + 1
        if tokens >= self.burst:
            self._buckets.pop(key, None)  # full: the same as never seen
        else:
            self._put(key, tokens, now)

    def _put(self, key: str, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)

    def __len__(self) -> int:
        return len(self._buckets)


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` for a wait of ``seconds``: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
