"""Tenants as ingest meets them: API keys hashed the way the store keeps them, and the one cache
of tenant ids that the HTTP API (API key hash → id) and AMQP ingest (tenant name → id) share.

Kept free of the web framework so that the CLI can hash a new key without building the app.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence

import trio

# How long a tenant id found is trusted: a key rotated away (`notifier tenant rotate-key`), a
# disabled or deleted tenant is refused by every ingest process at most this long after. Short,
# so that "the old key stops working" holds within seconds; long enough that a busy key costs one
# lookup per process every few seconds, not one per request. (A disabled tenant's events fan out
# to no channel at once whatever the cache says: the fan-out statement checks the tenant.)
TENANT_CACHE_SECONDS = 5.0


def hash_api_key(api_key: str) -> str:
    """What the store keeps of an API key (and looks a tenant up by)."""
    return hashlib.sha256(api_key.encode()).hexdigest()


class TenantCache:
    """Key (an API key's hash, a tenant name) → tenant id, from ``lookup`` (one call for all
    the keys missing), kept ``ttl_seconds``. Keys that find no tenant are not cached: the
    tenant may be created any time, and a caller trying keys at random fills nothing."""

    def __init__(
        self,
        lookup: Callable[[Sequence[str]], Awaitable[dict[str, uuid.UUID]]],
        ttl_seconds: float = TENANT_CACHE_SECONDS,
    ) -> None:
        self._lookup = lookup
        self._ttl = ttl_seconds
        self._known: dict[str, tuple[uuid.UUID, float]] = {}

    async def resolve(self, keys: Iterable[str]) -> dict[str, uuid.UUID]:
        """The tenant id of each of ``keys`` that has one."""
        now = trio.current_time()
        found: dict[str, uuid.UUID] = {}
        missing: list[str] = []
        for key in set(keys):
            cached = self._known.get(key)
            if cached and cached[1] > now:
                found[key] = cached[0]
            else:
                missing.append(key)
        if missing:
            looked_up = await self._lookup(sorted(missing))
            for key, tenant_id in looked_up.items():
                self._known[key] = (tenant_id, now + self._ttl)
            found.update(looked_up)
        return found

    async def resolve_one(self, key: str) -> uuid.UUID | None:
        return (await self.resolve([key])).get(key)
