"""The webhook client's HTTP/1.1 codec (``adapters.webhook.http11``), without sockets: the
request it writes as h11's server side reads it, and answers fed whole or a byte at a time."""

from __future__ import annotations

import h11
import pytest

from notifier.adapters.webhook.http11 import (
    END,
    MAX_HEAD_BYTES,
    NEED_DATA,
    Head,
    LocalProtocolError,
    RemoteProtocolError,
    ResponseReader,
    request_bytes,
)

HEADERS = [
    ("host", "hook.example:8080"), ("content-length", "8"), ("content-type", "application/json"),
    ("webhook-signature", "v1,abc= v1,def="),
]  # fmt: skip


def test_the_request_reads_back_as_written() -> None:
    server = h11.Connection(h11.SERVER)
    server.receive_data(request_bytes(b"/hook?x=1", HEADERS, b'{"n": 1}'))
    request = server.next_event()
    assert isinstance(request, h11.Request)
    assert (request.method, request.target, request.http_version) == (b"POST", b"/hook?x=1", b"1.1")
    assert [(k.decode(), v.decode()) for k, v in request.headers] == HEADERS
    data = server.next_event()
    assert isinstance(data, h11.Data)
    assert data.data == b'{"n": 1}'
    assert isinstance(server.next_event(), h11.EndOfMessage)


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        (b"/a b", HEADERS),
        (b"/", [("bad name", "x")]),
        (b"/", [("x-a", "line\r\nx-injected: 1")]),
        (b"/", [("x-a", " leading")]),
        (b"/", [("x-a", "caf\u00e9")]),
    ],
    ids=["space-in-target", "bad-name", "crlf-in-value", "leading-space", "non-ascii"],
)
def test_a_request_that_is_not_http_is_refused(
    target: bytes, headers: list[tuple[str, str]]
) -> None:
    with pytest.raises(LocalProtocolError):
        request_bytes(target, headers, b"")


def read_all(reader: ResponseReader, data: bytes, *, step: int = 0) -> list[object]:
    """Every event of ``data`` (then the end of the stream when the reader asks for more),
    fed at once or ``step`` bytes at a time; bodies joined."""
    chunks = [data] if not step else [data[i : i + step] for i in range(0, len(data), step)]
    events: list[object] = []
    while True:
        event = reader.next_event()
        if event is NEED_DATA:
            reader.feed(chunks.pop(0) if chunks else b"")
        elif isinstance(event, bytes) and events and isinstance(events[-1], bytes):
            events[-1] += event
        else:
            events.append(event)
            if event is END:
                return events


ANSWERS = [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", 200, b"hello", True),
    (b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n", 201, b"", True),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
     b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n", 200, b"hello world", True),
    (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b"", True),
    (b"HTTP/1.1 200 OK\n Content-Length: 2\n\nok", None, None, None),  # continuation first
    (b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok", 200, b"ok", True),  # bare LF lines
    (b"HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\ncontent-length: 2\r\n\r\nok",
     200, b"ok", False),
    (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", 200, b"ok", False),
    (b"HTTP/1.1 500 Oops\r\n\r\nto the close", 500, b"to the close", False),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\ncontent-length: 2\r\n\r\nok", 200, b"ok", True),
    (b"HTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok", 200, b"ok", True),  # no reason phrase
]  # fmt: skip


@pytest.mark.parametrize(("data", "status", "body", "reusable"), ANSWERS)
@pytest.mark.parametrize("step", [0, 1, 7])
def test_answers_read_whole_or_in_pieces(
    data: bytes, status: int | None, body: bytes | None, reusable: bool | None, step: int
) -> None:
    reader = ResponseReader()
    if status is None:
        with pytest.raises(RemoteProtocolError):
            read_all(reader, data, step=step)
        return
    events = read_all(reader, data, step=step)
    head = events[0]
    assert isinstance(head, Head)
    assert head.status == status
    assert b"".join(e for e in events if isinstance(e, bytes)) == body
    assert events[-1] is END
    # a close-delimited answer saw the end of the stream: never reused; the others were not
    # followed by it here, since the reader stopped asking once the answer ended
    assert reader.reusable is reusable


def test_names_are_lowercased_and_values_trimmed() -> None:
    reader = ResponseReader()
    reader.feed(
        b"HTTP/1.1 429 Slow\r\nRetry-After:  7 \r\nX-Folded: a\r\n  b\r\ncontent-length: 0\r\n\r\n"
    )
    head = reader.next_event()
    assert isinstance(head, Head)
    assert head.headers == [
        (b"retry-after", b"7"),
        (b"x-folded", b"a b"),
        (b"content-length", b"0"),
    ]
    assert reader.next_event() is END


def test_informational_answers_come_before_the_final_one() -> None:
    events = read_all(
        ResponseReader(),
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    )
    assert [e.status for e in events if isinstance(e, Head)] == [100, 102, 200]


def test_the_reader_carries_exchange_after_exchange() -> None:
    reader = ResponseReader()
    two = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na" * 2
    reader.feed(two)
    assert isinstance(reader.next_event(), Head)
    assert reader.next_event() == b"a"
    assert reader.next_event() is END
    assert not reader.reusable  # the second answer came unasked
    reader.start_next()
    assert isinstance(reader.next_event(), Head)
    assert reader.next_event() == b"a"
    assert reader.next_event() is END
    assert reader.reusable


@pytest.mark.parametrize(
    "data",
    [
        b"SMTP ready\r\n\r\n",
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx a: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\ncut",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab",
        b"HTTP/1.1 200 OK\r\ncontent-le",
        b"",
    ],
)
def test_an_answer_that_breaks_http_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        read_all(ResponseReader(), data)


def test_a_head_without_end_is_refused_past_the_bound() -> None:
    reader = ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\n" + b"x-a: b\r\n" * (MAX_HEAD_BYTES // 8 + 1))
    with pytest.raises(RemoteProtocolError, match="too long"):
        reader.next_event()
