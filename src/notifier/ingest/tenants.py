"""Tenants as ingest meets them: API keys hashed the way the store keeps them, the caches of
tenant ids that the HTTP API and the console (API key hash → id, unknown keys remembered too)
and AMQP ingest (tenant name → id) keep, and ``keep_tenant_caches_fresh``, which empties them
the moment a tenant changes.

Kept free of the web framework so that the CLI can hash a new key without building the app.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import trio

from notifier.store.listen import CATALOGS_CHANNEL, relisten

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


# How long an API key that matched no tenant is remembered as unknown, and how many such keys
# one cache remembers at most (the least recently asked for goes first). Every tenant NOTIFY
# (a tenant created, a key rotated) forgets them all at once, so the TTL only bounds how long a
# tenant created while nobody LISTENs (see above) may still be refused: a caller trying the same
# wrong key again and again costs one lookup per process every 30 s, not one per request. The
# entries are keyed by the key's SHA-256 (what the store looks up), never the key itself: about
# 200 bytes each, some 2 MB at the bound.
UNKNOWN_KEY_CACHE_SECONDS = 30.0
UNKNOWN_KEY_CACHE_ENTRIES = 10_000


def hash_api_key(api_key: str) -> str:
    """What the store keeps of an API key (and looks a tenant up by)."""
    return hashlib.sha256(api_key.encode()).hexdigest()


class _Lookup:
    """One lookup under way, which concurrent resolves of the same keys wait for."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: dict[str, uuid.UUID] | None = None  # None: failed or cancelled
        self.error: Exception | None = None


class TenantCache:
    """Key (an API key's hash, a tenant name) → tenant id, from ``lookup`` (one call for all
    the keys missing), kept ``ttl_seconds`` or until ``forget``. Concurrent resolves of a key
    that is not cached share one lookup.

    With ``remember_unknown``, a key that finds no tenant is remembered as unknown for
    ``unknown_ttl_seconds`` (at most ``max_unknown`` keys, least recently asked for dropped
    first), so that a caller repeating a wrong key costs no lookup; any ``forget`` forgets them
    all (a tenant was created or its key changed: any unknown key may be its). Without it, a
    key that finds no tenant is looked up each time.

    A lookup that was under way when a tenant was forgotten is answered but not cached: it may
    have read the row before the change (the notification arrives after the commit, so a lookup
    started after it reads the new row). A resolve that starts after a ``forget`` never waits for
    a lookup that started before it."""

    def __init__(
        self,
        lookup: Callable[[Sequence[str]], Awaitable[dict[str, uuid.UUID]]],
        ttl_seconds: float = TENANT_CACHE_SECONDS,
        *,
        remember_unknown: bool = False,
        unknown_ttl_seconds: float = UNKNOWN_KEY_CACHE_SECONDS,
        max_unknown: int = UNKNOWN_KEY_CACHE_ENTRIES,
    ) -> None:
        self._lookup = lookup
        self._ttl = ttl_seconds
        self._known: dict[str, tuple[uuid.UUID, float]] = {}
        self._remember_unknown = remember_unknown
        self._unknown_ttl = unknown_ttl_seconds
        self._max_unknown = max_unknown
        self._unknown: OrderedDict[str, float] = OrderedDict()  # key → expiry, oldest use first
        self._pending: dict[str, _Lookup] = {}
        self._forgotten = 0  # how many times anything was forgotten

    def cached(self, key: str) -> uuid.UUID | None:
        """The tenant id of ``key`` if it is cached (no lookup)."""
        entry = self._known.get(key)
        return entry[0] if entry and entry[1] > trio.current_time() else None

    def was_valid(self, key: str) -> bool:
        """Whether ``key`` found a tenant at its latest lookup, its entry expired or not, and no
        change forgot it since (no lookup): a key someone really holds, not one made up."""
        return key in self._known

    async def resolve(self, keys: Iterable[str]) -> dict[str, uuid.UUID]:
        """The tenant id of each of ``keys`` that has one."""
        found: dict[str, uuid.UUID] = {}
        wanted = set(keys)
        while wanted:
            now = trio.current_time()
            mine: list[str] = []
            theirs: dict[_Lookup, list[str]] = {}
            for key in wanted:
                cached = self._known.get(key)
                if cached and cached[1] > now:
                    found[key] = cached[0]
                elif not self._known_unknown(key, now):
                    pending = self._pending.get(key)
                    if pending is None:
                        mine.append(key)
                    else:
                        theirs.setdefault(pending, []).append(key)
            wanted = set()
            if mine:
                found.update(await self._look_up(mine, now))
            for pending, shared in theirs.items():
                await pending.done.wait()
                if pending.error is not None:
                    raise pending.error
                if pending.answer is None:  # its caller was cancelled: look up again
                    wanted.update(shared)
                else:
                    found.update((k, pending.answer[k]) for k in shared if k in pending.answer)
        return found

    async def resolve_one(self, key: str) -> uuid.UUID | None:
        return (await self.resolve([key])).get(key)

    async def _look_up(self, keys: list[str], now: float) -> dict[str, uuid.UUID]:
        pending = _Lookup()
        for key in keys:
            self._pending[key] = pending
        forgotten = self._forgotten
        try:
            pending.answer = await self._lookup(sorted(keys))
        except Exception as exc:
            pending.error = exc
            raise
        finally:
            for key in keys:
                if self._pending.get(key) is pending:
                    del self._pending[key]
            pending.done.set()
        looked_up = pending.answer
        for key in keys:
            if key not in looked_up:
                self._known.pop(key, None)  # expired, and now gone
        if forgotten == self._forgotten:
            for key, tenant_id in looked_up.items():
                self._known[key] = (tenant_id, now + self._ttl)
            if self._remember_unknown:
                for key in keys:
                    if key not in looked_up:
                        self._add_unknown(key, now + self._unknown_ttl)
        return looked_up

    def _known_unknown(self, key: str, now: float) -> bool:
        expiry = self._unknown.get(key)
        if expiry is None:
            return False
        if expiry <= now:
            del self._unknown[key]
            return False
        self._unknown.move_to_end(key)
        return True

    def _add_unknown(self, key: str, expiry: float) -> None:
        self._unknown[key] = expiry
        self._unknown.move_to_end(key)
        while len(self._unknown) > self._max_unknown:
            self._unknown.popitem(last=False)

    def forget(self, tenant_id: uuid.UUID) -> None:
        """Drop every entry of ``tenant_id`` (its row changed) and every unknown key."""
        self._forgotten += 1
        self._known = {k: v for k, v in self._known.items() if v[0] != tenant_id}
        self._unknown.clear()
        self._pending.clear()

    def forget_all(self) -> None:
        """Drop every entry (changes may have been missed)."""
        self._forgotten += 1
        self._known.clear()
        self._unknown.clear()
        self._pending.clear()

    def __len__(self) -> int:
        return len(self._known)

    @property
    def unknown_count(self) -> int:
        """How many keys are remembered as unknown (expired ones included until asked for)."""
        return len(self._unknown)


class Forgets(Protocol):
    """A per-tenant cache that a tenant change empties (a ``TenantCache``, the event-type
    catalogs of ``notifier.catalog``)."""

    def forget(self, tenant_id: uuid.UUID) -> None: ...

    def forget_all(self) -> None: ...


class TenantCaches:
    """The tenant caches of one process, forgotten together: ``cache`` makes one (kept only
    as long as its user keeps it), ``register`` adds another kind, ``forget``/``forget_all``
    reach every one, ``forget_catalog`` only those registered as ``catalog`` (a change of a
    tenant's event types, NOTIFYed on a channel of its own, leaves its keys alone)."""

    def __init__(self, ttl_seconds: float = TENANT_CACHE_SECONDS) -> None:
        self.ttl_seconds = ttl_seconds
        self._caches: weakref.WeakSet[Forgets] = weakref.WeakSet()
        self._catalogs: weakref.WeakSet[Forgets] = weakref.WeakSet()

    def register(self, cache: Forgets, *, catalog: bool = False) -> None:
        """Forget in ``cache`` too (kept only as long as its user keeps it); with ``catalog``,
        on a change of the tenant's event-type catalog as well."""
        self._caches.add(cache)
        if catalog:
            self._catalogs.add(cache)

    def forget_catalog(self, tenant_id: uuid.UUID) -> None:
        """The tenant's event-type catalog changed: forget it in the catalog caches only."""
        for cache in list(self._catalogs):
            cache.forget(tenant_id)

    def cache(
        self,
        lookup: Callable[[Sequence[str]], Awaitable[dict[str, uuid.UUID]]],
        *,
        remember_unknown: bool = False,
    ) -> TenantCache:
        made = TenantCache(lookup, self.ttl_seconds, remember_unknown=remember_unknown)
        self._caches.add(made)
        return made

    def forget(self, tenant_id: uuid.UUID) -> None:
        for cache in list(self._caches):
            cache.forget(tenant_id)

    def forget_all(self) -> None:
        for cache in list(self._caches):
            cache.forget_all()


class TenantChanges(Protocol):
    """One LISTEN connection on the tenants' and the catalogs' channels
    (``Store.open_tenant_changes``): ``listening`` False when there is nothing to LISTEN on
    (iterating then waits for ever); iterating yields (channel, NOTIFY payload: a tenant id)
    and ends when the connection is lost."""

    @property
    def listening(self) -> bool: ...

    def __aiter__(self) -> AsyncIterator[tuple[str, str]]: ...


class TenantChangeStore(Protocol):
    def open_tenant_changes(self) -> AbstractAsyncContextManager[TenantChanges]: ...


async def keep_tenant_caches_fresh(
    store: TenantChangeStore,
    caches: TenantCaches,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Forget a tenant in ``caches`` on every NOTIFY of its id, for ever
    (cancel it to stop): on the tenants' channel in every cache, on the catalogs' channel in
    the catalog caches only.

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
        async for channel, payload in changes:
            _forget(caches, payload, catalog=channel == CATALOGS_CHANNEL)

    ttl = f"{caches.ttl_seconds:g} s TTL"
    await relisten(
        store.open_tenant_changes, use, log=log, what="tenant changes",
        lost=f"the tenant changes LISTEN connection was lost; tenant caches are bounded by "
        f"their {ttl} until it is back",
        failed=f"listening for tenant changes failed (tenant caches are bounded by their {ttl})",
        task_status=task_status,
    )  # fmt: skip


def _forget(caches: TenantCaches, payload: str, *, catalog: bool) -> None:
    try:
        tenant_id = uuid.UUID(payload)
    except ValueError:
        # Not ours (anyone may NOTIFY on the channel): the safe reading is "something changed".
        log.warning("unexpected tenant change notification: forgetting every tenant")
        caches.forget_all()
        return
    if catalog:
        caches.forget_catalog(tenant_id)
    else:
        caches.forget(tenant_id)
