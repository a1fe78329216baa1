"""The HTTP/1.1 the webhook client speaks (``client.WebhookClient``): a request written in one
piece, and an answer read incrementally, as RFC 9112 frames a response to a POST.

It knows only what a client that sends a POST with a ``Content-Length`` and reads the answer
needs: the status line, the header fields (names lowercased), informational (1xx) answers, a
body delimited by ``Content-Length``, by the chunked coding, or by the close of the connection,
and whether the connection may carry another exchange afterwards. It has no I/O of its own:
the client feeds it what it reads and writes what it builds.

Why not h11, which the client used before: a general state machine validates and dispatches
every event, and a webhook exchange paid about 100 µs of CPU in it, the largest single cost
of a delivery after the socket calls. The rules here are the same for what a webhook sends
and receives, and the client's tests check the request it writes with h11's server side.

Errors: ``RemoteProtocolError`` for an answer that breaks HTTP/1.1 (or a connection closed
before the answer ended), ``LocalProtocolError`` for a request that could not be written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from notifier.errors import NotifierError

# A head (status line and fields) larger than this without its end is refused, as is a chunk
# size line or the trailer section past it.
MAX_HEAD_BYTES = 16 * 1024


class RemoteProtocolError(NotifierError):
    """The answer does not follow HTTP/1.1, or the connection ended before it did."""


class LocalProtocolError(NotifierError):
    """The request cannot be written as HTTP/1.1 (a field that is not one)."""


# RFC 9110 §5.1: a field name is a token; §5.5: a value is visible characters (and obs-text)
# with spaces and tabs only between them.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(r"(?:[\x21-\x7e](?:[ \t\x21-\x7e]*[\x21-\x7e])?)?")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_STATUS_LINE = re.compile(rb"HTTP/1\.([0-9]) ([0-9]{3})(?: [^\r\n]*)?")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]+)[ \t]*(?:;[^\r\n]*)?")
_DIGITS = re.compile(rb"[0-9]+")
# Field names seen valid already: the same dozen are written again and again.
_valid_names: set[str] = set()


def request_bytes(target: bytes, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    """``POST target HTTP/1.1``, the header fields as given (they must hold ``Host`` and
    ``Content-Length``), and the body, as one piece to write."""
    if not _TARGET.fullmatch(target):
        raise LocalProtocolError("the request target is not a valid one")
    lines = ["POST ", target.decode("ascii"), " HTTP/1.1\r\n"]
    for name, value in headers:
        if name not in _valid_names:
            if not _TOKEN.fullmatch(name):
                raise LocalProtocolError(f"not a valid header name: {name!r}")
            if len(_valid_names) < 256:
                _valid_names.add(name)
        if not _VALUE.fullmatch(value):
            raise LocalProtocolError(f"the value of the header {name} is not a valid one")
        lines += (name, ": ", value, "\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("ascii") + body


class Head:
    """A response's status line and fields (names lowercased, in order)."""

    __slots__ = ("headers", "minor", "status")

    def __init__(self, status: int, minor: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.minor = minor  # HTTP/1.<minor>
        self.headers = headers


NEED_DATA = object()  # next_event: feed more bytes (or the end of the stream)
END = object()  # next_event: the answer is complete

# body framings
_NONE, _LENGTH, _CHUNKED, _CLOSE = range(4)


class ResponseReader:
    """Answers read from one connection, one exchange after the other.

    Feed it what the connection reads (``feed``; ``b""`` is the end of the stream) and take
    ``next_event()``: ``NEED_DATA``; a ``Head`` (informational ones first, then the final one);
    ``bytes`` of the body; ``END``. After ``END``, ``reusable`` says whether the connection
    may carry another exchange; ``start_next`` readies the reader for it.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._eof = False
        self._head: Head | None = None
        self._framing = _NONE
        self._left = 0  # bytes of the body (or of the current chunk) still to come
        self._chunk_state = "size"  # size, data, crlf, trailer
        self._keep_alive = True
        self._done = False

    def feed(self, data: bytes | bytearray) -> None:
        if data:
            self._buf += data
        else:
            self._eof = True

    @property
    def reusable(self) -> bool:
        """The answer ended, the connection may stay open, and nothing more came after it."""
        return self._done and self._keep_alive and not self._buf and not self._eof

    def start_next(self) -> None:
        self._head = None
        self._framing = _NONE
        self._chunk_state = "size"
        self._done = False

    def next_event(self) -> object:
        if self._done:
            return END
        if self._head is None:
            return self._read_head()
        if self._framing == _LENGTH:
            return self._read_length()
        if self._framing == _CHUNKED:
            return self._read_chunked()
        return self._read_to_close()

    # -- the head ---------------------------------------------------------------------------

    def _head_end(self) -> tuple[int, int] | None:
        """Where the head ends in the buffer (its length, and where the body starts)."""
        crlf = self._buf.find(b"\r\n\r\n")
        lf = self._buf.find(b"\n\n")
        if crlf >= 0 and (lf < 0 or crlf + 1 <= lf):
            return crlf, crlf + 4
        if lf >= 0:
            return lf, lf + 2
        return None

    def _read_head(self) -> object:
        found = self._head_end()
        if found is None:
            if len(self._buf) > MAX_HEAD_BYTES:
                raise RemoteProtocolError("the answer's head is too long")
            if self._eof:
                raise RemoteProtocolError("the server closed the connection")
            return NEED_DATA
        end, start = found
        if end > MAX_HEAD_BYTES:
            raise RemoteProtocolError("the answer's head is too long")
        lines = bytes(self._buf[:end]).split(b"\n")
        del self._buf[:start]
        status_line = lines[0].removesuffix(b"\r")
        match = _STATUS_LINE.fullmatch(status_line)
        if match is None:
            raise RemoteProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        minor, status = int(match[1]), int(match[2])
        if status < 100:
            raise RemoteProtocolError(f"not a valid status code: {status}")
        head = Head(status, minor, _fields(lines[1:]))
        if status < 200:
            if status == 101:  # we never ask for an upgrade
                raise RemoteProtocolError("the server switched protocols unasked")
            return head  # informational: the final answer follows
        self._head = head
        self._frame(head)
        return head

    def _frame(self, head: Head) -> None:
        """How the body of the final answer ``head`` is delimited (RFC 9112 §6.3)."""
        connection: list[bytes] = []
        encodings: list[bytes] = []
        lengths: list[bytes] = []
        for name, value in head.headers:
            if name == b"content-length":
                lengths += (v.strip() for v in value.split(b","))
            elif name == b"transfer-encoding":
                encodings += (v.strip().lower() for v in value.split(b","))
            elif name == b"connection":
                connection += (v.strip().lower() for v in value.split(b","))
        self._keep_alive = head.minor >= 1 and b"close" not in connection
        if head.status in (204, 304):
            self._framing = _NONE
            self._done = True
        elif encodings:
            if encodings != [b"chunked"]:
                raise RemoteProtocolError("only Transfer-Encoding: chunked is supported")
            self._framing = _CHUNKED
        elif lengths:
            if any(not _DIGITS.fullmatch(v) for v in lengths) or len(set(lengths)) != 1:
                raise RemoteProtocolError("not a valid Content-Length")
            self._framing = _LENGTH
            self._left = int(lengths[0])
            self._done = self._left == 0
        else:
            self._framing = _CLOSE  # delimited by the close: the connection ends with it
            self._keep_alive = False

    # -- the body ---------------------------------------------------------------------------

    def _take(self, most: int) -> bytes:
        data = bytes(self._buf[:most])
        del self._buf[:most]
        return data

    def _counted(self) -> bytes | None:
        """What the buffer holds of the ``_left`` bytes still to come (of the body, or of the
        current chunk); None when it holds none yet."""
        if not self._buf:
            if self._eof:
                raise RemoteProtocolError("the server closed the connection")
            return None
        data = self._take(self._left)
        self._left -= len(data)
        return data

    def _read_length(self) -> object:
        data = self._counted()
        if data is None:
            return NEED_DATA
        self._done = self._left == 0
        return data

    def _read_to_close(self) -> object:
        if self._buf:
            return self._take(len(self._buf))
        if self._eof:
            self._done = True
            return END
        return NEED_DATA

    def _line(self) -> bytes | None:
        """The next line of the chunked framing (without its end), or None for more data."""
        end = self._buf.find(b"\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD_BYTES:
                raise RemoteProtocolError("a line of the chunked body is too long")
            if self._eof:
                raise RemoteProtocolError("the server closed the connection")
            return None
        line = bytes(self._buf[:end]).removesuffix(b"\r")
        del self._buf[: end + 1]
        return line

    def _read_chunked(self) -> object:
        while True:
            if self._chunk_state == "data":
                data = self._counted()
                if data is None:
                    return NEED_DATA
                if self._left == 0:
                    self._chunk_state = "crlf"
                return data
            line = self._line()
            if line is None:
                return NEED_DATA
            if self._chunk_state == "size":
                match = _CHUNK_SIZE.fullmatch(line)
                if match is None:
                    raise RemoteProtocolError("not a valid chunk size")
                self._left = int(match[1], 16)
                self._chunk_state = "data" if self._left else "trailer"
            elif self._chunk_state == "crlf":
                if line:
                    raise RemoteProtocolError("a chunk longer than its size")
                self._chunk_state = "size"
            elif not line:  # the end of the trailer section
                self._done = True
                return END


def _fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """The header fields of a head's lines (after the status line)."""
    fields: list[tuple[bytes, bytes]] = []
    for raw in lines:
        line = raw.removesuffix(b"\r")
        if line[:1] in (b" ", b"\t"):  # obs-fold: a continuation of the previous value
            if not fields:
                raise RemoteProtocolError("a header continuation without a header")
            name, value = fields[-1]
            fields[-1] = (name, (value + b" " + line.strip(b" \t")).strip(b" \t"))
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name or not _is_token(name):
            raise RemoteProtocolError(f"not a valid header line: {line[:80]!r}")
        value = value.strip(b" \t")
        if b"\x00" in value or b"\r" in value:
            raise RemoteProtocolError("a header value with a control character")
        fields.append((name.lower(), value))
    return fields


_TOKEN_BYTES = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _is_token(name: bytes) -> bool:
    return _TOKEN_BYTES.fullmatch(name) is not None
