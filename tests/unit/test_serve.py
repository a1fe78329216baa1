"""The ingest server's listening sockets outlive a run of the server, so that a restart under
``supervise`` neither loses the port nor refuses the connections that arrive meanwhile."""

from __future__ import annotations

import functools

import trio
from quart_trio import QuartTrio

from notifier.ingest.serve import Listeners, open_listeners, serve_ingest
from notifier.lifecycle import Stop


def tiny_app() -> QuartTrio:
    app = QuartTrio("tiny")

    @app.get("/")
    async def index() -> str:
        return "ok"

    return app


def serve(listeners: Listeners, stop: Stop) -> functools.partial[object]:
    return functools.partial(
        serve_ingest, tiny_app(), listeners, stop, grace_seconds=1.0, http2=False,
        max_body_bytes=1024,
    )  # fmt: skip


async def get(stream: trio.SocketStream) -> bytes:
    await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    answer = b""
    while chunk := await stream.receive_some(65536):
        answer += chunk
    return answer


async def test_a_connection_made_between_two_runs_is_served_by_the_next() -> None:
    with open_listeners("127.0.0.1:0") as listeners:
        host, _, port = listeners.binds[0].removeprefix("http://").rpartition(":")
        stop = Stop()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(serve(listeners, stop))
                nursery.cancel_scope.cancel()  # the run ends without a stop, as a failure would
            waiting = await trio.open_tcp_stream(host, int(port))  # into the backlog
            async with waiting, trio.open_nursery() as nursery:
                await nursery.start(serve(listeners, stop))
                assert (await get(waiting)).startswith(b"HTTP/1.1 200 ")
                stop.set()


async def test_a_stop_closes_the_listening_sockets() -> None:
    with open_listeners("127.0.0.1:0") as listeners:
        host, _, port = listeners.binds[0].removeprefix("http://").rpartition(":")
        stop = Stop()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(serve(listeners, stop))
                stop.set()
        try:
            await trio.open_tcp_stream(host, int(port))
        except OSError:
            return
        raise AssertionError("a stopped server still takes connections")
