"""The limit of 401s per client address (``notifier.ingest.unauthorized``): how addresses are
keyed, the bucket on virtual time, the table's bound, and the HTTP API's answers with it on the
in-memory store (429 ``too_many_unauthorized`` without a lookup, a valid key never limited)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import trio
import trio.testing
from quart import typing as quart_typing

from notifier.config import parse_config
from notifier.errors import ConfigError
from notifier.ingest.app import create_app
from notifier.ingest.tenants import hash_api_key
from notifier.ingest.unauthorized import MAX_ADDRESSES, UnauthorizedLimit, address_key
from notifier.metrics import Metrics
from notifier.testing import RecordingAdapter
from notifier.testing.api import MemoryApiStore


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),  # IPv4: the address itself
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),  # IPv6: its /64
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),  # the same /64
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),  # the next /64 is another client
        ("::ffff:192.0.2.7", "192.0.2.7"),  # IPv4-mapped: the IPv4 client
        ("", ""),  # no address (a Unix socket): one shared key
        (None, ""),
        ("not-an-ip", "not-an-ip"),
    ],
)
def test_address_keys(address: str | None, key: str) -> None:
    assert address_key(address) == key


async def test_a_burst_then_the_rate(mock_clock: trio.testing.MockClock) -> None:
    limit = UnauthorizedLimit(10, 100)
    for _ in range(100):
        assert limit.take("192.0.2.1") is None
    assert limit.take("192.0.2.1") == pytest.approx(0.1)
    assert limit.take("192.0.2.2") is None  # another address has its own bucket
    await trio.sleep(0.1)
    assert limit.take("192.0.2.1") is None  # one token back after 1/rate s
    assert limit.take("192.0.2.1") == pytest.approx(0.1)
    await trio.sleep(10)
    for _ in range(100):  # full again after burst/rate s, never more than the burst
        assert limit.take("192.0.2.1") is None
    assert limit.take("192.0.2.1") is not None


async def test_one_ipv6_64_shares_one_bucket(mock_clock: trio.testing.MockClock) -> None:
    limit = UnauthorizedLimit(1, 2)
    assert limit.take("2001:db8::1") is None
    assert limit.take("2001:db8::2") is None
    assert limit.take("2001:db8::ffff") == pytest.approx(1.0)
    assert limit.take("2001:db8:0:1::1") is None


async def test_a_token_given_back_is_never_spent(mock_clock: trio.testing.MockClock) -> None:
    limit = UnauthorizedLimit(1, 3)
    for _ in range(1000):
        assert limit.take("192.0.2.1") is None
        limit.give_back("192.0.2.1")
    assert len(limit) == 0  # a full bucket is not kept
    for _ in range(3):
        assert limit.take("192.0.2.1") is None
    assert limit.take("192.0.2.1") is not None


async def test_the_table_keeps_at_most_its_bound(mock_clock: trio.testing.MockClock) -> None:
    assert MAX_ADDRESSES == 10_000
    limit = UnauthorizedLimit(1, 1)
    for n in range(MAX_ADDRESSES + 5_000):
        limit.take(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")
    assert len(limit) == MAX_ADDRESSES
    small = UnauthorizedLimit(1, 1, max_addresses=2)
    small.take("192.0.2.1")
    small.take("192.0.2.2")
    small.take("192.0.2.1")  # the most recent now
    small.take("192.0.2.3")  # over the bound: 192.0.2.2, the least recent, is dropped
    assert small.take("192.0.2.1") is not None  # still empty
    assert small.take("192.0.2.2") is None  # starts again full


def test_the_keys_are_validated() -> None:
    config = parse_config({}, env={})
    assert config.ingest.unauthorized_per_address_per_second == 10
    assert config.ingest.unauthorized_burst == 100
    for bad in ({"unauthorized_per_address_per_second": -1}, {"unauthorized_burst": 0},
                {"unauthorized_per_address_per_second": float("inf")}):  # fmt: skip
        with pytest.raises(ConfigError) as raised:
            parse_config({"ingest": bad}, env={})
        assert "ingest." + next(iter(bad)) in str(raised.value)


# -- the HTTP API with the limit --------------------------------------------------------------


class CountingStore(MemoryApiStore):
    """The in-memory store, counting tenant lookups (what a Postgres query would cost)."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    async def tenant_by_key_hash(self, api_key_hash: str) -> uuid.UUID | None:
        self.lookups += 1
        return await super().tenant_by_key_hash(api_key_hash)


class Api:
    def __init__(self, **ingest: Any) -> None:
        self.store = CountingStore()
        self.metrics = Metrics(environ={})
        config = parse_config({"workers": {"webhook": {}}, "ingest": ingest}, env={})
        app = create_app(
            self.store, config, {"webhook": RecordingAdapter("webhook")}, metrics=self.metrics
        )
        self.client: quart_typing.TestClientProtocol = app.test_client()

    async def get(self, key: str | None, address: str = "192.0.2.1") -> tuple[int, Any, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        resp = await self.client.get(
            "/v1/channels", headers=headers, scope_base={"client": (address, 40000)}
        )
        return resp.status_code, await resp.get_json(), resp.headers

    def refused(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "notifier_ingest_unauthorized_total", {"reason": reason}
        )
        return value or 0.0


async def test_too_many_401s_from_an_address_answer_429_without_a_lookup(
    mock_clock: trio.testing.MockClock,
) -> None:
    api = Api(unauthorized_per_address_per_second=1, unauthorized_burst=3)
    for n in range(3):
        status, body, _ = await api.get(f"made-up-{n}")
        assert (status, body["error"]["code"]) == (401, "unauthorized")
    status, body, headers = await api.get("made-up-3")
    assert (status, body["error"]["code"]) == (429, "too_many_unauthorized")
    assert headers["Retry-After"] == "1"
    status, _, _ = await api.get(None)  # a missing key spends the same tokens
    assert status == 429
    assert api.store.lookups == 3
    assert (api.refused("unknown_key"), api.refused("limited")) == (3, 2)
    status, _, _ = await api.get("made-up-4", address="192.0.2.2")  # another client
    assert status == 401
    await trio.sleep(1)
    status, _, _ = await api.get(None)
    assert status == 401
    assert api.refused("missing_key") == 1


async def test_a_valid_key_is_never_limited(mock_clock: trio.testing.MockClock) -> None:
    api = Api(unauthorized_per_address_per_second=1, unauthorized_burst=2)
    await api.store.create_tenant("a", hash_api_key("key-a"))
    await api.store.create_tenant("b", hash_api_key("key-b"))
    for _ in range(50):  # each gives back the token it took, or takes none (cached)
        await trio.sleep(5)  # past the cache's TTL: looked up again each time
        assert (await api.get("key-a"))[0] == 200
    assert api.store.lookups == 50
    assert (await api.get("made-up-1"))[0] == 401
    assert (await api.get("key-b"))[0] == 200  # a token taken, given back
    assert (await api.get("made-up-2"))[0] == 401
    assert (await api.get("made-up-3"))[0] == 429  # the flood is limited...
    await trio.sleep(5)  # the bucket is full again, key-a's cache entry expired
    for n in (4, 5):
        assert (await api.get(f"made-up-{n}"))[0] == 401
    assert (await api.get("made-up-6"))[0] == 429  # the flood empties the bucket again...
    lookups = api.store.lookups
    assert (await api.get("key-a"))[0] == 200  # ...its neighbours' keys are not refused
    assert api.store.lookups == lookups + 1  # (looked up again: a key valid before)


async def test_the_same_unknown_key_again_costs_no_lookup(
    mock_clock: trio.testing.MockClock,
) -> None:
    api = Api(unauthorized_per_address_per_second=0)  # no limit: the cache alone
    for _ in range(200):
        assert (await api.get("made-up"))[0] == 401
    assert api.store.lookups == 1
    await api.store.create_tenant("late", hash_api_key("made-up"))
    await trio.sleep(30)  # without a notification: the memory's 30 s
    assert (await api.get("made-up"))[0] == 200
    assert api.store.lookups == 2
