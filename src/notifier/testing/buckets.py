"""The shared rate-limit buckets in memory, for unit tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio

from notifier.errors import StoreUnavailable
from notifier.ratelimit import Bucket, RefillingBucket, TokenBucket


class MemoryBuckets:
    """``notifier.ratelimit.SharedBuckets`` in this process's memory, with the rules of the SQL
    functions (``TokenBucket``, ``RefillingBucket``) on ``clock`` (trio's: a ``MockClock`` in
    tests). ``takes`` lists every call of ``take_tokens``, by key. Set ``unavailable = True``
    to make every call raise ``StoreUnavailable`` (Postgres down)."""

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self._windows: dict[str, TokenBucket] = {}
        self._refilling: dict[str, RefillingBucket] = {}
        self.takes: list[tuple[str, ...]] = []
        self.unavailable = False

    async def take_tokens(self, buckets: Sequence[Bucket]) -> float:
        await trio.lowlevel.checkpoint()
        if self.unavailable:
            raise StoreUnavailable("memory buckets are unavailable")
        keys = tuple(b.key for b in buckets)
        if len(set(keys)) != len(keys):
            raise ValueError(f"a key twice in one take: {keys}")
        self.takes.append(keys)
        now = self._clock()
        held = [self._windows.setdefault(b.key, TokenBucket(b.tokens, b.period)) for b in buckets]
        wait = max((bucket.wait(now) for bucket in held), default=0.0)
        if wait > 0:
            return wait
        for bucket in held:
            bucket.take(now)
        return 0.0

    async def admit(self, key: str, count: int, *, capacity: int, rate: float) -> float:
        await trio.lowlevel.checkpoint()
        if self.unavailable:
            raise StoreUnavailable("memory buckets are unavailable")
        now = self._clock()
        bucket = self._refilling.setdefault(key, RefillingBucket(capacity, rate))
        wait = bucket.wait(now, count)
        if wait > 0:
            return wait
        bucket.take(now, count)
        return 0.0
