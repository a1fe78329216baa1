"""The tenant caches' invalidation: ``forget`` and ``forget_all``, a lookup under way while a
tenant is forgotten, the process's ``TenantCaches``, and ``keep_tenant_caches_fresh`` driven by
a fake of the store's LISTEN (``open_tenant_changes``)."""

from __future__ import annotations

import gc
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from notifier.errors import StoreUnavailable
from notifier.ingest.tenants import (
    TenantCache,
    TenantCaches,
    keep_tenant_caches_fresh,
)
from notifier.store.listen import (
    CATALOGS_CHANNEL,
    RELISTEN_INITIAL_BACKOFF_SECONDS,
    TENANTS_CHANNEL,
)

A, B = uuid.uuid4(), uuid.uuid4()


class Lookups:
    """A store's lookup: key → tenant id from ``rows``; records every call."""

    def __init__(self) -> None:
        self.rows = {"key-a": A, "key-a2": A, "key-b": B}
        self.calls: list[list[str]] = []

    async def __call__(self, keys: Sequence[str]) -> dict[str, uuid.UUID]:
        self.calls.append(list(keys))
        return {k: self.rows[k] for k in keys if k in self.rows}


async def test_forget_drops_only_that_tenants_entries(mock_clock: trio.testing.MockClock) -> None:
    lookups = Lookups()
    cache = TenantCache(lookups, ttl_seconds=60)
    assert await cache.resolve(["key-a", "key-a2", "key-b"]) == {
        "key-a": A, "key-a2": A, "key-b": B,
    }  # fmt: skip
    del lookups.rows["key-a"]  # rotate-key
    cache.forget(A)
    assert len(cache) == 1
    assert await cache.resolve(["key-a", "key-a2", "key-b"]) == {"key-a2": A, "key-b": B}
    assert lookups.calls == [["key-a", "key-a2", "key-b"], ["key-a", "key-a2"]]  # B still cached


async def test_forget_all_drops_every_entry(mock_clock: trio.testing.MockClock) -> None:
    lookups = Lookups()
    cache = TenantCache(lookups, ttl_seconds=60)
    await cache.resolve(["key-a", "key-b"])
    cache.forget_all()
    assert len(cache) == 0
    await cache.resolve(["key-a", "key-b"])
    assert lookups.calls == [["key-a", "key-b"], ["key-a", "key-b"]]


async def test_a_lookup_under_way_when_a_tenant_is_forgotten_is_answered_not_cached(
    mock_clock: trio.testing.MockClock,
) -> None:
    # The lookup may have read the row before the change that the notification announces.
    lookups = Lookups()
    release = trio.Event()

    async def slow(keys: Sequence[str]) -> dict[str, uuid.UUID]:
        found = await lookups(keys)  # read before the change...
        await release.wait()  # ...answered after the notification
        return found

    cache = TenantCache(slow, ttl_seconds=60)
    async with trio.open_nursery() as nursery:
        answers: list[uuid.UUID | None] = []

        async def request() -> None:
            answers.append(await cache.resolve_one("key-a"))

        nursery.start_soon(request)
        await trio.testing.wait_all_tasks_blocked()
        del lookups.rows["key-a"]
        cache.forget(A)
        release.set()
    assert answers == [A]  # the request that started before the change is answered
    assert len(cache) == 0
    assert await cache.resolve_one("key-a") is None  # the next one reads the store again


async def test_the_ttl_bounds_an_entry_that_no_notification_forgets(
    mock_clock: trio.testing.MockClock,
) -> None:
    lookups = Lookups()
    cache = TenantCache(lookups, ttl_seconds=60)
    await cache.resolve_one("key-a")
    del lookups.rows["key-a"]
    await trio.sleep(59.9)
    assert await cache.resolve_one("key-a") == A
    await trio.sleep(0.1)
    assert await cache.resolve_one("key-a") is None


async def test_tenant_caches_reach_every_cache_and_keep_none_alive(
    mock_clock: trio.testing.MockClock,
) -> None:
    caches = TenantCaches(ttl_seconds=60)
    first, second = Lookups(), Lookups()
    one, two = caches.cache(first), caches.cache(second)
    await one.resolve(["key-a", "key-b"])
    await two.resolve(["key-a", "key-b"])
    caches.forget(A)
    assert (len(one), len(two)) == (1, 1)
    caches.forget_all()
    assert (len(one), len(two)) == (0, 0)
    # A cache whose user is gone (AMQP ingest restarted by its supervisor) is not kept.
    del two
    gc.collect()
    assert len(list(caches._caches)) == 1


class FakeChanges:
    def __init__(self, receive: trio.MemoryReceiveChannel[tuple[str, str]] | None) -> None:
        self._receive = receive
        self.listening = receive is not None

    async def __aiter__(self) -> AsyncIterator[tuple[str, str]]:
        if self._receive is None:
            await trio.sleep_forever()
        else:
            async for payload in self._receive:
                yield payload


class FakeListenStore:
    """``open_tenant_changes`` as the store has it: each LISTEN connection is a channel the
    test sends payloads on and closes to lose the connection; ``refuse`` fails the next opens."""

    def __init__(self, *, can_listen: bool = True) -> None:
        self.can_listen = can_listen
        self.connections: list[trio.MemorySendChannel[tuple[str, str]]] = []
        self.opened_at: list[float] = []
        self.refuse = 0

    @asynccontextmanager
    async def open_tenant_changes(self) -> AsyncIterator[FakeChanges]:
        self.opened_at.append(trio.current_time())
        if self.refuse:
            self.refuse -= 1
            raise StoreUnavailable("Postgres unavailable")
        if not self.can_listen:
            yield FakeChanges(None)
            return
        send, receive = trio.open_memory_channel[tuple[str, str]](10)
        self.connections.append(send)
        yield FakeChanges(receive)


async def cached(caches: TenantCaches) -> TenantCache:
    cache = caches.cache(Lookups())
    await cache.resolve(["key-a", "key-b"])
    return cache


async def test_a_notification_forgets_its_tenant_in_every_cache(
    mock_clock: trio.testing.MockClock,
) -> None:
    store, caches = FakeListenStore(), TenantCaches(ttl_seconds=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(keep_tenant_caches_fresh, store, caches)
        one, two = await cached(caches), await cached(caches)
        await store.connections[0].send((TENANTS_CHANNEL, str(A)))
        await trio.testing.wait_all_tasks_blocked()
        assert (len(one), len(two)) == (1, 1)  # B's entries stay
        assert trio.current_time() == 0  # at once, not after a TTL
        nursery.cancel_scope.cancel()


class ForgottenCatalogs:
    """A catalog cache as ``TenantCaches`` reaches it: records what it was told to forget."""

    def __init__(self) -> None:
        self.forgotten: list[uuid.UUID | None] = []

    def forget(self, tenant_id: uuid.UUID) -> None:
        self.forgotten.append(tenant_id)

    def forget_all(self) -> None:
        self.forgotten.append(None)


async def test_a_catalog_change_forgets_the_catalog_and_leaves_the_key_caches_alone(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A tenant writing its event types (NOTIFYed on ``notifier_catalogs``) must not empty the
    keys cached (nor the unknown keys remembered) for every tenant."""
    store, caches = FakeListenStore(), TenantCaches(ttl_seconds=60)
    catalogs = ForgottenCatalogs()
    caches.register(catalogs, catalog=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(keep_tenant_caches_fresh, store, caches)
        lookups = Lookups()
        keys = caches.cache(lookups, remember_unknown=True)
        await keys.resolve(["key-a", "key-b", "nobody's key"])
        assert (len(keys), keys.unknown_count) == (2, 1)
        catalogs.forgotten.clear()  # the LISTEN's start forgot everything
        await store.connections[0].send((CATALOGS_CHANNEL, str(A)))
        await trio.testing.wait_all_tasks_blocked()
        assert catalogs.forgotten == [A]
        assert (len(keys), keys.unknown_count) == (2, 1)
        await keys.resolve(["key-a", "nobody's key"])
        assert len(lookups.calls) == 1  # no lookup: all still cached
        await store.connections[0].send((TENANTS_CHANNEL, str(A)))  # the tenant's row changed
        await trio.testing.wait_all_tasks_blocked()
        assert catalogs.forgotten == [A, A]  # its strict_event_types may have
        assert (len(keys), keys.unknown_count) == (1, 0)
        nursery.cancel_scope.cancel()


async def test_a_payload_that_is_no_tenant_id_forgets_everything(
    mock_clock: trio.testing.MockClock,
) -> None:
    store, caches = FakeListenStore(), TenantCaches(ttl_seconds=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(keep_tenant_caches_fresh, store, caches)
        cache = await cached(caches)
        await store.connections[0].send((TENANTS_CHANNEL, "<not a uuid>"))
        await trio.testing.wait_all_tasks_blocked()
        assert len(cache) == 0
        nursery.cancel_scope.cancel()


async def test_a_lost_listen_is_opened_again_and_forgets_everything_then(
    mock_clock: trio.testing.MockClock,
) -> None:
    store, caches = FakeListenStore(), TenantCaches(ttl_seconds=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(keep_tenant_caches_fresh, store, caches)
        await trio.sleep(10)
        store.refuse = 1
        store.connections[0].close()  # the connection is lost
        cache = await cached(caches)  # filled while nobody listens: the TTL bounds it
        # refused after the first backoff (forgets nothing)...
        await trio.sleep(RELISTEN_INITIAL_BACKOFF_SECONDS * 3 - 0.01)
        assert len(cache) == 2
        # ...listening again after a doubled backoff: everything forgotten
        await trio.sleep(0.02)
        backoff = RELISTEN_INITIAL_BACKOFF_SECONDS
        assert store.opened_at == [0, 10 + backoff, 10 + backoff * 3]
        assert len(store.connections) == 2
        assert len(cache) == 0
        await cache.resolve(["key-a", "key-b"])
        await store.connections[1].send((TENANTS_CHANNEL, str(B)))
        await trio.testing.wait_all_tasks_blocked()
        assert len(cache) == 1
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("refused", [False, True])
async def test_without_listen_the_ttl_is_the_bound_and_start_up_goes_on(
    mock_clock: trio.testing.MockClock, refused: bool
) -> None:
    store = FakeListenStore(can_listen=False)
    store.refuse = 1 if refused else 0
    caches = TenantCaches(ttl_seconds=60)
    lookups = Lookups()
    async with trio.open_nursery() as nursery:
        await nursery.start(keep_tenant_caches_fresh, store, caches)
        assert trio.current_time() == 0  # started without waiting for a LISTEN
        await trio.sleep(RELISTEN_INITIAL_BACKOFF_SECONDS * 2)  # past a retry, if refused
        cache = caches.cache(lookups)
        await cache.resolve_one("key-a")
        del lookups.rows["key-a"]
        await trio.sleep(59.9)
        assert await cache.resolve_one("key-a") == A  # nothing forgets it but...
        await trio.sleep(0.1)
        assert await cache.resolve_one("key-a") is None  # ...the TTL
        assert len(store.opened_at) == (2 if refused else 1)  # and no LISTEN is tried again
        nursery.cancel_scope.cancel()
