"""Rate limits that hold for the whole fleet: token buckets shared through Postgres.

Every limit is a bucket named by a key, kept in the ``rate_buckets`` table and taken from by one
statement (``store.ratelimits``), so N processes together allow the rate once, not N times
(docs/architecture.md §5). Two kinds:

- a **window** bucket (``Bucket``): ``tokens`` tokens, each back exactly ``period`` seconds
  after it was spent (the "sliding log" form of a token bucket). At most ``tokens`` messages go
  out in *any* window of ``period`` seconds: strict, unlike a continuously refilled bucket of the
  same size, which lets twice its size through in the first second after an idle spell. The
  Telegram per-chat and per-bot limits and a channel's ``rate_limit_per_second`` are window
  buckets; a delivery takes one token of each of its buckets, all or none.
- a **refilling** bucket: ``capacity`` tokens, ``rate`` back per second (a GCRA). Bursts up to
  the capacity, then the rate on average; the wait for one more token is short (``1 / rate``),
  which suits an API's clients better than a sliding log. The per-API-key ingest limit.

Nothing here sleeps: a take answers how long to wait, and the caller acts on it (the worker turns
that wait into a trip through a delay tier, the API into a 429 with ``Retry-After``).

``TokenBucket`` and ``RefillingBucket`` state the rules in Python, pure and clock-free (``now``
is an argument): the SQL functions ``notifier_rate_take`` and ``notifier_rate_admit`` in
schema.sql implement the same rules, and tests hold the two to the same cases.
``notifier.testing.buckets.MemoryBuckets`` keeps them in memory for unit tests.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import msgspec

# Float slack when comparing times: a token due "now" is back, whatever rounding did to it.
_EPSILON = 1e-9
# A window bucket of a high rate keeps at most this many tokens (over a shorter period): the
# same rate, strict over every window of its period, and its row stays small.
MAX_WINDOW_TOKENS = 50


class Bucket(msgspec.Struct, frozen=True):
    """A window bucket shared by every process: ``tokens`` tokens under ``key``, each back
    ``period`` seconds after it was spent."""

    key: str
    tokens: int
    period: float

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError("a bucket needs at least one token")
        if not self.period > 0:
            raise ValueError("period must be positive")

    @classmethod
    def per_second(cls, key: str, rate: float) -> Bucket:
        """``rate`` messages per second: ``floor(rate)`` tokens (at least one, at most
        ``MAX_WINDOW_TOKENS``) over the period that gives that rate (1/s → 1 token per 1 s,
        30/s → 30 per 1 s, 0.5/s → 1 per 2 s, 1000/s → 50 per 50 ms)."""
        if not rate > 0 or math.isinf(rate):
            raise ValueError("rate must be positive and finite")
        tokens = min(MAX_WINDOW_TOKENS, max(1, math.floor(rate)))
        return cls(key, tokens, tokens / rate)


class SharedBuckets(Protocol):
    """Where the buckets are kept: ``store.Store`` (Postgres, the fleet's), or
    ``notifier.testing.buckets.MemoryBuckets`` in unit tests."""

    async def take_tokens(self, buckets: Sequence[Bucket]) -> float:
        """One token of each bucket (distinct keys), all or none: 0.0 when taken, else the
        seconds until every one of them has a token (nothing taken)."""
        ...

    async def admit(self, key: str, count: int, *, capacity: int, rate: float) -> float:
        """``count`` tokens (1 to ``capacity``) of the refilling bucket ``key``: 0.0 when
        taken, else the seconds until there are that many (nothing taken)."""
        ...


class TokenBucket:
    """The rule of a window bucket: ``tokens`` tokens, each back ``period`` seconds after it was
    spent."""

    __slots__ = ("_spent", "period", "tokens")

    def __init__(self, tokens: int, period: float) -> None:
        if tokens < 1:
            raise ValueError("a bucket needs at least one token")
        if not period > 0:
            raise ValueError("period must be positive")
        self.tokens = tokens
        self.period = period
        self._spent: deque[float] = deque()  # when each token still out was spent, oldest first

    def _refill(self, now: float) -> None:
        spent = self._spent
        while spent and spent[0] + self.period <= now + _EPSILON:
            spent.popleft()

    def wait(self, now: float) -> float:
        """Seconds until a token is free; 0.0 when one is free now."""
        self._refill(now)
        if len(self._spent) < self.tokens:
            return 0.0
        return max(0.0, self._spent[0] + self.period - now)

    def take(self, now: float) -> None:
        """Spend a token; only call it when ``wait(now)`` is 0."""
        if self.wait(now) > 0:
            raise RuntimeError("no token free: call wait() first")
        self._spent.append(now)


class RefillingBucket:
    """The rule of a refilling bucket: ``capacity`` tokens, ``rate`` tokens back per second."""

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


class Refusals:
    """What a process remembers of the takes it was refused: for a set of buckets, the time
    until which none of them can be taken together. A take of the same buckets before then is
    refused here, without a statement, with the time that is left.

    That never lets anything through, and refuses nothing the shared buckets would have
    granted (the wait it answers may be shorter than theirs, if others took since): a token
    comes back only at its time, and nothing any process does brings it back sooner (taking
    only spends more; maintenance deletes only full buckets). Times are the caller's clock,
    read *before* the refused take, so the remembered time is never later than the buckets'
    own. Entries past their time are forgotten once more than ``max_entries`` are kept.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self._until: dict[tuple[Bucket, ...], float] = {}
        self._max = max_entries

    def __len__(self) -> int:
        return len(self._until)

    def wait(self, buckets: tuple[Bucket, ...], now: float) -> float:
        """Seconds still to wait for ``buckets`` (0.0: ask the shared buckets)."""
        until = self._until.get(buckets)
        if until is None:
            return 0.0
        if until <= now:
            del self._until[buckets]
            return 0.0
        return until - now

    def refused(self, buckets: tuple[Bucket, ...], asked_at: float, wait: float) -> None:
        """A take of ``buckets`` asked at ``asked_at`` was refused for ``wait`` seconds."""
        if len(self._until) >= self._max:
            self._until = {b: t for b, t in self._until.items() if t > asked_at}
            if len(self._until) >= self._max:
                return  # all still current: remembering one more is not worth unbounded memory
        self._until[buckets] = asked_at + wait
