"""Tenants as ingest meets them: API keys hashed the way the store keeps them, the caches of
tenant ids that the HTTP API and the console (API key hash → id) and AMQP ingest (tenant name →
id) keep, and ``keep_tenant_caches_fresh``, which empties them the moment a tenant changes.

Kept free of the web framework so that the CLI can hash a new key without building the app.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import trio

from notifier.store.listen import relisten

log = logging.getLogger("notifier.ingest")

# How long a tenant id found is trusted at most. Every change to a tenants row (a key rotated
# away with `notifier tenant rotate-key`, a tenant disabled, renamed or deleted) is NOTIFYed by
# a trigger on `notifier_tenants`, and every ingest process that LISTENs drops the tenant's
# entries as soon as the notification arrives (``keep_tenant_caches_fresh``): the old key is
# refused at once. The TTL is the bound where no notification can arrive: behind PgBouncer in
# transaction pooling mode without ``database.listen_url``, and while the LISTEN connection is
# down. Short, so that the bound is seconds; long enough that a busy key costs one lookup per
# process every few seconds, not one per request. (A disabled tenant's events fan out to no
# channel at once whatever the cache says: the fan-out statement checks the tenant.)
TENANT_CACHE_SECONDS = 5.0


def hash_api_key(api_key: str) -> str:
    """What the store keeps of an API key (and looks a tenant up by)."""
    return hashlib.sha256(api_key.encode()).hexdigest()


class TenantCache:
    """Key (an API key's hash, a tenant name) → tenant id, from ``lookup`` (one call for all
    the keys missing), kept ``ttl_seconds`` or until ``forget``. Keys that find no tenant are
    not cached: the tenant may be created any time, and a caller trying keys at random fills
    nothing.

    A lookup that was under way when a tenant was forgotten is answered but not cached: it may
    have read the row before the change (the notification arrives after the commit, so a lookup
    started after it reads the new row)."""

    def __init__(
        self,
        lookup: Callable[[Sequence[str]], Awaitable[dict[str, uuid.UUID]]],
        ttl_seconds: float = TENANT_CACHE_SECONDS,
    ) -> None:
        self._lookup = lookup
        self._ttl = ttl_seconds
        self._known: dict[str, tuple[uuid.UUID, float]] = {}
        self._forgotten = 0  # how many times anything was forgotten

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
            forgotten = self._forgotten
            looked_up = await self._lookup(sorted(missing))
            if forgotten == self._forgotten:
                for key, tenant_id in looked_up.items():
                    self._known[key] = (tenant_id, now + self._ttl)
            found.update(looked_up)
        return found

    async def resolve_one(self, key: str) -> uuid.UUID | None:
        return (await self.resolve([key])).get(key)

    def forget(self, tenant_id: uuid.UUID) -> None:
        """Drop every entry of ``tenant_id`` (its row changed)."""
        self._forgotten += 1
        self._known = {k: v for k, v in self._known.items() if v[0] != tenant_id}

    def forget_all(self) -> None:
        """Drop every entry (changes may have been missed)."""
        self._forgotten += 1
        self._known.clear()

    def __len__(self) -> int:
        return len(self._known)


class TenantCaches:
    """The tenant caches of one process, forgotten together: ``cache`` makes one (kept only
    as long as its user keeps it), ``forget``/``forget_all`` reach every one."""

    def __init__(self, ttl_seconds: float = TENANT_CACHE_SECONDS) -> None:
        self.ttl_seconds = ttl_seconds
        self._caches: weakref.WeakSet[TenantCache] = weakref.WeakSet()

    def cache(
        self, lookup: Callable[[Sequence[str]], Awaitable[dict[str, uuid.UUID]]]
    ) -> TenantCache:
        made = TenantCache(lookup, self.ttl_seconds)
        self._caches.add(made)
        return made

    def forget(self, tenant_id: uuid.UUID) -> None:
        for cache in list(self._caches):
            cache.forget(tenant_id)

    def forget_all(self) -> None:
        for cache in list(self._caches):
            cache.forget_all()


class TenantChanges(Protocol):
    """One LISTEN connection on the tenants' channel (``Store.open_tenant_changes``):
    ``listening`` False when there is nothing to LISTEN on (iterating then waits for ever);
    iterating yields the NOTIFY payloads (tenant ids) and ends when the connection is lost."""

    @property
    def listening(self) -> bool: ...

    def __aiter__(self) -> AsyncIterator[str]: ...


class TenantChangeStore(Protocol):
    def open_tenant_changes(self) -> AbstractAsyncContextManager[TenantChanges]: ...


async def keep_tenant_caches_fresh(
    store: TenantChangeStore,
    caches: TenantCaches,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Forget a tenant in ``caches`` on every NOTIFY of its id, for ever
    (cancel it to stop).

    ``started()`` comes after the first LISTEN, or after it failed. Every (re)connected LISTEN
    forgets everything first (changes made while nobody listened were missed); a lost or
    refused connection is logged and opened again after a backoff, the TTL bounding the caches
    meanwhile. Nothing here ever fails ingest.
    """

    async def use(changes: TenantChanges, again: bool) -> None:
        caches.forget_all()
        if not changes.listening:
            log.info(
                "no LISTEN through a transaction pooler and no database.listen_url: "
                "a changed tenant (key rotated, disabled) is refused at most %g s later",
                caches.ttl_seconds,
            )
        async for payload in changes:
            _forget(caches, payload)

    ttl = f"{caches.ttl_seconds:g} s TTL"
    await relisten(
        store.open_tenant_changes, use, log=log, what="tenant changes",
        lost=f"the tenant changes LISTEN connection was lost; tenant caches are bounded by "
        f"their {ttl} until it is back",
        failed=f"listening for tenant changes failed (tenant caches are bounded by their {ttl})",
        task_status=task_status,
    )  # fmt: skip


def _forget(caches: TenantCaches, payload: str) -> None:
    try:
        tenant_id = uuid.UUID(payload)
    except ValueError:
        # Not ours (anyone may NOTIFY on the channel): the safe reading is "something changed".
        log.warning("unexpected tenant change notification: forgetting every tenant")
        caches.forget_all()
        return
    caches.forget(tenant_id)
