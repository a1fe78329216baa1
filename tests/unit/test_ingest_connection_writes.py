"""An answer of the ingest server takes one write: ``H11Connection`` keeps a final answer's
head until what follows it (its body or its end), and a kept-alive connection carries request
after request without hypercorn's idle timer (``Connection.close_when_due`` keeps it)."""

from __future__ import annotations

import functools

import h11
import trio
from quart_trio import QuartTrio

from notifier.ingest.connection import H11Connection
from notifier.ingest.serve import open_listeners, serve_ingest
from notifier.lifecycle import Stop

REQUEST = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"


def connection_with_a_request(request: bytes = REQUEST) -> H11Connection:
    conn = H11Connection(http2=False, max_body_bytes=1024, max_incomplete_event_size=16384)
    conn.receive_data(request)
    assert isinstance(conn.next_event(), h11.Request)
    return conn


def test_the_head_goes_with_the_body() -> None:
    conn = connection_with_a_request()
    head = conn.send(h11.Response(status_code=202, headers=[("Content-Length", "2")]))
    assert head == b""
    sent = conn.send(h11.Data(data=b"ok"))
    assert sent is not None
    assert sent.startswith(b"HTTP/1.1 202 \r\nContent-Length: 2\r\n")
    assert sent.endswith(b"\r\n\r\nok")
    assert conn.send(h11.EndOfMessage()) == b""


def test_a_head_without_a_body_goes_with_its_end() -> None:
    conn = connection_with_a_request()
    assert conn.send(h11.Response(status_code=204, headers=[])) == b""
    sent = conn.send(h11.EndOfMessage())
    assert sent is not None
    assert sent.startswith(b"HTTP/1.1 204 ")


def test_an_interim_answer_is_not_kept() -> None:
    conn = connection_with_a_request(
        b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    sent = conn.send(h11.InformationalResponse(status_code=100, headers=[]))
    assert sent is not None
    assert sent.startswith(b"HTTP/1.1 100 ")


async def test_a_kept_alive_connection_carries_request_after_request() -> None:
    app = QuartTrio("tiny")

    @app.get("/")
    async def index() -> str:
        return "ok"

    with open_listeners("127.0.0.1:0") as listeners:
        host, _, port = listeners.binds[0].removeprefix("http://").rpartition(":")
        stop = Stop()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(
                    serve_ingest, app, listeners, stop, grace_seconds=1.0, http2=False,
                    max_body_bytes=1024,
                ))  # fmt: skip
                async with await trio.open_tcp_stream(host, int(port)) as stream:
                    for _ in range(3):
                        await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                        answer = b""
                        while not answer.endswith(b"\r\n\r\nok"):
                            answer += await stream.receive_some(65536)
                        assert answer.startswith(b"HTTP/1.1 200 ")
                stop.set()
