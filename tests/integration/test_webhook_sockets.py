"""The webhook client's sockets against real servers on 127.0.0.1: a kept-alive TLS connection
is not reused when its TLS stream already holds what the server sent after its answer (a
close_notify, a stray answer), and a connection whose dial or TLS handshake is cancelled is
closed at once.

The TLS receiver here is written against ``ssl.SSLObject`` rather than a stream, so that what
goes into each segment is the test's choice: the answer and what follows it leave in one
``send``, and the TCP connection stays open (its socket on the client's side is quiet).
"""

from __future__ import annotations

import contextlib
import os
import socket as stdlib_socket
import ssl

import h11
import httpx
import pytest
import trio
import trustme

from notifier.adapters.webhook.client import WebhookClient
from notifier.adapters.webhook.pool import Origin

HOST = "hook.example"
BODY = b'{"type":"ping"}'
HEADERS = [("host", HOST), ("content-type", "application/json"),
           ("content-length", str(len(BODY)))]  # fmt: skip
STRAY = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    context.set_alpn_protocols(["http/1.1"])
    return context


def server_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(HOST).configure_cert(context)
    return context


async def send_all(sock: trio.socket.SocketType, data: bytes) -> None:
    """Small data leaves in one ``send``: one segment on the loopback."""
    while data:
        data = data[await sock.send(data) :]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class SegmentingReceiver:
    """Answers each connection's first request with ``200 ok`` and, in the same ``send``, what
    ``after`` says: ``"close_notify"``, ``"stray"`` (a second answer nobody asked for) or
    ``"nothing"`` (then it keeps answering requests on the connection). It never closes a
    connection first."""

    def __init__(self, context: ssl.SSLContext, after: str) -> None:
        self.context = context
        self.after = after
        self.connections = 0
        self.requests = 0

    async def serve(self, *, task_status: trio.TaskStatus[int]) -> None:
        listener = trio.socket.socket()
        with listener:
            await listener.bind(("127.0.0.1", 0))
            listener.listen()
            task_status.started(listener.getsockname()[1])
            async with trio.open_nursery() as nursery:
                while True:
                    sock, _ = await listener.accept()
                    self.connections += 1
                    nursery.start_soon(self._handle, sock)

    async def _handle(self, sock: trio.socket.SocketType) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self.context.wrap_bio(incoming, outgoing, server_side=True)
        with sock:
            try:
                await self._exchange(sock, tls, incoming, outgoing)
            except (OSError, ssl.SSLError, h11.RemoteProtocolError):
                return
            while await sock.recv(65536):  # keep the connection open until the client closes
                pass

    async def _exchange(
        self, sock: trio.socket.SocketType, tls: ssl.SSLObject, incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
    ) -> None:  # fmt: skip
        async def more() -> bool:
            if outgoing.pending:
                await send_all(sock, outgoing.read())
            data = await sock.recv(65536)
            incoming.write(data)
            return bool(data)

        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if not await more():
                    return
        if outgoing.pending:
            await send_all(sock, outgoing.read())
        h = h11.Connection(h11.SERVER)
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                try:
                    h.receive_data(tls.read(65536))
                except ssl.SSLWantReadError:
                    if not await more():
                        return
                continue
            if type(event) is not h11.EndOfMessage:
                continue
            self.requests += 1
            answer = h11.Response(status_code=200, headers=[("content-length", "2")])
            tls.write((h.send(answer) or b"") + (h.send(h11.Data(data=b"ok")) or b"")
                      + (h.send(h11.EndOfMessage()) or b""))  # fmt: skip
            if self.after == "nothing":
                h.start_next_cycle()
                await send_all(sock, outgoing.read())
                continue
            if self.after == "stray":
                tls.write(STRAY)  # a record of its own, behind the answer's
            else:
                # the close_notify (unwrap then waits for the client's, which never comes)
                with contextlib.suppress(ssl.SSLWantReadError):
                    tls.unwrap()
            await send_all(sock, outgoing.read())  # the answer and what follows: one segment
            return


async def post_twice(ca: trustme.CA, after: str) -> tuple[SegmentingReceiver, list[bytes]]:
    receiver = SegmentingReceiver(server_context(ca), after)
    client = WebhookClient(timeout_seconds=10, ssl_context=client_context(ca))
    excerpts = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(receiver.serve)
        origin = Origin("https", HOST, port)
        with trio.fail_after(20):
            for _ in range(2):
                answer = await client.post(origin, ["127.0.0.1"], b"/hook", HEADERS, BODY)
                assert answer.status == 200
                excerpts.append(answer.excerpt)
        await client.aclose()
        nursery.cancel_scope.cancel()
    return receiver, excerpts


@pytest.mark.parametrize("after", ["close_notify", "stray"])
async def test_a_tls_connection_holding_data_after_its_answer_is_not_reused(
    ca: trustme.CA, after: str
) -> None:
    """The close_notify (or a stray answer) came in the answer's segment: it sits in the TLS
    stream, not the socket. The next delivery dials a new connection and gets its own answer."""
    receiver, excerpts = await post_twice(ca, after)
    assert excerpts == [b"ok", b"ok"]
    assert receiver.connections == 2
    assert receiver.requests == 2


async def test_a_quiet_tls_connection_is_reused(ca: trustme.CA) -> None:
    """The check does not cost the pool its use: nothing after the answer, one connection."""
    receiver = SegmentingReceiver(server_context(ca), "nothing")
    client = WebhookClient(timeout_seconds=10, ssl_context=client_context(ca))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(receiver.serve)
        origin = Origin("https", HOST, port)
        with trio.fail_after(20):
            for _ in range(3):
                answer = await client.post(origin, ["127.0.0.1"], b"/hook", HEADERS, BODY)
                assert answer.excerpt == b"ok"
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert (receiver.connections, receiver.requests) == (1, 3)


def full_listener() -> tuple[stdlib_socket.socket, list[stdlib_socket.socket]]:
    """A listener whose accept queue is full (never accepted): a new connection to it stays
    in the dial (the kernel drops its SYN)."""
    listener = stdlib_socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers: list[stdlib_socket.socket] = []
    for _ in range(4):
        filler = stdlib_socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    return listener, fillers


async def test_a_cancelled_dial_closes_its_socket_at_once(ca: trustme.CA) -> None:
    listener, fillers = full_listener()
    port = listener.getsockname()[1]
    client = WebhookClient(timeout_seconds=30, ssl_context=client_context(ca))
    try:
        before = open_fds()
        with trio.move_on_after(0.5) as scope:
            await client.post(Origin("https", HOST, port), ["127.0.0.1"], b"/", HEADERS, BODY)
        assert scope.cancelled_caught  # it was still dialing
        assert open_fds() == before
        assert client.idle_connections == 0
    finally:
        await client.aclose()
        for s in [listener, *fillers]:
            s.close()


class SilentTlsServer:
    """Accepts a TCP connection and never answers its ClientHello; ``closed`` is set once the
    client closed its end (and the server its own)."""

    def __init__(self) -> None:
        self.closed = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[int]) -> None:
        listener = trio.socket.socket()
        with listener:
            await listener.bind(("127.0.0.1", 0))
            listener.listen()
            task_status.started(listener.getsockname()[1])
            sock, _ = await listener.accept()
            with sock:
                while await sock.recv(65536):  # the ClientHello, then nothing until the close
                    pass
            self.closed.set()
            await trio.sleep_forever()


@pytest.mark.parametrize("how", ["cancelled", "deadline"])
async def test_a_cancelled_tls_handshake_closes_its_socket_at_once(
    ca: trustme.CA, how: str
) -> None:
    server = SilentTlsServer()
    client = WebhookClient(timeout_seconds=30, ssl_context=client_context(ca))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        origin = Origin("https", HOST, port)
        before = open_fds()
        if how == "cancelled":
            with trio.move_on_after(0.5) as scope:
                await client.post(origin, ["127.0.0.1"], b"/", HEADERS, BODY)
            assert scope.cancelled_caught
        else:
            deadline = trio.current_time() + 0.5
            with pytest.raises(httpx.ConnectTimeout, match="TLS handshake"):
                await client.post(origin, ["127.0.0.1"], b"/", HEADERS, BODY, deadline=deadline)
        with trio.fail_after(5):
            await server.closed.wait()  # the server saw the close (and closed its end)
        assert open_fds() == before
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_a_tls_stream_that_cannot_be_set_up_closes_its_socket(ca: trustme.CA) -> None:
    """A host name the SSL module refuses for SNI fails before the handshake: the TCP
    connection already dialed is closed with it."""
    server = SilentTlsServer()
    client = WebhookClient(timeout_seconds=30, ssl_context=client_context(ca))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        before = open_fds()
        with pytest.raises(ValueError, match="server_hostname"):
            await client.post(Origin("https", ".hook.example", port), ["127.0.0.1"], b"/",
                              HEADERS, BODY)  # fmt: skip
        with trio.fail_after(5):
            await server.closed.wait()
        assert open_fds() == before
        await client.aclose()
        nursery.cancel_scope.cancel()
