"""In-process rate limits: token buckets, pure and clock-free. The HTTP API limits each tenant
with a ``KeyedLimiter`` of ``RefillingBucket`` (answering 429), the Telegram adapter each chat
and its bot with ``RateLimits``.

Every method takes ``now`` (seconds on any monotonic clock; callers pass ``trio.current_time()``
so the limits follow trio's ``MockClock`` in tests). Nothing here sleeps: a limiter answers how
long to wait, and the caller acts on it (the worker turns that wait into a trip through a delay
tier, docs/architecture.md §5).

A ``TokenBucket`` holds ``tokens`` tokens and each token spent comes back exactly ``period``
seconds after it was spent (the "sliding log" form of a token bucket). So at most ``tokens``
messages go out in *any* window of ``period`` seconds: strict, unlike a continuously refilled
bucket of the same size, which lets twice its size through in the first second after an idle
spell. With one token (the per-chat limit) both forms are the same: one message per period.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# Float slack when comparing times: a token due "now" is back, whatever rounding did to it.
_EPSILON = 1e-9


class TokenBucket:
    """``tokens`` tokens, each back ``period`` seconds after it was spent."""

    __slots__ = ("_spent", "period", "tokens")

    def __init__(self, tokens: int, period: float) -> None:
        if tokens < 1:
            raise ValueError("a bucket needs at least one token")
        if not period > 0:
            raise ValueError("period must be positive")
        self.tokens = tokens
        self.period = period
        self._spent: deque[float] = deque()  # when each token still out was spent, oldest first

    @classmethod
    def per_second(cls, rate: float) -> TokenBucket:
        """``rate`` messages per second: ``floor(rate)`` tokens (at least one) over the period
        that gives that rate (1/s → 1 token per 1 s, 30/s → 30 per 1 s, 0.5/s → 1 per 2 s)."""
        if not rate > 0:
            raise ValueError("rate must be positive")
        tokens = max(1, math.floor(rate))
        return cls(tokens, tokens / rate)

    def _refill(self, now: float) -> None:
        spent = self._spent
        while spent and spent[0] + self.period <= now + _EPSILON:
            spent.popleft()

    def wait(self, now: float, count: int = 1) -> float:
        """Seconds until ``count`` tokens (at most ``tokens``) are free; 0.0 when they are
        free now."""
        if not 1 <= count <= self.tokens:
            raise ValueError(f"count must be from 1 to {self.tokens}")
        self._refill(now)
        missing = count - (self.tokens - len(self._spent))
        if missing <= 0:
            return 0.0
        return max(0.0, self._spent[missing - 1] + self.period - now)

    def take(self, now: float, count: int = 1) -> None:
        """Spend ``count`` tokens; only call it when ``wait(now, count)`` is 0."""
        if self.wait(now, count) > 0:
            raise RuntimeError("not enough tokens free: call wait() first")
        self._spent.extend([now] * count)

    def full(self, now: float) -> bool:
        """Every token is back: the bucket is the same as a new one and may be forgotten."""
        self._refill(now)
        return not self._spent


class RefillingBucket:
    """A continuously refilled token bucket: ``capacity`` tokens, ``rate`` tokens back per
    second. Bursts up to ``capacity``, then ``rate`` on average; the wait for one more token is
    short (``1 / rate``), which suits an API's clients better than a sliding log."""

    __slots__ = ("_at", "_tokens", "capacity", "rate")

    def __init__(self, capacity: int, rate: float) -> None:
        if capacity < 1:
            raise ValueError("a bucket needs at least one token")
        if not rate > 0:
            raise ValueError("rate must be positive")
        self.capacity = capacity
        self.rate = rate
        self._tokens = float(capacity)
        self._at: float | None = None

    def _refill(self, now: float) -> None:
        if self._at is not None:
            self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def wait(self, now: float, count: int = 1) -> float:
        """Seconds until ``count`` tokens (at most ``capacity``) are there; 0.0 when now."""
        if not 1 <= count <= self.capacity:
            raise ValueError(f"count must be from 1 to {self.capacity}")
        self._refill(now)
        missing = count - self._tokens
        return 0.0 if missing <= _EPSILON else missing / self.rate

    def take(self, now: float, count: int = 1) -> None:
        """Spend ``count`` tokens; only call it when ``wait(now, count)`` is 0."""
        if self.wait(now, count) > 0:
            raise RuntimeError("not enough tokens: call wait() first")
        self._tokens = max(0.0, self._tokens - count)

    def full(self, now: float) -> bool:
        self._refill(now)
        return self._tokens >= self.capacity - _EPSILON


class KeyedLimiter(Generic[K]):
    """One bucket per key (e.g. per chat), made on first use and forgotten once full again.

    Buckets are kept in the order they were last spent from; all have the same period, so the
    first one is always the first to fill up, and forgetting stops at the first that has not.
    The memory held is therefore bounded by the keys used within one period.
    """

    def __init__(self, make_bucket: Callable[[], TokenBucket | RefillingBucket]) -> None:
        self._make = make_bucket
        self._buckets: OrderedDict[K, TokenBucket | RefillingBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def wait(self, key: K, now: float, count: int = 1) -> float:
        bucket = self._buckets.get(key)
        return 0.0 if bucket is None else bucket.wait(now, count)

    def take(self, key: K, now: float, count: int = 1) -> None:
        self.forget_idle(now)
        bucket = self._buckets.pop(key, None) or self._make()
        bucket.take(now, count)
        self._buckets[key] = bucket  # now the most recently spent

    def forget_idle(self, now: float) -> None:
        while self._buckets:
            key, bucket = next(iter(self._buckets.items()))
            if not bucket.full(now):
                return
            del self._buckets[key]


class RateLimits(Generic[K]):
    """A per-key limit and an overall one (Telegram: per chat and per bot).

    ``acquire`` either spends a token from both (the message may go now: 0.0) or spends
    nothing and answers how long until both would have one.
    """

    def __init__(self, *, per_key_per_second: float, total_per_second: float) -> None:
        self.per_key: KeyedLimiter[K] = KeyedLimiter(
            lambda: TokenBucket.per_second(per_key_per_second)
        )
        self.total = TokenBucket.per_second(total_per_second)

    def acquire(self, key: K, now: float) -> float:
        wait = max(self.per_key.wait(key, now), self.total.wait(now))
        if wait > 0:
            return wait
        self.per_key.take(key, now)
        self.total.take(now)
        return 0.0
