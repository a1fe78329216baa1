"""The OTLP sink of ``--tracing``: an OTLP/HTTP receiver that answers 200 to every
``POST /v1/traces`` and counts what it received (requests, bytes, spans by name), run as a
process of its own so its CPU is measured apart from notifier's:

    python -m bench.otlp_sink --port PORT

``GET /stats`` answers the counts so far as JSON. The spans are counted by walking the protobuf
wire format of ``ExportTraceServiceRequest`` (``resource_spans`` → ``scope_spans`` → ``spans``
→ ``name``) without decoding anything else, so the sink needs no protobuf library and costs
little; a gzip-compressed body is unpacked first. The harness side (``OtlpSink``) starts it and
reads the counts."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.procs import Processes, wait_for
from bench.sink import free_port, listening

TRACES_PATH = "/v1/traces"
# the protobuf wire types
VARINT, I64, LEN, I32 = 0, 1, 2, 5
# field numbers in opentelemetry/proto: ExportTraceServiceRequest.resource_spans,
# ResourceSpans.scope_spans, ScopeSpans.spans, Span.name
RESOURCE_SPANS, SCOPE_SPANS, SPANS, SPAN_NAME = 1, 2, 2, 5


class WireError(ValueError):
    """The body is not a protobuf message as far as the wire format goes."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of each field of one protobuf message: the bytes of a
    length-delimited field, the integer of the others (fixed ones as read, little-endian)."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire in (I64, I32):
            size = 8 if wire == I64 else 4
            if pos + size > len(data):
                raise WireError("truncated fixed-size field")
            yield number, wire, int.from_bytes(data[pos : pos + size], "little")
            pos += size
        elif wire == LEN:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise WireError("truncated length-delimited field")
            yield number, wire, data[pos : pos + size]
            pos += size
        else:
            raise WireError(f"unsupported wire type {wire}")


def _children(data: bytes, number: int) -> Iterator[bytes]:
    for n, wire, value in fields(data):
        if n == number and wire == LEN and isinstance(value, bytes):
            yield value


def span_names(body: bytes) -> Counter[str]:
    """Spans by name in an ``ExportTraceServiceRequest`` (protobuf)."""
    names: Counter[str] = Counter()
    for resource in _children(body, RESOURCE_SPANS):
        for scope in _children(resource, SCOPE_SPANS):
            for span in _children(scope, SPANS):
                name = next(_children(span, SPAN_NAME), b"")
                names[name.decode("utf-8", "replace")] += 1
    return names


@dataclass
class Counts:
    """What the sink received; ``as_dict`` is the ``GET /stats`` answer."""

    requests: int = 0
    size: int = 0  # bytes as received (compressed when it was)
    spans: int = 0
    names: Counter[str] = field(default_factory=Counter)
    refused: int = 0  # requests that were not a POST of protobuf to /v1/traces

    def add(self, body: bytes, encoding: str) -> None:
        self.requests += 1
        self.size += len(body)
        if encoding == "gzip":
            body = gzip.decompress(body)
        names = span_names(body)
        self.spans += sum(names.values())
        self.names.update(names)

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "bytes": self.size, "spans": self.spans,
                "names": dict(self.names), "refused": self.refused}  # fmt: skip


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as an exporter's client expects
    counts = Counts()
    lock = threading.Lock()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if self.path != TRACES_PATH or kind != "application/x-protobuf":
            with self.lock:
                self.counts.refused += 1
            self._answer(404 if self.path != TRACES_PATH else 415, b"", "text/plain")
            return
        try:
            with self.lock:
                self.counts.add(body, encoding)
        except (WireError, OSError, EOFError):
            with self.lock:
                self.counts.refused += 1
            self._answer(400, b"", "text/plain")
            return
        # an empty ExportTraceServiceResponse: everything accepted
        self._answer(200, b"", "application/x-protobuf")

    def do_GET(self) -> None:
        if self.path != "/stats":
            self._answer(404, b"", "text/plain")
            return
        with self.lock:
            text = json.dumps(self.counts.as_dict()).encode()
        self._answer(200, text, "application/json")

    def _answer(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no line per request: the counts are the record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="OTLP/HTTP sink that counts spans")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _Handler)
    server.daemon_threads = True
    server.serve_forever()
    return 0


class OtlpSink:
    """The sink as the harness sees it: started on a spare loopback port; ``stats()`` reads its
    counts."""

    def __init__(self, procs: Processes) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        # a module of the bench package, run as ``python -m bench`` is: from the repository
        argv = [sys.executable, "-m", "bench.otlp_sink", "--port", str(self.port)]
        self.proc = procs.start("otlp-sink", argv)
        wait_for(lambda: listening(self.port), 10, "the OTLP sink to listen")

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.endpoint}/stats", timeout=5) as answer:
            data: dict[str, Any] = json.loads(answer.read())
        return data


if __name__ == "__main__":
    sys.exit(main())
