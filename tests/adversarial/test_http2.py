"""HTTP/2 frame sequences against a notifier with every role running.

An early answer (``401`` without a key, ``413`` for a ``content-length`` over the limit) followed
by a DATA frame on the answered stream, and HEADERS + RST_STREAM on a connection while the
server stops, make hypercorn's HTTP/2 protocol raise. Each must end that one connection only:
the process goes on serving other connections and delivering webhooks, a stop still exits ``0``,
and the log says it once at WARNING — no ERROR line, no 500, no key.

The frames are written with the ``h2`` library over a plain socket (h2c with prior knowledge,
which ``ingest.http2 = true`` turns on); the hostile ones are built by hand where ``h2`` itself
would refuse to send them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
from collections.abc import Callable
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import httpx
import hyperframe.frame
import pytest
import trio

from notifier.config import Config
from notifier.testing import open_sink
from tests.integration.conftest import create_tenant, make_config, poll, run_notifier
from tests.integration.test_shutdown import free_port, start_notifier, wait_ready

pytestmark = pytest.mark.integration

MAX_BODY = 1024
ROUNDS = 4
PROTOCOL_ERROR = "after a protocol error"


class H2Client:
    """One HTTP/2 connection with prior knowledge: requests through ``h2``, raw frames by hand,
    and the server's events read back."""

    def __init__(self, stream: trio.SocketStream, authority: str) -> None:
        self.stream = stream
        self.authority = authority
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.closed = False

    @classmethod
    async def open(cls, base_url: str) -> H2Client:
        authority = base_url.removeprefix("http://")
        host, _, port = authority.rpartition(":")
        client = cls(await trio.open_tcp_stream(host, int(port)), authority)
        client.conn.initiate_connection()
        await client.flush()
        return client

    async def flush(self) -> None:
        await self.stream.send_all(self.conn.data_to_send())

    def headers(self, method: str, path: str, *extra: tuple[str, str]) -> list[tuple[bytes, bytes]]:
        fields = [(":method", method), (":path", path), (":scheme", "http"),
                  (":authority", self.authority), *extra]  # fmt: skip
        return [(k.encode(), v.encode()) for k, v in fields]

    async def request(
        self, method: str, path: str, *extra: tuple[str, str], end_stream: bool = True
    ) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream_id, self.headers(method, path, *extra), end_stream=end_stream)
        await self.flush()
        return stream_id

    async def send_frames(self, *frames: hyperframe.frame.Frame) -> None:
        """Frames as given, past ``h2``'s own state checks."""
        await self.stream.send_all(b"".join(f.serialize() for f in frames))

    async def read_until(self, done: Callable[[h2.events.Event], bool]) -> h2.events.Event | None:
        """Read until an event ``done`` accepts (returned), or the server closes (``None``)."""
        while not self.closed:
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                self.closed = True
                break
            events = self.conn.receive_data(data)
            await self.flush()
            for event in events:
                if isinstance(event, h2.events.ConnectionTerminated):
                    self.closed = True
                if done(event):
                    return event
        return None

    async def ping(self) -> None:
        """A PING and its answer: the server has handled every frame sent before it (unless
        it closes the connection first)."""
        await self.send_frames(hyperframe.frame.PingFrame(0, opaque_data=b"probe!!!"))
        await self.read_until(lambda e: isinstance(e, h2.events.PingAckReceived))

    async def aclose(self) -> None:
        await self.stream.aclose()


def response_to(stream_id: int) -> Callable[[h2.events.Event], bool]:
    def done(event: h2.events.Event) -> bool:
        return isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id

    return done


def status_of(event: h2.events.Event | None) -> int:
    assert isinstance(event, h2.events.ResponseReceived), event
    return int(dict(event.headers)[b":status"])


async def early_answer_then_data(base_url: str, key: str | None) -> int:
    """HEADERS for ``POST /v1/events`` with a ``content-length`` over the limit, the stream left
    open; the server's early answer; then one DATA frame on that stream. The answer's status."""
    client = await H2Client.open(base_url)
    try:
        auth = [("authorization", f"Bearer {key}")] if key else []
        stream_id = await client.request(
            "POST", "/v1/events", ("content-type", "application/json"),
            ("content-length", str(3 * MAX_BODY)), *auth, end_stream=False,
        )  # fmt: skip
        status = status_of(await client.read_until(response_to(stream_id)))
        await client.send_frames(hyperframe.frame.DataFrame(stream_id, data=b"x" * 10))
        # The server ends this connection (or, had it let go of the stream a moment later,
        # ignores the frame): either way it answers nothing more on it.
        with trio.fail_after(10):
            with contextlib.suppress(trio.BrokenResourceError):  # closed before the ping
                await client.ping()
        return status
    finally:
        await client.aclose()


@pytest.fixture
def h2_config(database_url: str, broker_url: str) -> Config:
    return make_config(database_url, broker_url, ingest={"http2": True, "max_body_bytes": MAX_BODY})


async def test_a_frame_after_an_early_answer_ends_one_connection_and_every_role_goes_on(
    h2_config: Config, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    key = await create_tenant(database_url)
    async with open_sink() as sink, run_notifier(h2_config) as running, running.client(key) as api:
        hook = {"type": "webhook", "config": {"url": sink.url}}
        assert (await api.post("/v1/channels", json=hook)).status_code == 201

        async def hostile() -> None:
            for _ in range(ROUNDS):
                assert await early_answer_then_data(running.base_url, None) == 401
                assert await early_answer_then_data(running.base_url, key) == 413
                async with httpx.AsyncClient(
                    http1=False, http2=True, base_url=running.base_url, timeout=10,
                    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                ) as h2_client:  # fmt: skip
                    try:
                        resp = await h2_client.post("/v1/events", content=b"x" * 3 * MAX_BODY)
                    except httpx.TransportError:
                        pass  # the server ended the connection under the upload
                    else:
                        assert resp.status_code == 413, resp.text

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(hostile)
                for i in range(ROUNDS):  # delivered while the hostile sequences run
                    event = {"type": "t.x", "payload": {"i": i}}
                    resp = await api.post("/v1/events", json=event)
                    assert resp.status_code == 202, resp.text
                    await sink.wait_for(i + 1)
        assert (await api.get("/healthz")).status_code == 200
        with trio.fail_after(30):
            await sink.wait_for(ROUNDS)

    ended = [r for r in caplog.records if PROTOCOL_ERROR in r.getMessage()]
    assert ended, "the sequences reached the protocol error"
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in ended)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert key not in caplog.text
    assert " 500" not in caplog.text


async def refused(port: int) -> bool:
    """Whether a new connection is refused (a stopping server closes its listening socket
    at the moment it stops accepting, before anything it does next)."""
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return True
    await stream.aclose()
    return False


def write_config(path: Path, database_url: str, broker_url: str, port: int) -> None:
    path.write_text(
        f"""
[service]
shutdown_grace_seconds = 8

[database]
url = "{database_url}"

[broker]
url = "{broker_url}"

[ingest]
bind = "127.0.0.1:{port}"
http2 = true

[workers.webhook]
allow_private_networks = true
"""
    )


async def test_headers_and_reset_during_a_graceful_stop_exit_0(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config_path, log = tmp_path / "notifier.toml", tmp_path / "notifier.log"
    write_config(config_path, database_url, broker_url, port)
    key = await create_tenant(database_url)
    proc = await start_notifier(config_path, log)
    try:
        await wait_ready(base)
        with trio.fail_after(30):
            await poll(
                lambda: trio.to_thread.run_sync(lambda: "notifier running" in log.read_text())
            )
        client = await H2Client.open(base)
        # A request in flight (its body still to come) keeps the connection open while the
        # server drains; the server has seen it once it answers the ping sent after it.
        await client.request(
            "POST", "/v1/events", ("content-type", "application/json"),
            ("content-length", "40"), ("authorization", f"Bearer {key}"), end_stream=False,
        )  # fmt: skip
        await client.ping()
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            await poll(functools.partial(refused, port))  # the server is stopping
            hostile = client.conn.get_next_available_stream_id()
            await client.send_frames(
                hyperframe.frame.HeadersFrame(
                    hostile, data=client.conn.encoder.encode(client.headers("GET", "/healthz")),
                    flags=["END_HEADERS", "END_STREAM"],
                ),
                hyperframe.frame.RstStreamFrame(hostile, error_code=8),
            )  # fmt: skip
            answers: list[h2.events.Event] = []
            await client.read_until(lambda e: bool(answers.append(e)))  # until it closes
            code = await proc.wait()
        await client.aclose()
    finally:
        if proc.returncode is None:
            proc.kill()
    text = log.read_text()
    assert code == 0, text
    statuses = [status_of(e) for e in answers if isinstance(e, h2.events.ResponseReceived)]
    assert 500 not in statuses, "the request cut off with the connection is not answered 500"
    assert PROTOCOL_ERROR in text, text
    assert "ERROR" not in text, text
    assert "Traceback" not in text, text


async def test_http2_is_off_by_default(config: Config) -> None:
    assert config.ingest.http2 is False
    async with run_notifier(config, ("ingest",)) as running:
        host, _, port = running.base_url.removeprefix("http://").rpartition(":")
        # The HTTP/2 preface: refused, in HTTP/1.1, and the connection closed.
        client = await H2Client.open(running.base_url)
        with trio.fail_after(10):
            answer = b""
            while chunk := await client.stream.receive_some(65536):
                answer += chunk
        await client.aclose()
        assert answer.startswith(b"HTTP/1.1 505 "), answer
        # An upgrade to h2c: ignored, the request is answered in HTTP/1.1.
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
            )
            with trio.fail_after(10):
                head = b""
                while b"\r\n\r\n" not in head:
                    head += await stream.receive_some(65536)
        assert head.startswith(b"HTTP/1.1 200 "), head
