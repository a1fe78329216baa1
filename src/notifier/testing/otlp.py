"""A local OTLP/HTTP receiver for tests: ``POST /v1/traces`` with an
``ExportTraceServiceRequest`` (protobuf, plain or gzip), answered 200, every span kept as a
``ReceivedSpan``. It runs on trio beside the test (``open_otlp_receiver``), on 127.0.0.1 at a
port of its own; point ``[tracing] otlp_endpoint`` at its ``endpoint``."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from notifier.testing.servers import Received, WebhookSink, open_sink

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str | None  # 16 hex digits; None for a trace's root
    kind: str  # "server", "client", "producer", "consumer", "internal"
    attributes: dict[str, Any]
    status: str  # "unset", "ok", "error"
    service_name: str | None
    start_ns: int
    end_ns: int


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    value = getattr(v, which)
    if which == "array_value":
        return [_value(x) for x in value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.values}
    return value


_KINDS = {
    ProtoSpan.SPAN_KIND_SERVER: "server",
    ProtoSpan.SPAN_KIND_CLIENT: "client",
    ProtoSpan.SPAN_KIND_PRODUCER: "producer",
    ProtoSpan.SPAN_KIND_CONSUMER: "consumer",
    ProtoSpan.SPAN_KIND_INTERNAL: "internal",
}
_STATUSES = {0: "unset", 1: "ok", 2: "error"}


def decode_spans(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        service = resource.get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex() or None,
                        kind=_KINDS.get(s.kind, "unspecified"),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        status=_STATUSES.get(s.status.code, "unset"),
                        service_name=service if isinstance(service, str) else None,
                        start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    )
                )  # fmt: skip
    return spans


@dataclass
class OtlpReceiver:
    sink: WebhookSink

    @property
    def endpoint(self) -> str:
        """The base URL (``[tracing] otlp_endpoint``)."""
        return f"http://127.0.0.1:{self.sink.port}"

    @property
    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in the order they came."""
        found: list[ReceivedSpan] = []
        for received in self.sink.received:
            if received.method == "POST" and received.path == TRACES_PATH:
                found.extend(decode_spans(_body(received)))
        return found

    async def wait_for(self, done: Callable[[list[ReceivedSpan]], bool]) -> list[ReceivedSpan]:
        """Wait until the spans received satisfy ``done``; bound it with ``trio.fail_after``."""
        seen = -1
        while True:
            if len(self.sink.received) != seen:
                seen = len(self.sink.received)
                if done(spans := self.spans):
                    return spans
            await self.sink.wait_for(seen + 1)


def _body(received: Received) -> bytes:
    if received.headers.get("content-encoding") == "gzip":
        return gzip.decompress(received.body)
    return received.body


def _answer(received: Received) -> tuple[int, dict[str, str], bytes]:
    if received.path != TRACES_PATH:
        return 404, {}, b""
    return (
        200,
        {"content-type": "application/x-protobuf"},
        ExportTraceServiceResponse().SerializeToString(),
    )


@asynccontextmanager
async def open_otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    """An ``OtlpReceiver`` serving for the length of the block."""
    async with open_sink(_answer) as sink:
        yield OtlpReceiver(sink)
