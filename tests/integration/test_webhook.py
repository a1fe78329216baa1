"""The webhook adapter for real: Standard Webhooks signatures checked with the ``standardwebhooks``
package (also during a secret rotation), redirects not followed, 410 disabling the channel, and
the SSRF guard (docs/architecture.md §9): blocked addresses in every notation refused at channel
create and at delivery without any connection attempt, DNS answers checked and the checked address
dialed.

The first part runs the whole service on the real Postgres and RabbitMQ; the second drives a
``WebhookAdapter`` directly against a local sink, with a fake resolver and a recording dialer
passed to its constructor.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import standardwebhooks
import trio

from notifier.adapters.webhook import WebhookAdapter, WebhookChannels, generate_secret
from notifier.config import Config
from notifier.errors import PermanentError, RetriableError
from notifier.messages import WorkerMessage
from notifier.testing import Received, open_sink
from tests.integration.conftest import (
    create_tenant,
    make_config,
    poll,
    run_notifier,
    scalar,
    tls_server,
    verify,
    verify_all,
)

pytestmark = pytest.mark.integration


# -- fakes --------------------------------------------------------------------------------------


class FakeDns:
    """A resolver for ``WebhookAdapter(resolver=...)`` and ``WebhookChannels(resolver=...)``:
    answers from ``records`` (change them between calls to rebind a name), records every query,
    fails for unknown names."""

    def __init__(self, records: dict[str, Sequence[str]] | None = None) -> None:
        self.records = dict(records or {})
        self.queries: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        self.queries.append((host, port))
        if host not in self.records:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.records[host])


class HangingDns:
    """A resolver that never answers."""

    async def __call__(self, host: str, port: int) -> list[str]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


class RecordingDialer:
    """A TCP dialer for ``WebhookAdapter(dialer=...)``, recording every address it is asked to
    dial."""

    def __init__(self) -> None:
        self.dialed: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> trio.abc.Stream:
        self.dialed.append((host, port))
        return await trio.open_tcp_stream(host, port)


def signatures(received: Received) -> list[str]:
    return received.headers["webhook-signature"].split(" ")


def verifies_alone(received: Received, signature: str, secret: str) -> bool:
    headers = {**received.headers, "webhook-signature": signature}
    try:
        standardwebhooks.Webhook(secret).verify(received.body, headers)
    except standardwebhooks.WebhookVerificationError:
        return False
    return True


# -- through the whole service ------------------------------------------------------------------


async def create_channel(api: httpx.AsyncClient, config: dict[str, Any]) -> dict[str, Any]:
    resp = await api.post(
        "/v1/channels", json={"type": "webhook", "config": config, "event_types": ["*"]}
    )
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


async def post_event(api: httpx.AsyncClient, n: int = 1) -> str:
    resp = await api.post("/v1/events", json={"type": "order.created", "payload": {"n": n}})
    assert resp.status_code == 202, resp.text
    (delivery,) = resp.json()["deliveries"]
    return str(delivery["id"])


async def settled(api: httpx.AsyncClient, database_url: str, delivery_id: str) -> dict[str, Any]:
    """Wait until the delivery is DELIVERED or DEAD; return it with its attempts."""

    async def done() -> bool:
        status = await scalar(
            database_url, "SELECT status FROM deliveries WHERE id = $1", uuid.UUID(delivery_id)
        )
        return status in ("DELIVERED", "DEAD")

    with trio.fail_after(20):
        await poll(done)
    resp = await api.get(f"/v1/deliveries/{delivery_id}")
    assert resp.status_code == 200, resp.text
    detail: dict[str, Any] = resp.json()
    return detail


async def test_every_delivery_verifies_with_the_standardwebhooks_package_also_during_rotation(
    config: Config, database_url: str
) -> None:
    old, new = generate_secret(), generate_secret()
    key = await create_tenant(database_url)
    async with open_sink() as sink, run_notifier(config) as running, running.client(key) as api:
        channel = await create_channel(api, {"url": sink.url, "secret": old})
        assert channel["config"]["secret"] == old  # shown once, at create
        first = await post_event(api, 1)
        assert (await settled(api, database_url, first))["status"] == "DELIVERED"
        (before,) = sink.received
        assert verify(before, old) == {
            "type": "order.created",
            "timestamp": before.json()["timestamp"],
            "data": {"n": 1},
        }
        assert len(signatures(before)) == 1

        patched = await api.patch(
            f"/v1/channels/{channel['id']}", json={"config": {"url": sink.url, "secret": new}}
        )
        assert patched.status_code == 200, patched.text
        assert patched.json()["config"] == {"url": sink.url, "headers": {}}  # no secrets shown
        shown = (await api.get(f"/v1/channels/{channel['id']}")).json()["config"]
        assert shown == {"url": sink.url, "headers": {}}

        second = await post_event(api, 2)
        assert (await settled(api, database_url, second))["status"] == "DELIVERED"
        during = sink.received[1]
        assert verify(during, new)["data"] == {"n": 2}  # a receiver with the new secret
        assert verify(during, old)["data"] == {"n": 2}  # and one still on the old secret
        sig_new, sig_old = signatures(during)  # the new secret's signature first
        assert verifies_alone(during, sig_new, new)
        assert not verifies_alone(during, sig_new, old)
        assert verifies_alone(during, sig_old, old)
        assert not verifies_alone(during, sig_old, new)

        # A PATCH of something else keeps the rotation going.
        again = await api.patch(
            f"/v1/channels/{channel['id']}",
            json={"config": {"url": sink.url, "headers": {"X-Team": "billing"}}},
        )
        assert again.status_code == 200, again.text
        third = await post_event(api, 3)
        assert (await settled(api, database_url, third))["status"] == "DELIVERED"
        after = sink.received[2]
        assert after.headers["x-team"] == "billing"
        assert len(signatures(after)) == 2
        verify(after, new)
        verify(after, old)

    stored = await scalar(
        database_url, "SELECT config FROM channels WHERE id = $1", uuid.UUID(channel["id"])
    )
    assert '"previous_secret"' in stored  # kept in the channel's config, never shown


async def test_a_redirect_is_not_followed(config: Config, database_url: str) -> None:
    key = await create_tenant(database_url)
    async with open_sink() as elsewhere:
        target = f"http://127.0.0.1:{elsewhere.port}/elsewhere"
        moved = (302, {"location": target}, b"moved")
        async with (
            open_sink(lambda _: moved) as sink,
            run_notifier(config) as running,
            running.client(key) as api,
        ):
            channel = await create_channel(api, {"url": sink.url})
            delivery = await settled(api, database_url, await post_event(api))
            assert delivery["status"] == "DEAD"
            assert delivery["attempt"] == 1  # permanent: not retried
            assert delivery["last_error"].startswith(f"HTTP 302: redirect to {target} not followed")
            assert delivery["attempts"][0]["status_code"] == 302
            (got,) = sink.received
            verify(got, channel["config"]["secret"])
        assert elsewhere.received == []  # the Location was never requested


async def test_410_kills_the_delivery_and_disables_the_channel(
    config: Config, database_url: str
) -> None:
    key = await create_tenant(database_url)
    gone = (410, {}, b"this endpoint is gone")
    async with (
        open_sink(lambda _: gone) as sink,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        channel = await create_channel(api, {"url": sink.url})
        delivery = await settled(api, database_url, await post_event(api))
        assert delivery["status"] == "DEAD"
        assert delivery["attempt"] == 1
        assert delivery["last_error"].startswith("HTTP 410: this endpoint is gone")
        verify(sink.received[0], channel["config"]["secret"])
        shown = (await api.get(f"/v1/channels/{channel['id']}")).json()
        assert shown["enabled"] is False
        assert "HTTP 410" in shown["disabled_reason"]
        assert shown["disabled_at"] is not None
        # A disabled channel gets no more deliveries.
        resp = await api.post("/v1/events", json={"type": "order.created", "payload": {}})
        assert resp.json()["deliveries"] == []


def strict_config(database_url: str, broker_url: str) -> Config:
    return make_config(
        database_url,
        broker_url,
        workers={"webhook": {"concurrency": 2, "prefetch": 4, "allow_private_networks": False}},
    )


async def test_dns_that_rebinds_to_a_blocked_address_is_refused_at_delivery(
    database_url: str, broker_url: str
) -> None:
    config = strict_config(database_url, broker_url)
    dns = FakeDns({"hook.example": ["93.184.216.34"]})  # public when the channel is created
    backend = RecordingDialer()
    adapter = WebhookAdapter(
        timeout_seconds=5, allow_private_networks=False, resolver=dns, dialer=backend
    )
    validator = WebhookChannels(timeout_seconds=5, allow_private_networks=False, resolver=dns)
    key = await create_tenant(database_url)
    async with (
        open_sink() as sink,
        run_notifier(
            config, adapters={"webhook": adapter}, validators={"webhook": validator}
        ) as running,
        running.client(key) as api,
    ):
        url = f"http://hook.example:{sink.port}/hook"
        await create_channel(api, {"url": url})
        assert dns.queries == [("hook.example", sink.port)]  # checked at create
        dns.records["hook.example"] = ["127.0.0.1"]  # ... and then it points at us
        delivery = await settled(api, database_url, await post_event(api))
        assert delivery["status"] == "DEAD"
        assert delivery["attempt"] == 1
        assert delivery["last_error"].startswith(
            "destination blocked: hook.example resolves to a loopback address"
        )
        assert "127.0.0.1" not in delivery["last_error"]  # the tenant is not told the address
        assert len(dns.queries) == 2
    assert backend.dialed == []  # no connection attempt
    assert sink.received == []


async def test_a_host_resolving_to_a_blocked_address_is_refused_at_create(
    database_url: str, broker_url: str
) -> None:
    config = strict_config(database_url, broker_url)
    dns = FakeDns(
        {
            "internal.example": ["10.0.0.7"],
            "mixed.example": ["93.184.216.34", "169.254.169.254"],  # one blocked is enough
            "public.example": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
        }
    )
    validator = WebhookChannels(timeout_seconds=5, allow_private_networks=False, resolver=dns)
    key = await create_tenant(database_url)
    ingest = run_notifier(config, ("ingest",), validators={"webhook": validator})
    async with ingest as running, running.client(key) as api:
        for host, address, reason in [
            ("internal.example", "10.0.0.7", "private"),
            ("mixed.example", "169.254.169.254", "cloud metadata"),
        ]:
            resp = await post_channel(api, f"https://{host}/hook")
            assert resp.status_code == 422, resp.text
            assert resp.json()["error"]["message"].startswith(
                f"config.url: destination blocked: {host} resolves to a {reason} address"
            )
            assert address not in resp.text  # what an internal name resolves to stays inside
        ok = await post_channel(api, "https://public.example/hook")
        assert ok.status_code == 201, ok.text
        # A name that does not resolve (yet) is accepted: every delivery resolves again.
        later = await post_channel(api, "https://not-yet.example/hook")
        assert later.status_code == 201, later.text
        # A PATCH is checked the same way.
        patched = await api.patch(
            f"/v1/channels/{ok.json()['id']}",
            json={"config": {"url": "https://internal.example/hook"}},
        )
        assert patched.status_code == 422, patched.text
        assert patched.json()["error"]["message"].startswith("config.url: destination blocked")


async def post_channel(api: httpx.AsyncClient, url: str) -> httpx.Response:
    return await api.post("/v1/channels", json={"type": "webhook", "config": {"url": url}})


# Blocked destinations in the notations a resolver or URL parser accepts. ``{port}`` is the
# sink's port: were any of them dialed, the sink (on 127.0.0.1) would see the request.
BLOCKED_URLS = [
    "http://127.0.0.1:{port}/hook",
    "http://2130706433:{port}/hook",  # 127.0.0.1 in decimal
    "http://0x7f.1:{port}/hook",  # ... in hex, two parts
    "http://0x7f000001:{port}/hook",  # ... in hex
    "http://017700000001:{port}/hook",  # ... in octal
    "http://127.1:{port}/hook",  # ... short
    "http://0:{port}/hook",  # 0.0.0.0, which reaches this host
    "http://[::1]:{port}/hook",
    "http://[::ffff:127.0.0.1]:{port}/hook",  # IPv4-mapped
    "http://[::ffff:7f00:1]:{port}/hook",  # ... in hex
    "http://[::127.0.0.1]:{port}/hook",  # IPv4-compatible
    "http://[64:ff9b::a00:1]:{port}/hook",  # NAT64 of 10.0.0.1
    "http://[64:ff9b::7f00:1]:{port}/hook",  # NAT64 of 127.0.0.1
    "http://[2002:7f00:1::1]:{port}/hook",  # 6to4 of 127.0.0.1
    "http://169.254.169.254:{port}/latest/meta-data/",  # cloud metadata
    "http://[fd00:ec2::254]:{port}/latest/meta-data/",  # ... over IPv6
    "http://168.63.129.16:{port}/machine",  # Azure WireServer (a public address)
    "http://169.254.170.23:{port}/v1/credentials",  # EKS Pod Identity
    "http://[fd00:ec2::23]:{port}/v1/credentials",  # ... over IPv6
    "http://10.0.0.1:{port}/hook",
    "http://100.64.0.1:{port}/hook",  # CGNAT
    "http://localhost:{port}/hook",
    "http://localhost.:{port}/hook",  # ... fully qualified
    # Notations httpx maps to 127.0.0.1 (IDNA): ideographic, fullwidth and halfwidth stops.
    "http://127\u30020\u30020\u30021:{port}/hook",
    "http://127\uff0e0\uff0e0\uff0e1:{port}/hook",
    "http://127\uff610\uff610\uff611:{port}/hook",
    "http://0x7f\u30021:{port}/hook",
]


async def test_blocked_addresses_in_every_notation_are_refused_at_create(
    database_url: str, broker_url: str
) -> None:
    config = strict_config(database_url, broker_url)
    key = await create_tenant(database_url)
    async with run_notifier(config, ("ingest",)) as running, running.client(key) as api:
        for template in [*BLOCKED_URLS, "http://0177.0.0.1:{port}/hook"]:
            url = template.format(port=8080)
            resp = await api.post("/v1/channels", json={"type": "webhook", "config": {"url": url}})
            assert resp.status_code == 422, (url, resp.text)
            assert resp.json()["error"]["message"].startswith("config.url: "), url
        assert await scalar(database_url, "SELECT count(*) FROM channels") == 0


# -- the adapter on its own ---------------------------------------------------------------------

SECRET = generate_secret()


def webhook_message(url: str, **config: Any) -> WorkerMessage:
    return WorkerMessage(
        delivery_id=uuid.uuid4(),
        event_id=uuid.uuid4(),
        tenant_id=uuid.uuid4(),
        channel_id=uuid.uuid4(),
        channel_type="webhook",
        channel_config={"url": url, "secret": SECRET, "headers": {}, **config},
        event_type="order.created",
        recipient=None,
        payload={"order": 42},
        created_at=datetime.now(UTC),
        attempt=1,
        max_attempts=5,
    )


@pytest.mark.parametrize("template", BLOCKED_URLS)
async def test_blocked_addresses_in_every_notation_are_refused_at_delivery_without_connecting(
    template: str,
) -> None:
    dns = FakeDns({"localhost": ["127.0.0.1"], "localhost.": ["127.0.0.1"]})  # as /etc/hosts
    backend = RecordingDialer()
    adapter = WebhookAdapter(
        timeout_seconds=5, allow_private_networks=False, resolver=dns, dialer=backend
    )
    async with open_sink() as sink:
        try:
            with pytest.raises(PermanentError, match=r"^destination blocked: "):
                await adapter.deliver(webhook_message(template.format(port=sink.port)))
        finally:
            await adapter.aclose()
    assert backend.dialed == []  # no connection attempt
    assert sink.received == []
    assert all(host.startswith("localhost") for host, _ in dns.queries)  # literals are not


async def test_the_checked_address_is_dialed_with_the_hostname_kept() -> None:
    dns = FakeDns({"hook.example": ["127.0.0.1"]})
    backend = RecordingDialer()
    adapter = WebhookAdapter(
        timeout_seconds=5,
        allow_private_networks=False,
        allowed_cidrs=["127.0.0.1/32"],
        resolver=dns,
        dialer=backend,
    )
    async with open_sink() as sink:
        try:
            url = f"http://hook.example:{sink.port}/hook?x=1"
            for _ in range(2):
                receipt = await adapter.deliver(
                    webhook_message(url, headers={"Authorization": "Bearer t"})
                )
                assert receipt is not None
                assert receipt.status_code == 200
        finally:
            await adapter.aclose()
    assert dns.queries == [("hook.example", sink.port)] * 2  # resolved on every delivery
    assert set(backend.dialed) == {("127.0.0.1", sink.port)}  # only the checked address
    for got in sink.received:
        assert got.headers["host"] == f"hook.example:{sink.port}"
        assert got.path == "/hook?x=1"
        assert got.headers["authorization"] == "Bearer t"
        assert verify(got, SECRET)["data"] == {"order": 42}


async def test_one_blocked_address_among_several_refuses_the_delivery() -> None:
    dns = FakeDns({"hook.example": ["93.184.216.34", "127.0.0.1"]})
    backend = RecordingDialer()
    adapter = WebhookAdapter(
        timeout_seconds=5, allow_private_networks=False, resolver=dns, dialer=backend
    )
    with pytest.raises(PermanentError) as info:
        await adapter.deliver(webhook_message("http://hook.example/hook"))
    assert "hook.example resolves to a loopback address" in str(info.value)
    assert "127.0.0.1" not in str(info.value)
    assert backend.dialed == []


async def test_the_default_resolver_is_checked_too() -> None:
    # localhost is answered from /etc/hosts, as the system resolver would
    backend = RecordingDialer()
    strict = WebhookAdapter(timeout_seconds=5, allow_private_networks=False, dialer=backend)
    lenient = WebhookAdapter(timeout_seconds=5, allow_private_networks=True, dialer=backend)
    async with open_sink() as sink:
        url = f"http://localhost:{sink.port}/hook"
        try:
            with pytest.raises(PermanentError, match=r"localhost resolves to a loopback address"):
                await strict.deliver(webhook_message(url))
            assert backend.dialed == []
            assert await lenient.deliver(webhook_message(url)) is not None
        finally:
            await strict.aclose()
            await lenient.aclose()
    assert backend.dialed == [("127.0.0.1", sink.port)]  # the resolved address, not the name
    assert len(sink.received) == 1
    verify_all(sink.received, SECRET)


async def test_a_name_that_does_not_resolve_is_retriable_and_nothing_is_dialed() -> None:
    backend = RecordingDialer()
    dns = FakeDns({"empty.example": []})
    adapter = WebhookAdapter(
        timeout_seconds=5, allow_private_networks=False, resolver=dns, dialer=backend
    )
    with pytest.raises(RetriableError, match=r"could not resolve nowhere\.example"):
        await adapter.deliver(webhook_message("https://nowhere.example/hook"))
    with pytest.raises(RetriableError, match="no addresses"):
        await adapter.deliver(webhook_message("https://empty.example/hook"))
    assert backend.dialed == []


async def test_a_resolver_that_hangs_is_a_retriable_timeout(autojump_clock: Any) -> None:
    backend = RecordingDialer()
    adapter = WebhookAdapter(
        timeout_seconds=3,
        allow_private_networks=False,
        resolver=HangingDns(),
        dialer=backend,
    )
    with pytest.raises(
        RetriableError, match=r"^could not resolve slow\.example: timed out after 3 s$"
    ):
        await adapter.deliver(webhook_message("https://slow.example/hook"))
    assert backend.dialed == []


@pytest.mark.parametrize(("expires_in", "count"), [(3600, 2), (-1, 1)], ids=["in-grace", "expired"])
async def test_the_previous_secret_signs_until_it_expires(expires_in: int, count: int) -> None:
    old = generate_secret()
    adapter = WebhookAdapter(timeout_seconds=5, allow_private_networks=True)
    async with open_sink() as sink:
        try:
            await adapter.deliver(
                webhook_message(
                    sink.url,
                    previous_secret=old,
                    previous_secret_expires_at=time.time() + expires_in,
                )
            )
        finally:
            await adapter.aclose()
    (got,) = sink.received
    assert len(signatures(got)) == count
    verify(got, SECRET)
    if count == 2:
        verify(got, old)
    else:
        with pytest.raises(standardwebhooks.WebhookVerificationError):
            verify(got, old)


async def test_the_answer_is_read_up_to_64_kib_and_excerpted_to_2_kib() -> None:
    big = "é" * 60_000  # 120,000 bytes of two-byte characters
    adapter = WebhookAdapter(timeout_seconds=5, allow_private_networks=True)
    async with open_sink(lambda _: (200, {}, big.encode())) as sink:
        try:
            receipts = [await adapter.deliver(webhook_message(sink.url)) for _ in range(3)]
        finally:
            await adapter.aclose()
    assert len(sink.received) == 3  # the client stays usable after a cut-off answer
    verify_all(sink.received, SECRET)
    for receipt in receipts:
        assert receipt is not None
        assert receipt.response_excerpt is not None
        assert len(receipt.response_excerpt.encode()) <= 2048
        assert receipt.response_excerpt == "é" * 1024


async def endless_answer(*, task_status: trio.TaskStatus[int]) -> None:
    """An HTTP server whose answer promises 1 GB and sends it slowly: reading to the end
    would take for ever."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def handle(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)  # the request (small: one read)
        try:
            await stream.send_all(b"HTTP/1.1 503 Busy\r\nContent-Length: 1000000000\r\n\r\n")
            while True:
                await stream.send_all(b"x" * 4096)
                await trio.lowlevel.checkpoint()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    await trio.serve_listeners(handle, listeners)


async def test_an_endless_answer_is_cut_at_64_kib() -> None:
    adapter = WebhookAdapter(timeout_seconds=30, allow_private_networks=True)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(endless_answer)
        try:
            with trio.fail_after(10), pytest.raises(RetriableError) as info:
                await adapter.deliver(webhook_message(f"http://127.0.0.1:{port}/hook"))
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert info.value.status_code == 503
    assert str(info.value) == "HTTP 503: " + "x" * 200


async def test_a_connection_is_kept_alive_until_the_server_closes_it() -> None:
    """Deliveries reuse a kept-alive connection; one the server closed while it was idle is
    not reused (its socket is readable: the server's end of it is gone), so the next delivery
    dials again and succeeds instead of failing on a dead connection."""
    served: list[int] = []  # requests answered, one entry per connection
    hung_up = trio.Event()

    async def handle(stream: trio.SocketStream) -> None:
        served.append(0)
        conn = h11.Connection(h11.SERVER)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some())
            elif isinstance(event, h11.ConnectionClosed):
                return
            elif isinstance(event, h11.EndOfMessage):
                served[-1] += 1
                answer = h11.Response(status_code=200, headers=[("content-length", "2")])
                await stream.send_all(conn.send(answer) + (conn.send(h11.Data(data=b"ok")) or b""))
                await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
                if served[-1] == 2:  # two requests, then it closes the idle connection
                    await stream.aclose()
                    hung_up.set()
                    return
                conn.start_next_cycle()

    adapter = WebhookAdapter(timeout_seconds=5, allow_private_networks=True)
    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}/hook"
        try:
            for _ in range(2):
                await adapter.deliver(webhook_message(url))
            with trio.fail_after(5):
                await hung_up.wait()
            receipt = await adapter.deliver(webhook_message(url))
            assert receipt is not None
            assert receipt.status_code == 200
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert served == [2, 1]


async def test_a_changed_url_or_header_is_used_at_once() -> None:
    """The URL and headers are parsed and checked once per distinct value, not per channel:
    after a PATCH the very next delivery goes to the new URL with the new headers."""
    adapter = WebhookAdapter(timeout_seconds=5, allow_private_networks=True)
    async with open_sink() as first, open_sink() as second:
        config: dict[str, Any] = {"url": first.url, "headers": {"X-Team": "a"}}
        try:
            for url, team in [(first.url, "a"), (second.url, "a"), (second.url, "b")]:
                config["url"], config["headers"] = url, {"X-Team": team}  # as a PATCH does
                await adapter.deliver(webhook_message(**config))
        finally:
            await adapter.aclose()
    assert [got.headers["x-team"] for got in first.received] == ["a"]
    assert [got.headers["x-team"] for got in second.received] == ["a", "b"]


async def test_environment_proxies_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = WebhookAdapter(timeout_seconds=5, allow_private_networks=True)
    async with open_sink() as proxy, open_sink() as sink:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        try:
            await adapter.deliver(webhook_message(sink.url))
        finally:
            await adapter.aclose()
    assert proxy.received == []
    assert len(sink.received) == 1
    verify_all(sink.received, SECRET)


# -- TLS: the checked address is dialed, the certificate is checked for the hostname ------------


def make_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            f"/CN={name}",
            "-addext",
            f"subjectAltName=DNS:{name}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("tls")
    return {name: make_certificate(directory, name) for name in ("hook.example", "other.example")}


async def tls_front(
    cert: tuple[Path, Path], backend_port: int, *, task_status: trio.TaskStatus[int]
) -> None:
    """Terminate TLS with ``cert`` on 127.0.0.1 and pass the bytes to a plain sink."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*cert)
    await tls_server(context, backend_port, [], task_status=task_status)


@pytest.mark.parametrize(
    ("served", "delivered"), [("hook.example", True), ("other.example", False)]
)
async def test_tls_is_verified_for_the_hostname_while_the_checked_address_is_dialed(
    certificates: dict[str, tuple[Path, Path]], served: str, delivered: bool
) -> None:
    trusted = ssl.create_default_context()
    for cert, _ in certificates.values():
        trusted.load_verify_locations(cert)
    dns = FakeDns({"hook.example": ["127.0.0.1"]})
    backend = RecordingDialer()
    adapter = WebhookAdapter(
        timeout_seconds=5,
        allow_private_networks=False,
        allowed_cidrs=["127.0.0.0/8"],
        resolver=dns,
        dialer=backend,
        ssl_context=trusted,
    )
    async with open_sink() as sink, trio.open_nursery() as nursery:
        port = await nursery.start(tls_front, certificates[served], sink.port)
        message = webhook_message(f"https://hook.example:{port}/hook")
        try:
            if delivered:
                for _ in range(2):  # the second over the same TLS connection
                    receipt = await adapter.deliver(message)
                    assert receipt is not None
                    assert receipt.status_code == 200
            else:
                with pytest.raises(RetriableError, match="certificate verify failed"):
                    await adapter.deliver(message)
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert backend.dialed == [("127.0.0.1", port)]
    if delivered:
        assert len(sink.received) == 2
        for got in sink.received:
            assert got.headers["host"] == f"hook.example:{port}"
            verify(got, SECRET)
    else:
        assert sink.received == []


async def test_without_a_context_the_default_one_verifies_certificates(
    certificates: dict[str, tuple[Path, Path]],
) -> None:
    adapter = WebhookAdapter(
        timeout_seconds=5,
        allow_private_networks=False,
        allowed_cidrs=["127.0.0.0/8"],
        resolver=FakeDns({"hook.example": ["127.0.0.1"]}),
    )
    async with open_sink() as sink, trio.open_nursery() as nursery:
        port = await nursery.start(tls_front, certificates["hook.example"], sink.port)
        try:  # a self-signed certificate is trusted by nobody's default store
            with pytest.raises(RetriableError, match="certificate verify failed"):
                await adapter.deliver(webhook_message(f"https://hook.example:{port}/hook"))
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert sink.received == []
