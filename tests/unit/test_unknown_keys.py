"""The tenant cache's memory of keys that match no tenant (expiry, its bound, forgetting on a
tenant change) and its one lookup for concurrent resolves of a key, on virtual time."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest
import trio
import trio.testing

from notifier.errors import StoreUnavailable
from notifier.ingest.tenants import (
    UNKNOWN_KEY_CACHE_ENTRIES,
    UNKNOWN_KEY_CACHE_SECONDS,
    TenantCache,
    TenantCaches,
    keep_tenant_caches_fresh,
)
from notifier.store.listen import TENANTS_CHANNEL
from tests.unit.test_tenant_cache import FakeListenStore

A, NEW = uuid.uuid4(), uuid.uuid4()


class Lookups:
    """A store's lookup: key → tenant id from ``rows``; records every call. With ``gate`` set,
    each call reads ``rows`` and then waits for it before answering (the store is slow)."""

    def __init__(self) -> None:
        self.rows = {"key-a": A}
        self.calls: list[list[str]] = []
        self.gate: trio.Event | None = None
        self.fail: Exception | None = None

    async def __call__(self, keys: Sequence[str]) -> dict[str, uuid.UUID]:
        self.calls.append(list(keys))
        found = {k: self.rows[k] for k in keys if k in self.rows}  # read, then answered
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return found


def remembering(lookups: Lookups, **options: int) -> TenantCache:
    return TenantCache(lookups, ttl_seconds=5, remember_unknown=True, **options)


async def test_an_unknown_key_is_looked_up_once_until_its_memory_expires(
    mock_clock: trio.testing.MockClock,
) -> None:
    assert UNKNOWN_KEY_CACHE_SECONDS == 30
    lookups = Lookups()
    cache = remembering(lookups)
    for _ in range(100):
        assert await cache.resolve_one("made-up") is None
    assert lookups.calls == [["made-up"]]
    assert cache.unknown_count == 1
    await trio.sleep(29.9)
    assert await cache.resolve_one("made-up") is None
    assert len(lookups.calls) == 1
    await trio.sleep(0.1)  # 30 s after the lookup
    assert await cache.resolve_one("made-up") is None
    assert lookups.calls == [["made-up"], ["made-up"]]


async def test_without_remember_unknown_every_resolve_looks_up(
    mock_clock: trio.testing.MockClock,
) -> None:
    # AMQP ingest's cache of tenant names: a name refused is not remembered.
    lookups = Lookups()
    cache = TenantCache(lookups, ttl_seconds=5)
    for _ in range(3):
        assert await cache.resolve_one("no-such-tenant") is None
    assert len(lookups.calls) == 3
    assert cache.unknown_count == 0


async def test_the_memory_holds_at_most_its_bound_dropping_the_least_recently_asked(
    mock_clock: trio.testing.MockClock,
) -> None:
    assert UNKNOWN_KEY_CACHE_ENTRIES == 10_000
    lookups = Lookups()
    cache = remembering(lookups, max_unknown=3)
    for key in ("k1", "k2", "k3"):
        await cache.resolve_one(key)
    await cache.resolve_one("k1")  # asked again: now the most recent
    await cache.resolve_one("k4")  # over the bound: k2 goes
    assert cache.unknown_count == 3
    lookups.calls.clear()
    for key in ("k1", "k3", "k4"):
        await cache.resolve_one(key)
    assert lookups.calls == []
    await cache.resolve_one("k2")
    assert lookups.calls == [["k2"]]
    assert cache.unknown_count == 3


async def test_the_default_bound_is_kept_under_a_flood_of_distinct_keys(
    mock_clock: trio.testing.MockClock,
) -> None:
    cache = remembering(Lookups())
    await cache.resolve(f"k{n}" for n in range(UNKNOWN_KEY_CACHE_ENTRIES + 500))
    assert cache.unknown_count == UNKNOWN_KEY_CACHE_ENTRIES


@pytest.mark.parametrize("how", ["forget", "forget_all"])
async def test_any_tenant_change_forgets_every_unknown_key(
    mock_clock: trio.testing.MockClock, how: str
) -> None:
    lookups = Lookups()
    cache = remembering(lookups)
    assert await cache.resolve_one("key-new") is None
    lookups.rows["key-new"] = NEW  # the tenant is created (or a key rotated to it)
    if how == "forget":
        cache.forget(NEW)
    else:
        cache.forget_all()
    assert cache.unknown_count == 0
    assert await cache.resolve_one("key-new") == NEW
    assert trio.current_time() == 0  # at once, not after the memory's 30 s


async def test_the_notification_of_a_new_tenant_forgets_unknown_keys_in_every_cache(
    mock_clock: trio.testing.MockClock,
) -> None:
    store, caches = FakeListenStore(), TenantCaches(ttl_seconds=5)
    lookups = Lookups()
    async with trio.open_nursery() as nursery:
        await nursery.start(keep_tenant_caches_fresh, store, caches)
        cache = caches.cache(lookups, remember_unknown=True)
        assert await cache.resolve_one("key-new") is None
        lookups.rows["key-new"] = NEW
        await store.connections[0].send(
            (TENANTS_CHANNEL, str(NEW))
        )  # migrations/0006: INSERT is NOTIFYed
        await trio.testing.wait_all_tasks_blocked()
        assert await cache.resolve_one("key-new") == NEW
        assert trio.current_time() == 0
        nursery.cancel_scope.cancel()


async def test_a_lookup_under_way_when_a_tenant_changes_remembers_nothing_unknown(
    mock_clock: trio.testing.MockClock,
) -> None:
    lookups = Lookups()
    lookups.gate = trio.Event()
    cache = remembering(lookups)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cache.resolve_one, "key-new")
        await trio.testing.wait_all_tasks_blocked()
        cache.forget(NEW)  # the tenant was created while the lookup read the table
        lookups.gate.set()
    assert cache.unknown_count == 0


async def test_concurrent_resolves_of_one_key_share_one_lookup(
    mock_clock: trio.testing.MockClock,
) -> None:
    lookups = Lookups()
    lookups.gate = trio.Event()
    cache = remembering(lookups)
    answers: list[uuid.UUID | None] = []

    async def resolve(key: str) -> None:
        answers.append(await cache.resolve_one(key))

    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(resolve, "made-up")
            nursery.start_soon(resolve, "key-a")
        await trio.testing.wait_all_tasks_blocked()
        lookups.gate.set()
    assert sorted(lookups.calls) == [["key-a"], ["made-up"]]
    assert answers.count(None) == 50
    assert answers.count(A) == 50


async def test_a_failed_shared_lookup_fails_every_resolve_waiting_for_it(
    mock_clock: trio.testing.MockClock,
) -> None:
    lookups = Lookups()
    lookups.gate = trio.Event()
    lookups.fail = StoreUnavailable("Postgres unavailable")
    cache = remembering(lookups)
    failed: list[BaseException] = []

    async def resolve() -> None:
        try:
            await cache.resolve_one("made-up")
        except StoreUnavailable as exc:
            failed.append(exc)

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(resolve)
        await trio.testing.wait_all_tasks_blocked()
        lookups.gate.set()
    assert len(failed) == 10
    assert len(lookups.calls) == 1
    assert cache.unknown_count == 0  # a failure says nothing of the key


async def test_a_cancelled_shared_lookup_is_made_again_by_those_waiting_for_it(
    mock_clock: trio.testing.MockClock,
) -> None:
    lookups = Lookups()
    lookups.gate = trio.Event()
    cache = remembering(lookups)
    answers: list[uuid.UUID | None] = []

    async def waiter() -> None:
        answers.append(await cache.resolve_one("key-a"))

    first = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_in_scope, first, cache)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        first.cancel()  # the client that asked first went away
        await trio.testing.wait_all_tasks_blocked()
        lookups.gate.set()
    assert answers == [A]
    assert lookups.calls == [["key-a"], ["key-a"]]


async def _in_scope(scope: trio.CancelScope, cache: TenantCache) -> None:
    with scope:
        await cache.resolve_one("key-a")


async def test_a_resolve_after_a_change_does_not_wait_for_a_lookup_from_before_it(
    mock_clock: trio.testing.MockClock,
) -> None:
    lookups = Lookups()
    lookups.gate = trio.Event()
    cache = remembering(lookups)
    answers: list[uuid.UUID | None] = []

    async def resolve() -> None:
        answers.append(await cache.resolve_one("key-new"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(resolve)  # reads the table before the tenant exists
        await trio.testing.wait_all_tasks_blocked()
        lookups.rows["key-new"] = NEW
        cache.forget(NEW)
        nursery.start_soon(resolve)  # after the notification: a lookup of its own
        await trio.testing.wait_all_tasks_blocked()
        lookups.gate.set()
    assert lookups.calls == [["key-new"], ["key-new"]]
    assert sorted(map(str, answers)) == sorted([str(None), str(NEW)])


async def test_a_key_found_no_more_is_no_longer_one_that_was_valid(
    mock_clock: trio.testing.MockClock,
) -> None:
    lookups = Lookups()
    cache = remembering(lookups)
    assert not cache.was_valid("key-a")
    await cache.resolve_one("key-a")
    await trio.sleep(10)  # expired: no more cached, still known to have been valid
    assert cache.cached("key-a") is None
    assert cache.was_valid("key-a")
    del lookups.rows["key-a"]  # rotated away, no notification (no LISTEN)
    assert await cache.resolve_one("key-a") is None
    assert not cache.was_valid("key-a")
