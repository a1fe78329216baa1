"""The webhook's HTTP client (``adapters.webhook.client.WebhookClient``) over scripted
connections handed out by a fake dialer (its constructor's seam): only the checked addresses are
dialed, the request carries ``Host`` and ``Content-Length``, an answer is read to its limit and
the connection then closed, kept-alive connections are reused only when both sides finished the
exchange and expire, the pool of idle ones is bounded, every phase ends at the one deadline
(naming itself) and informational answers are capped. Last, the adapter: a channel's URL and
headers worked out once per value, one deadline covering resolution and the exchange, and no
resolved address in a connection error.

The same client against real sockets (TLS, a server that closes an idle connection) is in
``tests/integration/test_webhook.py``.
"""

from __future__ import annotations

from typing import Any

import h11
import httpx
import pytest
import trio

from notifier.adapters.webhook.adapter import ENDPOINTS_KEPT, WebhookAdapter
from notifier.adapters.webhook.client import (
    MAX_INFORMATIONAL,
    PHASES,
    Answer,
    WebhookClient,
)
from notifier.adapters.webhook.pool import Origin
from notifier.errors import PermanentError, RetriableError
from notifier.testing import worker_message

ORIGIN = Origin("http", "hook.example", 8080)
ADDRESS = "93.184.216.34"
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
CHUNK = 4096


class ScriptedStream(trio.abc.Stream):
    """A connection that records what is written and answers each complete request with the
    next of ``answers`` (then ``endless`` body bytes without end, if set), ``CHUNK`` bytes a
    read at the most. ``hang`` makes "send" or "receive" wait for ever."""

    def __init__(self, answers: list[bytes], *, endless: bool = False, hang: str = "") -> None:
        self.answers = list(answers)
        self.endless = endless
        self.hang = hang
        self.written = b""
        self.requests = 0
        self.pending = b""
        self.served = 0
        self.closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.hang == "send":
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()
        assert not self.closed, "write to a closed connection"
        self.written += bytes(data)
        self.requests += 1
        if self.answers:
            self.pending += self.answers.pop(0)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.hang == "receive":
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()
        assert not self.closed, "read from a closed connection"
        size = min(max_bytes or CHUNK, CHUNK)
        if self.pending:
            out, self.pending = self.pending[:size], self.pending[size:]
        elif self.endless:
            out = b"x" * size
        else:
            out = b""  # the server closed its end
        self.served += len(out)
        return out

    async def aclose(self) -> None:
        self.closed = True  # before the checkpoint: closing works in a cancelled scope too
        await trio.lowlevel.checkpoint()


class ScriptedDialer:
    """Records each address dialed and hands out the next stream ``make`` builds."""

    def __init__(self, make: Any = None, *, hang_at: frozenset[str] = frozenset()) -> None:
        self.make = make or (lambda: ScriptedStream([OK] * 10))
        self.hang_at = hang_at
        self.dialed: list[tuple[str, int]] = []
        self.streams: list[ScriptedStream] = []

    async def __call__(self, host: str, port: int) -> trio.abc.Stream:
        self.dialed.append((host, port))
        if host in self.hang_at:
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()
        self.streams.append(self.make())
        return self.streams[-1]


def client(dialer: ScriptedDialer, **options: Any) -> WebhookClient:
    options.setdefault("timeout_seconds", 5.0)
    options.setdefault("max_body_bytes", 10_000)
    return WebhookClient(dialer=dialer, **options)


async def post(
    c: WebhookClient, body: bytes = b'{"n": 1}', addresses: tuple[str, ...] = (ADDRESS,),
    origin: Origin = ORIGIN,
) -> Answer:  # fmt: skip
    headers = [
        ("host", "hook.example:8080"), ("content-length", str(len(body))),
        ("content-type", "application/json"), ("webhook-id", "msg_1"),
    ]  # fmt: skip
    return await c.post(origin, addresses, b"/hook?x=1", headers, body)


def parse_request(data: bytes) -> tuple[h11.Request, bytes]:
    server = h11.Connection(h11.SERVER)
    server.receive_data(data)
    request = server.next_event()
    assert isinstance(request, h11.Request)
    body = b""
    while isinstance(event := server.next_event(), h11.Data):
        body += event.data
    assert isinstance(event, h11.EndOfMessage)
    return request, body


# -- the request --------------------------------------------------------------------------------


async def test_the_request_is_a_post_with_host_and_content_length() -> None:
    dialer = ScriptedDialer()
    c = client(dialer)
    answer = await post(c, b'{"order": 42}')
    assert (answer.status, answer.excerpt) == (200, b"ok")
    request, body = parse_request(dialer.streams[0].written)
    assert request.method == b"POST"
    assert request.target == b"/hook?x=1"
    headers = dict(request.headers)
    assert headers[b"host"] == b"hook.example:8080"
    assert headers[b"content-length"] == b"13"
    assert b"transfer-encoding" not in headers
    assert b"connection" not in headers  # HTTP/1.1 keep-alive is the default
    assert body == b'{"order": 42}'
    await c.aclose()


# -- pinning ------------------------------------------------------------------------------------


async def test_only_the_checked_addresses_are_dialed_in_order() -> None:
    first, second = "93.184.216.34", "93.184.216.35"

    def refuse_first() -> ScriptedStream:
        if len(dialer.dialed) == 1:
            raise ConnectionRefusedError("refused")
        return ScriptedStream([OK])

    dialer = ScriptedDialer(refuse_first)
    c = client(dialer)
    assert (await post(c, addresses=(first, second))).status == 200
    assert dialer.dialed == [(first, 8080), (second, 8080)]
    await c.aclose()


async def test_no_checked_address_fails_closed_without_dialing() -> None:
    dialer = ScriptedDialer()
    c = client(dialer)
    with pytest.raises(httpx.ConnectError, match="no checked address"):
        await post(c, addresses=())
    assert dialer.dialed == []


async def test_a_kept_alive_connection_is_reused_only_at_a_checked_address() -> None:
    other = "93.184.216.35"
    dialer = ScriptedDialer()
    c = client(dialer)
    await post(c)
    await post(c)  # the same checked address: reused
    assert dialer.dialed == [(ADDRESS, 8080)]
    await post(c, addresses=(other,))  # the name now resolves elsewhere: a new connection
    assert dialer.dialed == [(ADDRESS, 8080), (other, 8080)]
    await post(c, addresses=(other, ADDRESS))  # either may be reused
    assert len(dialer.dialed) == 2
    await c.aclose()
    assert all(stream.closed for stream in dialer.streams)


# -- the answer ---------------------------------------------------------------------------------


async def test_a_body_over_the_limit_ends_there_and_its_connection_is_closed() -> None:
    head = b"HTTP/1.1 503 Busy\r\ncontent-length: 1000000000\r\n\r\n"
    dialer = ScriptedDialer(lambda: ScriptedStream([head], endless=True))
    c = client(dialer, excerpt_bytes=100)
    answer = await post(c)
    assert answer.status == 503
    assert answer.excerpt == b"x" * 100  # only the excerpt is kept
    (stream,) = dialer.streams
    assert stream.closed
    assert stream.served < len(head) + 10_000 + 2 * CHUNK  # the rest is never read
    await post(c)  # ... and never reused
    assert len(dialer.dialed) == 2
    await c.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 3000\r\n\r\n" + b"x" * 3000,
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 302 Found\r\nlocation: http://elsewhere.example/\r\ncontent-length: 0\r\n\r\n",
    ],
    ids=["content-length", "chunked", "informational-first", "no-content", "redirect"],
)
async def test_a_complete_answer_leaves_its_connection_reusable(answer: bytes) -> None:
    dialer = ScriptedDialer(lambda: ScriptedStream([answer] * 2))
    c = client(dialer)
    first, second = await post(c), await post(c)
    assert first == second
    assert first.status in (200, 204, 302)
    if first.status == 302:  # an answer like any other: not followed
        assert first.header(b"location") == "http://elsewhere.example/"
    assert dialer.dialed == [(ADDRESS, 8080)]  # one connection served both
    (stream,) = dialer.streams
    assert stream.requests == 2
    assert not stream.closed
    await c.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n\r\nuntil the server closes",  # no length: read to the close
    ],
    ids=["connection-close", "http-1.0", "read-until-close"],
)
async def test_a_connection_the_server_ends_is_closed_and_not_reused(answer: bytes) -> None:
    dialer = ScriptedDialer(lambda: ScriptedStream([answer]))
    c = client(dialer)
    assert (await post(c)).status == 200
    assert dialer.streams[0].closed
    assert (await post(c)).status == 200
    assert len(dialer.dialed) == 2
    await c.aclose()


async def test_an_answer_cut_short_is_a_protocol_error_and_the_connection_is_closed() -> None:
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part"
    dialer = ScriptedDialer(lambda: ScriptedStream([cut]))
    c = client(dialer)
    with pytest.raises(httpx.RemoteProtocolError):
        await post(c)
    assert dialer.streams[0].closed
    assert c.idle_connections == 0


async def test_a_garbled_answer_is_a_protocol_error() -> None:
    dialer = ScriptedDialer(lambda: ScriptedStream([b"SMTP ready\r\n\r\n"]))
    c = client(dialer)
    with pytest.raises(httpx.RemoteProtocolError):
        await post(c)
    assert dialer.streams[0].closed


async def test_a_failed_write_is_not_sent_again() -> None:
    class Broken(ScriptedStream):
        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            await trio.lowlevel.checkpoint()
            raise trio.BrokenResourceError("connection reset")

    dialer = ScriptedDialer(lambda: Broken([OK]))
    c = client(dialer)
    with pytest.raises(httpx.WriteError, match="connection reset"):
        await post(c)
    assert len(dialer.dialed) == 1  # no second try within the attempt
    assert dialer.streams[0].closed


# -- the pool -----------------------------------------------------------------------------------


async def test_idle_connections_expire(autojump_clock: Any) -> None:
    dialer = ScriptedDialer()
    c = client(dialer, keepalive_seconds=5.0)
    await post(c)
    await trio.sleep(4)
    await post(c)
    assert len(dialer.dialed) == 1  # still fresh
    await trio.sleep(5)
    await post(c)
    assert len(dialer.dialed) == 2  # expired: closed, and a new one dialed
    assert dialer.streams[0].closed
    await c.aclose()


async def test_the_pool_keeps_a_bounded_number_of_idle_connections() -> None:
    dialer = ScriptedDialer()
    c = client(dialer, max_idle=2)
    async with trio.open_nursery() as nursery:
        for _ in range(5):  # five at once: five connections
            nursery.start_soon(post, c)
    assert len(dialer.dialed) == 5
    assert c.idle_connections == 2
    assert sum(stream.closed for stream in dialer.streams) == 3
    await c.aclose()
    assert all(stream.closed for stream in dialer.streams)


async def test_a_cancelled_request_closes_its_connection() -> None:
    dialer = ScriptedDialer(lambda: ScriptedStream([], hang="receive"))
    c = client(dialer)
    with trio.move_on_after(0.01):
        await post(c)
    assert dialer.streams[0].closed
    assert c.idle_connections == 0


# -- timeouts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hang", "error"), [("send", httpx.WriteTimeout), ("receive", httpx.ReadTimeout)]
)
async def test_a_stalled_write_or_read_times_out(
    autojump_clock: Any, hang: str, error: type[Exception]
) -> None:
    dialer = ScriptedDialer(lambda: ScriptedStream([OK], hang=hang))
    c = client(dialer, timeout_seconds=3.0)
    start = trio.current_time()
    with pytest.raises(error):
        await post(c)
    assert trio.current_time() - start == pytest.approx(3.0)
    assert dialer.streams[0].closed


async def test_a_tls_handshake_that_stalls_times_out_and_closes_the_connection(
    autojump_clock: Any,
) -> None:
    dialer = ScriptedDialer(lambda: ScriptedStream([], hang="receive"))  # no ServerHello
    c = client(dialer, timeout_seconds=3.0)
    start = trio.current_time()
    with pytest.raises(httpx.ConnectTimeout):
        await post(c, origin=Origin("https", "hook.example", 443))
    assert trio.current_time() - start == pytest.approx(3.0)
    assert dialer.streams[0].closed
    assert c.idle_connections == 0


class Dripping(ScriptedStream):
    """A server that sends its answer a chunk every ``every`` seconds."""

    every = 2.0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.sleep(self.every)
        return await super().receive_some(max_bytes)


async def test_the_whole_answer_has_one_deadline(autojump_clock: Any) -> None:
    # each read comes within 3 s; all of them together would take 12 s
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 20000\r\n\r\n" + b"x" * 20000
    dialer = ScriptedDialer(lambda: Dripping([answer]))
    c = client(dialer, timeout_seconds=3.0, max_body_bytes=64 * 1024)
    start = trio.current_time()
    with pytest.raises(httpx.ReadTimeout, match=r"^reading the answer's body$"):
        await post(c)
    assert trio.current_time() - start == 3.0
    assert dialer.streams[0].closed


@pytest.mark.parametrize(
    ("phase", "dialer", "origin"),
    [
        ("connect", ScriptedDialer(hang_at=frozenset({ADDRESS})), ORIGIN),
        (
            "tls",  # no ServerHello
            ScriptedDialer(lambda: ScriptedStream([], hang="receive")),
            Origin("https", "hook.example", 443),
        ),
        ("write", ScriptedDialer(lambda: ScriptedStream([OK], hang="send")), ORIGIN),
        ("read", ScriptedDialer(lambda: ScriptedStream([OK], hang="receive")), ORIGIN),
        (
            "body",
            ScriptedDialer(lambda: Dripping([b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nx"])),
            ORIGIN,
        ),
    ],
)
async def test_the_deadline_given_ends_every_phase_and_names_it(
    autojump_clock: Any, phase: str, dialer: ScriptedDialer, origin: Origin
) -> None:
    c = client(dialer, timeout_seconds=60.0)  # the deadline given rules, not the timeout
    deadline = trio.current_time() + 2.5
    headers = [("host", "hook.example"), ("content-length", "2")]
    with pytest.raises(httpx.TimeoutException) as info:
        await c.post(origin, (ADDRESS,), b"/", headers, b"{}", deadline=deadline)
    assert str(info.value) == PHASES[phase]
    assert trio.current_time() == deadline
    assert all(stream.closed for stream in dialer.streams)
    assert c.idle_connections == 0


PROCESSING = b"HTTP/1.1 102 Processing\r\n\r\n"


async def test_informational_answers_up_to_the_cap_are_read_past() -> None:
    dialer = ScriptedDialer(lambda: ScriptedStream([PROCESSING * MAX_INFORMATIONAL + OK]))
    answer = await post(client(dialer))
    assert (answer.status, answer.excerpt) == (200, b"ok")


async def test_an_endless_stream_of_informational_answers_is_cut_at_the_cap(
    autojump_clock: Any,
) -> None:
    class Processing(ScriptedStream):
        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            await trio.lowlevel.checkpoint()
            self.served += 1
            return PROCESSING  # for ever, never a final answer

    dialer = ScriptedDialer(lambda: Processing([]))
    c = client(dialer, timeout_seconds=10.0)
    start = trio.current_time()
    with pytest.raises(httpx.RemoteProtocolError, match="more than 10 informational"):
        await post(c)
    assert trio.current_time() == start  # not read until the deadline
    assert dialer.streams[0].served == MAX_INFORMATIONAL + 1
    assert dialer.streams[0].closed


async def test_each_address_gets_an_equal_share_of_the_time_left(autojump_clock: Any) -> None:
    first, second, third = "93.184.216.34", "93.184.216.35", "93.184.216.36"
    dialer = ScriptedDialer(hang_at=frozenset({first, second}))
    c = client(dialer, timeout_seconds=3.0)
    start = trio.current_time()
    assert (await post(c, addresses=(first, second, third))).status == 200
    # 3 s among three: 1 s for the first; then 2 s left among two: 1 s for the second
    assert trio.current_time() - start == pytest.approx(2.0)
    assert [host for host, _ in dialer.dialed] == [first, second, third]
    await c.aclose()


async def test_a_dial_that_hangs_times_out_and_the_next_address_is_tried(
    autojump_clock: Any,
) -> None:
    slow, fast = "93.184.216.34", "93.184.216.35"
    dialer = ScriptedDialer(hang_at=frozenset({slow}))
    c = client(dialer, timeout_seconds=3.0)
    with pytest.raises(httpx.ConnectTimeout, match=r"^connecting$"):
        await post(c, addresses=(slow,))
    assert (await post(c, addresses=(slow, fast))).status == 200
    assert dialer.dialed == [(slow, 8080), (slow, 8080), (fast, 8080)]
    await c.aclose()


# -- the adapter's per-channel work -------------------------------------------------------------


def test_a_channels_url_and_headers_are_worked_out_once_per_value() -> None:
    adapter = WebhookAdapter(timeout_seconds=5, allow_private_networks=False)
    config = {"url": "http://93.184.216.34:8080/hook", "headers": {"X-Team": "a"}}
    first = adapter.endpoint(config)
    assert first.origin == Origin("http", "93.184.216.34", 8080)
    assert first.literal == ("93.184.216.34",)  # checked once, with the URL
    assert (first.target, first.host_header) == (b"/hook", "93.184.216.34:8080")
    assert adapter.endpoint(dict(config)) is first  # the same values: not parsed again
    patched = adapter.endpoint({**config, "headers": {"X-Team": "b"}})  # a PATCH: new values
    assert patched is not first
    assert patched.custom == {"X-Team": "b"}
    moved = adapter.endpoint({**config, "url": "https://example.com/hook"})
    assert (moved.origin, moved.literal) == (Origin("https", "example.com", 443), None)


def test_what_is_kept_per_channel_is_bounded() -> None:
    adapter = WebhookAdapter(timeout_seconds=5, allow_private_networks=False)
    first = adapter.endpoint({"url": "https://example.com/0"})
    for n in range(1, ENDPOINTS_KEPT + 1):
        adapter.endpoint({"url": f"https://example.com/{n}"})
    assert adapter.endpoint({"url": "https://example.com/0"}) is not first  # evicted


def test_a_config_that_cannot_be_sent_is_refused_every_time() -> None:
    adapter = WebhookAdapter(timeout_seconds=5, allow_private_networks=False)
    for config in [
        {"url": "http://127.0.0.1/hook"},
        {"url": "ftp://example.com/hook"},
        {"url": ["not", "a", "string"]},
        {"headers": {}},
        {"url": "https://example.com/hook", "headers": {"Host": "evil"}},
        {"url": "https://example.com/hook", "headers": ["X-Team"]},
        {"url": "https://example.com/hook", "headers": {"X-Team": ["a"]}},
    ]:
        for _ in range(2):  # a refusal is not kept as an endpoint
            with pytest.raises(PermanentError):
                adapter.endpoint(config)


# -- the adapter: one deadline per attempt ------------------------------------------------------


def slow_resolver(seconds: float, addresses: tuple[str, ...] = (ADDRESS,)) -> Any:
    async def resolve(host: str, port: int) -> tuple[str, ...]:
        await trio.sleep(seconds)
        return addresses

    return resolve


def adapter_with(resolver: Any, dialer: ScriptedDialer) -> WebhookAdapter:
    return WebhookAdapter(
        timeout_seconds=3, allow_private_networks=False, resolver=resolver, dialer=dialer
    )


HOOK = worker_message(channel_config={"url": "http://hook.example:8080/hook", "secret": None})


async def test_resolution_that_stalls_ends_at_the_attempts_deadline(autojump_clock: Any) -> None:
    dialer = ScriptedDialer()
    adapter = adapter_with(slow_resolver(3600), dialer)
    with pytest.raises(
        RetriableError, match=r"^could not resolve hook\.example: timed out after 3 s$"
    ) as info:
        await adapter.deliver(HOOK)
    assert info.value.unreachable
    assert trio.current_time() == 3.0
    assert dialer.dialed == []


async def test_the_deadline_covers_resolution_and_the_exchange_together(
    autojump_clock: Any,
) -> None:
    # 2 s to resolve, then an answer that never comes: cut 1 s later, not 3 s
    dialer = ScriptedDialer(lambda: ScriptedStream([], hang="receive"))
    adapter = adapter_with(slow_resolver(2), dialer)
    with pytest.raises(RetriableError) as info:
        await adapter.deliver(HOOK)
    assert str(info.value) == "timed out after 3 s waiting for the answer"
    assert info.value.unreachable  # a receiver that does not answer counts for its circuit
    assert trio.current_time() == 3.0
    await adapter.aclose()


async def test_an_answer_within_the_deadline_is_delivered(autojump_clock: Any) -> None:
    adapter = adapter_with(slow_resolver(2), ScriptedDialer())
    receipt = await adapter.deliver(HOOK)
    assert receipt is not None
    assert receipt.status_code == 200
    await adapter.aclose()


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        # as trio words a refused connect: the address is in the text, the errno says it all
        (
            lambda host, port: OSError(111, f"Error connecting to ({host!r}, {port}): refused"),
            "connection failed: ConnectError: ConnectionRefusedError: Connection refused",
        ),
        # a text with the address and no errno: the adapter scrubs the resolved addresses
        (
            lambda host, port: OSError(f"all attempts to connect to {host}:{port} failed"),
            "connection failed: ConnectError: OSError: all attempts to connect to "
            "[redacted]:8080 failed",
        ),
    ],
)
async def test_a_connection_error_names_no_resolved_address(error: Any, expected: str) -> None:
    class Refusing(ScriptedDialer):
        async def __call__(self, host: str, port: int) -> trio.abc.Stream:
            await trio.lowlevel.checkpoint()
            self.dialed.append((host, port))
            raise error(host, port)

    internal = "10.20.30.40"
    dialer = Refusing()
    adapter = WebhookAdapter(
        timeout_seconds=3, allow_private_networks=True, dialer=dialer,
        resolver=slow_resolver(0, (internal,)),
    )  # fmt: skip
    with pytest.raises(RetriableError) as info:
        await adapter.deliver(HOOK)
    assert dialer.dialed == [(internal, 8080)]
    assert str(info.value) == expected
