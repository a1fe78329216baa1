"""The store's queries for the rate limits shared by every process (``notifier.ratelimit``):
one statement per take, computed by Postgres on its own clock, so the processes' clocks do not
matter."""

from __future__ import annotations

from collections.abc import Sequence

from notifier.ratelimit import Bucket
from notifier.store.base import Q, transaction
from notifier.store.pool import Queries


class RateLimitQueries(Queries):
    """``notifier.ratelimit.SharedBuckets`` on the ``rate_buckets`` table."""

    @transaction
    async def take_tokens(self, buckets: Sequence[Bucket]) -> float:
        """One token of each bucket, all or none: 0.0 when taken, else the seconds to wait."""
        if not buckets:
            return 0.0
        keys = [b.key for b in buckets]
        if len(set(keys)) != len(keys):
            raise ValueError(f"a key twice in one take: {keys}")
        wait = await self._pool.fetchval(
            Q["rate_take"], keys, [b.tokens for b in buckets],
            [float(b.period) for b in buckets],
        )  # fmt: skip
        return float(wait)

    @transaction
    async def admit(self, key: str, count: int, *, capacity: int, rate: float) -> float:
        """``count`` tokens (1 to ``capacity``) of the refilling bucket ``key``: 0.0 when taken,
        else the seconds to wait."""
        if not 1 <= count <= capacity:
            raise ValueError(f"count must be from 1 to {capacity}")
        wait = await self._pool.fetchval(Q["rate_admit"], key, count, capacity, float(rate))
        return float(wait)
