"""The group commit of single events on the real Postgres: the events of concurrent requests
stored by one call (``ingest.events.store_each`` under ``GroupCommit``), each with its own
outcome — a conflicting or refused event fails alone, the others are stored, replays answer as
they would alone, and an event Postgres cannot store takes only itself down."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import msgspec
import pytest
import trio
import trio.testing

from notifier.config import Config
from notifier.errors import UnstorableText
from notifier.ingest.events import Outcome, Pair, new_event, store_each
from notifier.ingest.groupcommit import GroupCommit
from notifier.ingest.models import EventIn
from notifier.ingest.tenants import hash_api_key
from notifier.store import IdempotencyConflict, Store, UnknownChannels, open_store
from notifier.store.rows import IngestResult
from tests.integration.conftest import count_rows, create_tenant, run_notifier

pytestmark = pytest.mark.integration


class Held:
    """The real store's ``ingest_each``, the first call held until ``release``; records the size
    of every call."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.release = trio.Event()
        self.calls: list[int] = []

    async def ingest_each(
        self, events: Sequence[Pair], max_attempts: Mapping[str, int]
    ) -> list[Outcome]:
        self.calls.append(len(events))
        if len(self.calls) == 1:
            await self.release.wait()
        return await self.store.ingest_each(events, max_attempts)


async def together(store: Store, pairs: list[Pair]) -> list[object]:
    """A lone lead event (held), then ``pairs``, sent one after the other while it is held: they
    are stored together by one call. Their outcomes (or errors), in order."""
    held = Held(store)
    commit = GroupCommit(store_each(held, {}))
    got: dict[int, object] = {}

    async def send(i: int, pair: Pair) -> None:
        got[i] = await commit(pair)

    lead = (pairs[0][0], new_event(EventIn(type="gc.lead", payload={}), None))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, -1, lead)
            await trio.testing.wait_all_tasks_blocked()
            for i, pair in enumerate(pairs):
                nursery.start_soon(send, i, pair)
                await trio.testing.wait_all_tasks_blocked()
            held.release.set()
    assert held.calls[:2] == [1, len(pairs)]  # the lead alone, then all of them in one call
    assert isinstance(got[-1], IngestResult)
    return [got[i] for i in range(len(pairs))]


def ev(key: str | None = None, **payload: int) -> EventIn:
    return EventIn(type="gc.test", payload=payload, idempotency_key=key)


async def tenant(store: Store, db: str) -> uuid.UUID:
    found = await store.tenant_by_key_hash(hash_api_key(await create_tenant(db)))
    assert found is not None
    return found


async def test_events_stored_together_keep_their_own_outcomes(config: Config) -> None:
    db = config.database.url
    async with open_store(db, max_size=4) as store:
        a, b = await tenant(store, db), await tenant(store, db)
        channel = await store.create_channel(
            a, type="webhook", name="", config={"url": "http://127.0.0.1:9/hook"},
            recipient=None, event_types=["*"], enabled=True, max_attempts=None,
        )  # fmt: skip
        (stored,) = await store.ingest(a, [new_event(ev("k1", n=1), "k1")], {})
        unknown = uuid.uuid4()
        with_unknown = EventIn(type="gc.test", payload={}, channel_ids=[channel.id, unknown])
        outcomes = await together(store, [
            (a, new_event(ev(n=2), None)),  # new
            (a, new_event(ev("k1", n=1), "k1")),  # a replay of the stored one
            (a, new_event(ev("k1", n=9), "k1")),  # the stored key, another body
            (a, new_event(with_unknown, None)),  # names a channel it does not have
            (a, new_event(ev("k2", n=1), "k2")),  # a new key ...
            (a, new_event(ev("k2", n=2), "k2")),  # ... reused in the same batch: conflicts
            (a, new_event(ev("k2", n=1), "k2")),  # ... replayed in the same batch
            (b, new_event(ev("k1", n=5), "k1")),  # another tenant's own k1
        ])  # fmt: skip
        new, replay, conflict, refused, k2, k2_conflict, k2_replay, other = outcomes
        assert isinstance(new, IngestResult)
        assert new.created
        assert [d.channel_id for d in new.event.deliveries] == [channel.id]
        assert isinstance(replay, IngestResult)
        assert not replay.created
        assert replay.event.id == stored.event.id
        assert replay.event.deliveries == stored.event.deliveries
        assert isinstance(conflict, IdempotencyConflict)
        assert conflict.key == "k1"
        assert isinstance(refused, UnknownChannels)
        assert refused.ids == [unknown]
        assert isinstance(k2, IngestResult)
        assert k2.created
        assert isinstance(k2_conflict, IdempotencyConflict)
        assert k2_conflict.key == "k2"
        assert isinstance(k2_replay, IngestResult)
        assert not k2_replay.created
        assert k2_replay.event.id == k2.event.id
        assert isinstance(other, IngestResult)
        assert other.created
    # The stored one, the lead, new, k2 and tenant b's k1; one delivery each for tenant a's.
    rows = await count_rows(db)
    assert rows["events"] == 5
    assert rows["deliveries"] == rows["outbox"] == 4


async def test_an_event_postgres_cannot_store_fails_alone(config: Config) -> None:
    db = config.database.url
    async with open_store(db, max_size=4) as store:
        a = await tenant(store, db)
        nul = msgspec.structs.replace(
            new_event(ev(), None), payload=msgspec.Raw(b'{"text": "\\u0000"}')
        )  # the HTTP API refuses this body earlier; here it reaches Postgres
        outcomes = await together(store, [
            (a, new_event(ev(n=1), None)), (a, nul), (a, new_event(ev(n=2), None)),
        ])  # fmt: skip
    assert isinstance(outcomes[0], IngestResult)
    assert outcomes[0].created
    assert isinstance(outcomes[1], UnstorableText)
    assert isinstance(outcomes[2], IngestResult)
    assert outcomes[2].created
    assert (await count_rows(db))["events"] == 3  # the lead and the two good ones


async def test_concurrent_posts_each_get_their_own_answer_over_http(config: Config) -> None:
    """Through the running service: many single-event POSTs at once, among them pairs reusing
    one idempotency key with different bodies — one of each pair is accepted and the other alone
    answers 409; every other request is accepted. (Which requests share a batch is not observed
    here; the tests above and tests/unit/test_api_unit.py hold requests in one batch.)"""
    db = config.database.url
    key = await create_tenant(db)
    pairs, plain = 10, 20
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        resp = await api.post("/v1/channels", json={
            "type": "webhook", "config": {"url": "http://127.0.0.1:9/hook"}})  # fmt: skip
        assert resp.status_code == 201, resp.text
        bodies = [
            {"type": "gc.http", "payload": {"side": side}, "idempotency_key": f"pair-{n}"}
            for n in range(pairs) for side in ("a", "b")
        ] + [{"type": "gc.http", "payload": {"n": n}} for n in range(plain)]  # fmt: skip
        statuses: dict[int, int] = {}

        async def post(i: int) -> None:
            statuses[i] = (await api.post("/v1/events", json=bodies[i])).status_code

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(len(bodies)):
                    nursery.start_soon(post, i)
    for n in range(pairs):
        assert sorted([statuses[2 * n], statuses[2 * n + 1]]) == [202, 409], n
    assert [statuses[i] for i in range(2 * pairs, len(bodies))] == [202] * plain
    rows = await count_rows(db)
    assert rows["events"] == rows["deliveries"] == pairs + plain
