"""Trust, identity and egress of webhooks against real local servers (docs/architecture.md §9): a
receiver whose certificate a company CA issued (trusted through ``SSL_CERT_FILE`` or
``workers.webhook.ca_file``), one that requires a client certificate (mutual TLS), an OAuth2
token endpoint in front of a receiver, and an HTTP CONNECT proxy that records what it is asked.

Every certificate is made here with ``trustme``; every server listens on 127.0.0.1. A
``WebhookAdapter`` is driven directly, built from a ``[workers.webhook]`` table with the loaders
the service uses (``tls.load_tls``, ``proxy.ProxyDialer``), a fake resolver naming the hosts;
the last test runs the whole service through the proxy.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
import trio
import trustme

from notifier.adapters.webhook import WebhookAdapter, generate_secret
from notifier.adapters.webhook.oauth import CLIENT_SECRET_FIELD
from notifier.adapters.webhook.proxy import ProxyDialer
from notifier.adapters.webhook.tls import load_tls
from notifier.config import Config, WebhookWorkersConfig, parse_config
from notifier.errors import PermanentError, RetriableError
from notifier.messages import WorkerMessage
from notifier.testing import Received, WebhookSink, open_sink
from tests.integration.conftest import create_tenant, make_config, run_notifier, tls_server, verify

pytestmark = pytest.mark.integration

SECRET = generate_secret()
CLIENT_SECRET = "cl1ent-s3cret-never-shown"
TENANT = uuid.uuid4()


# -- fakes and local servers ---------------------------------------------------------------------


class FakeDns:
    """A resolver answering from ``records``; records every query; unknown names fail."""

    def __init__(self, records: dict[str, Sequence[str]]) -> None:
        self.records = records
        self.queries: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        self.queries.append(host)
        if host not in self.records:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.records[host])


class Clock:
    """Epoch seconds that a test moves on."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A company CA, its server certificates for hook.example and auth.example and a client
    certificate ("billing") it issued, as files, and the server contexts."""
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    client = ca.issue_cert("billing.notifier.internal", common_name="billing.notifier.internal")
    paths = {"ca": directory / "ca.pem", "cert": directory / "client.pem",
             "key": directory / "client.key"}  # fmt: skip
    ca.cert_pem.write_to_path(str(paths["ca"]))
    # A directory as OpenSSL reads one: each CA under its subject hash (`openssl rehash`).
    paths["ca_dir"] = directory / "cas"
    paths["ca_dir"].mkdir()
    subject_hash = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(paths["ca"])],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    ca.cert_pem.write_to_path(str(paths["ca_dir"] / f"{subject_hash}.0"))
    client.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    client.private_key_pem.write_to_path(str(paths["key"]))
    servers = {}
    for name in ("hook.example", "auth.example"):
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(name).configure_cert(context)
        servers[name] = context
    mutual = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("hook.example").configure_cert(mutual)
    ca.configure_trust(mutual)
    mutual.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no connection
    return {"paths": paths, "servers": servers, "mutual": mutual}


def settings(**keys: Any) -> WebhookWorkersConfig:
    parsed = parse_config({"workers": {"webhook": keys}}, env={}).workers.webhook
    assert parsed is not None
    return parsed


def identity(pki: dict[str, Any], tenants: Sequence[str] = ()) -> dict[str, Any]:
    paths = pki["paths"]
    return {"cert_file": str(paths["cert"]), "key_file": str(paths["key"]),
            "tenants": list(tenants)}  # fmt: skip


def adapter_for(
    table: WebhookWorkersConfig,
    environ: dict[str, str],
    dns: FakeDns,
    clock: Clock | None = None,
) -> WebhookAdapter:
    """An adapter built as the service builds it, resolving with ``dns``; 127.0.0.0/8 opened."""
    tls = load_tls(table, environ)
    return WebhookAdapter(
        timeout_seconds=5, allow_private_networks=False, allowed_cidrs=["127.0.0.0/8"],
        resolver=dns, dialer=ProxyDialer(table.proxy_url) if table.proxy_url else None,
        ssl_context=tls.context, identities=tls.identities, clock=clock or time.time,
    )  # fmt: skip


def message(url: str, **config: Any) -> WorkerMessage:
    return WorkerMessage(
        delivery_id=uuid.uuid4(), event_id=uuid.uuid4(), tenant_id=TENANT,
        channel_id=uuid.uuid4(), channel_type="webhook",
        channel_config={"url": url, "secret": SECRET, "headers": {}, **config},
        event_type="order.created", recipient=None, payload={"order": 42},
        created_at=datetime.now(UTC), attempt=1, max_attempts=5,
    )  # fmt: skip


class ConnectProxy:
    """An HTTP CONNECT proxy on 127.0.0.1 that records each request's target and
    ``Proxy-Authorization``, answers ``status``, and on 200 tunnels to the target."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.targets: list[str] = []
        self.authorizations: list[str | None] = []
        self.port = 0

    async def serve(self, *, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            head = b""
            while b"\r\n\r\n" not in head:
                data = await client.receive_some(4096)
                if not data:
                    return
                head += data
            request, *lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            method, target, _ = request.split(" ")
            pairs = (line.split(": ", 1) for line in lines)
            headers = {name.lower(): value for name, value in pairs}
            self.targets.append(f"{method} {target}")
            self.authorizations.append(headers.get("proxy-authorization"))
            if self.status != 200:
                answer = f"HTTP/1.1 {self.status} Forbidden\r\ncontent-length: 0\r\n\r\n"
                await client.send_all(answer.encode())
                return
            host, port = target.rsplit(":", 1)
            upstream = await trio.open_tcp_stream(host.strip("[]"), int(port))
            await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")

            async def pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
                try:
                    async for chunk in source:
                        await sink.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

            async with upstream, trio.open_nursery() as nursery:
                nursery.start_soon(pump, upstream, client)
                await pump(client, upstream)
                nursery.cancel_scope.cancel()


# -- trust: the operator's CA, besides the public roots -------------------------------------------


@pytest.mark.parametrize("source", ["SSL_CERT_FILE", "SSL_CERT_DIR", "ca_file", None])
async def test_a_receiver_of_a_company_ca_is_trusted_when_the_operator_says_so(
    pki: dict[str, Any], source: str | None
) -> None:
    ca = str(pki["paths"]["ca"])
    table = settings(ca_file=ca) if source == "ca_file" else settings()
    environ = {"SSL_CERT_FILE": ca, "SSL_CERT_DIR": str(pki["paths"]["ca_dir"])}
    environ = {k: v for k, v in environ.items() if k == source}
    adapter = adapter_for(table, environ, FakeDns({"hook.example": ["127.0.0.1"]}))
    async with open_sink() as sink, trio.open_nursery() as nursery:
        port = await nursery.start(tls_server, pki["servers"]["hook.example"], sink.port, [])
        try:
            if source is None:  # the public roots alone do not know the company CA
                with pytest.raises(RetriableError, match="certificate verify failed"):
                    await adapter.deliver(message(f"https://hook.example:{port}/in"))
            else:
                receipt = await adapter.deliver(message(f"https://hook.example:{port}/in"))
                assert receipt is not None
                assert receipt.status_code == 200
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert len(sink.received) == (0 if source is None else 1)
    for got in sink.received:
        assert got.headers["host"] == f"hook.example:{port}"
        verify(got, SECRET)


# -- mutual TLS -----------------------------------------------------------------------------------


async def test_a_receiver_requiring_a_client_certificate_gets_the_channels_only(
    pki: dict[str, Any],
) -> None:
    ca = str(pki["paths"]["ca"])
    table = settings(ca_file=ca, client_certificates={
        "billing": identity(pki, [str(TENANT)]), "others": identity(pki, [str(uuid.uuid4())]),
    })  # fmt: skip
    adapter = adapter_for(table, {}, FakeDns({"hook.example": ["127.0.0.1"]}))
    peers: list[str] = []
    async with open_sink() as sink, trio.open_nursery() as nursery:
        port = await nursery.start(tls_server, pki["mutual"], sink.port, peers)
        url = f"https://hook.example:{port}/in"
        try:
            for _ in range(2):  # the second over the kept-alive connection
                receipt = await adapter.deliver(message(url, tls_client_certificate="billing"))
                assert receipt is not None
                assert receipt.status_code == 200
            assert peers == ["billing.notifier.internal"]
            # The same origin without the identity: never the kept-alive connection that has it.
            with pytest.raises(RetriableError):
                await adapter.deliver(message(url))
            # An identity kept for another tenant: refused before any connection.
            with pytest.raises(PermanentError, match="no client certificate named others"):
                await adapter.deliver(message(url, tls_client_certificate="others"))
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert len(sink.received) == 2
    assert peers == ["billing.notifier.internal"]


# -- OAuth2 client credentials --------------------------------------------------------------------


class TokenEndpoint:
    """A token endpoint's answers: ``token-<n>`` valid ``expires_in`` seconds, or ``fail``."""

    def __init__(self, expires_in: int = 100) -> None:
        self.expires_in = expires_in
        self.fail: tuple[int, bytes] | None = None
        self.issued = 0

    def __call__(self, got: Received) -> tuple[int, dict[str, str], bytes]:
        if self.fail is not None:
            return self.fail[0], {}, self.fail[1]
        self.issued += 1
        body = {"access_token": f"token-{self.issued}", "token_type": "Bearer",
                "expires_in": self.expires_in}  # fmt: skip
        return 200, {"content-type": "application/json"}, json.dumps(body).encode()


def oauth_config(port: int, **extra: Any) -> dict[str, Any]:
    return {"oauth2": {"token_url": f"https://auth.example:{port}/oauth/token",
                       "client_id": "notifier", **extra},
            CLIENT_SECRET_FIELD: CLIENT_SECRET}  # fmt: skip


class Receiver:
    """Answers 200, or 401 while ``refuse`` is set."""

    def __init__(self) -> None:
        self.refuse = False

    def __call__(self, got: Received) -> tuple[int, dict[str, str], bytes]:
        return (401, {}, b"expired") if self.refuse else (200, {}, b"ok")


async def test_a_bearer_token_is_fetched_once_reused_renewed_and_dropped_on_401(
    pki: dict[str, Any],
) -> None:
    endpoint, receiver, clock = TokenEndpoint(expires_in=100), Receiver(), Clock()
    dns = FakeDns({"hook.example": ["127.0.0.1"], "auth.example": ["127.0.0.1"]})
    adapter = adapter_for(settings(ca_file=str(pki["paths"]["ca"])), {}, dns, clock)
    async with (
        open_sink(endpoint) as token_sink,
        open_sink(receiver) as sink,
        trio.open_nursery() as nursery,
    ):
        port = await nursery.start(tls_server, pki["servers"]["auth.example"], token_sink.port, [])
        deliver = message(sink.url.replace("127.0.0.1", "hook.example"),
                          **oauth_config(port, scope="hooks:write"))  # fmt: skip
        try:
            await adapter.deliver(deliver)
            clock.now += 69  # renewed 30 s before it expires: still good
            await adapter.deliver(deliver)
            clock.now += 1
            await adapter.deliver(deliver)  # a new one
            receiver.refuse = True
            with pytest.raises(RetriableError, match="refused the OAuth2 access token"):
                await adapter.deliver(deliver)
            receiver.refuse = False
            await adapter.deliver(deliver)  # the refused token dropped: a new one
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    bearers = [got.headers["authorization"] for got in sink.received]
    assert bearers == ["Bearer token-1", "Bearer token-1", "Bearer token-2", "Bearer token-2",
                       "Bearer token-3"]  # fmt: skip
    assert len(token_sink.received) == 3
    for got in token_sink.received:
        assert got.method == "POST"
        assert got.path == "/oauth/token"
        assert got.headers["host"] == f"auth.example:{port}"
        assert got.headers["content-type"] == "application/x-www-form-urlencoded"
        assert got.body == b"grant_type=client_credentials&scope=hooks%3Awrite"
        assert got.headers["authorization"].startswith("Basic ")
    assert dns.queries.count("auth.example") == 3  # resolved and checked at every fetch


async def test_concurrent_attempts_of_a_channel_share_one_token_fetch(
    pki: dict[str, Any],
) -> None:
    endpoint = TokenEndpoint()
    dns = FakeDns({"auth.example": ["127.0.0.1"]})
    adapter = adapter_for(settings(ca_file=str(pki["paths"]["ca"])), {}, dns)
    async with (
        open_sink() as sink,
        open_sink(endpoint, delay_seconds=0.05) as token_sink,  # the fetch held in flight
        trio.open_nursery() as nursery,
    ):
        port = await nursery.start(tls_server, pki["servers"]["auth.example"], token_sink.port, [])
        try:
            with trio.fail_after(10):
                async with trio.open_nursery() as attempts:
                    for _ in range(4):
                        attempts.start_soon(
                            adapter.deliver, message(sink.url, **oauth_config(port))
                        )
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert len(token_sink.received) == 1
    assert [got.headers["authorization"] for got in sink.received] == ["Bearer token-1"] * 4


async def test_a_failing_token_endpoint_is_retriable_and_quotes_no_secret(
    pki: dict[str, Any],
) -> None:
    endpoint = TokenEndpoint()
    endpoint.fail = (503, f"bad client_secret={CLIENT_SECRET}".encode())
    dns = FakeDns({"auth.example": ["127.0.0.1"]})
    adapter = adapter_for(settings(ca_file=str(pki["paths"]["ca"])), {}, dns)
    async with (
        open_sink() as sink,
        open_sink(endpoint) as token_sink,
        trio.open_nursery() as nursery,
    ):
        port = await nursery.start(tls_server, pki["servers"]["auth.example"], token_sink.port, [])
        try:
            with pytest.raises(RetriableError) as info:
                await adapter.deliver(message(sink.url, **oauth_config(port)))
            # An endpoint that does not answer at all: a retriable connect error.
            closed = oauth_config(sink.port)  # plain HTTP where TLS is expected
            with pytest.raises(RetriableError) as no_tls:
                await adapter.deliver(message(sink.url, **closed))
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    text = str(info.value)
    assert text.startswith(f"OAuth2 token endpoint auth.example:{port}: HTTP 503")
    assert str(no_tls.value).startswith(f"OAuth2 token endpoint auth.example:{sink.port}: ")
    for error in (text, str(no_tls.value)):
        assert CLIENT_SECRET not in error
    assert sink.received == []  # no attempt without a token


async def test_a_token_endpoint_resolving_to_a_blocked_address_is_never_dialed() -> None:
    dns = FakeDns({"auth.example": ["169.254.169.254"]})
    proxy = ConnectProxy()
    async with trio.open_nursery() as nursery:
        proxy_port = await nursery.start(proxy.serve)
        adapter = adapter_for(settings(proxy_url=f"http://127.0.0.1:{proxy_port}"), {}, dns)
        async with open_sink() as sink:
            try:
                with pytest.raises(PermanentError) as info:
                    await adapter.deliver(message(sink.url, **oauth_config(443)))
            finally:
                await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert str(info.value).startswith(
        "config.oauth2.token_url: destination blocked: auth.example resolves to a cloud metadata"
    )
    assert "169.254.169.254" not in str(info.value)  # what it resolves to is not told
    assert proxy.targets == []
    assert sink.received == []


# -- the egress proxy -----------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_the_proxy_is_asked_for_the_checked_address_and_the_hostname_stays(
    pki: dict[str, Any], scheme: str
) -> None:
    dns = FakeDns({"hook.example": ["127.0.0.1"]})
    proxy = ConnectProxy()
    async with open_sink() as sink, trio.open_nursery() as nursery:
        proxy_port = await nursery.start(proxy.serve)
        port = sink.port
        if scheme == "https":
            port = await nursery.start(tls_server, pki["servers"]["hook.example"], sink.port, [])
        table = settings(ca_file=str(pki["paths"]["ca"]),
                         proxy_url=f"http://egress:pr0xy-pass@127.0.0.1:{proxy_port}")  # fmt: skip
        adapter = adapter_for(table, {}, dns)
        try:
            for _ in range(2):  # the second through the same tunnel
                receipt = await adapter.deliver(message(f"{scheme}://hook.example:{port}/in"))
                assert receipt is not None
                assert receipt.status_code == 200
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert proxy.targets == [f"CONNECT 127.0.0.1:{port}"]  # the checked address, not the name
    assert proxy.authorizations == ["Basic ZWdyZXNzOnByMHh5LXBhc3M="]  # egress:pr0xy-pass
    assert len(sink.received) == 2
    for got in sink.received:
        assert got.headers["host"] == f"hook.example:{port}"
        verify(got, SECRET)


async def test_a_proxy_refusal_is_retriable_and_says_so_without_the_password() -> None:
    dns = FakeDns({"hook.example": ["127.0.0.1"]})
    proxy = ConnectProxy(status=403)
    async with open_sink() as sink, trio.open_nursery() as nursery:
        proxy_port = await nursery.start(proxy.serve)
        table = settings(proxy_url=f"http://egress:pr0xy-pass@127.0.0.1:{proxy_port}")
        adapter = adapter_for(table, {}, dns)
        try:
            with pytest.raises(RetriableError) as info:
                await adapter.deliver(message(f"http://hook.example:{sink.port}/in"))
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    text = str(info.value)
    # the address hook.example resolved to is never told (the proxy here shares it: loopback)
    assert f"refused CONNECT [redacted]:{sink.port}: HTTP 403" in text
    assert f"the proxy [redacted]:{proxy_port} refused" in text
    assert "pr0xy-pass" not in text
    assert sink.received == []


async def test_a_blocked_destination_never_reaches_the_proxy() -> None:
    dns = FakeDns({"hook.example": ["10.9.8.7"]})
    proxy = ConnectProxy()
    async with trio.open_nursery() as nursery:
        proxy_port = await nursery.start(proxy.serve)
        adapter = adapter_for(settings(proxy_url=f"http://127.0.0.1:{proxy_port}"), {}, dns)
        try:
            with pytest.raises(PermanentError, match=r"^destination blocked: hook\.example"):
                await adapter.deliver(message("https://hook.example/in"))
        finally:
            await adapter.aclose()
        nursery.cancel_scope.cancel()
    assert proxy.targets == []


async def test_the_service_delivers_through_the_configured_proxy(
    database_url: str, broker_url: str
) -> None:
    proxy = ConnectProxy()
    async with trio.open_nursery() as nursery:
        proxy_port = await nursery.start(proxy.serve)
        config: Config = make_config(database_url, broker_url, workers={"webhook": {
            "concurrency": 4, "prefetch": 8, "allow_private_networks": True,
            "proxy_url": f"http://127.0.0.1:{proxy_port}",
        }})  # fmt: skip
        sink: WebhookSink
        async with (
            open_sink() as sink,
            run_notifier(config) as running,
            running.client(await create_tenant(database_url)) as api,
        ):
            resp = await api.post("/v1/channels", json={
                "type": "webhook", "config": {"url": sink.url, "secret": SECRET},
            })  # fmt: skip
            assert resp.status_code == 201, resp.text
            resp = await api.post("/v1/events", json={"type": "t", "payload": {"n": 1}})
            assert resp.status_code == 202, resp.text
            with trio.fail_after(20):
                await sink.wait_for(1)
        nursery.cancel_scope.cancel()
    assert proxy.targets == [f"CONNECT 127.0.0.1:{sink.port}"]
    verify(sink.received[0], SECRET)
