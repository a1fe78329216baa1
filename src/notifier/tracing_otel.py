"""Tracing on: spans made with the OpenTelemetry SDK and exported in batches over OTLP/HTTP
(protobuf). Imported by ``tracing.setup_tracing`` only when ``[tracing] otlp_endpoint`` is set.

The provider is notifier's own, not the process-wide global one. Spans go to a
``BatchSpanProcessor``: ended spans wait in a bounded queue (a full queue drops spans) and a
thread of the SDK's sends them every ``export_interval_seconds``, each send bounded by
``export_timeout_seconds``. A receiver that is down or slow therefore costs dropped spans and a
log line, never a delivery."""

from __future__ import annotations

import threading

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

from notifier.config import TracingConfig
from notifier.tracing import Attributes, Kind, Span, Tracing

_KINDS = {
    Kind.SERVER: trace.SpanKind.SERVER,
    Kind.PRODUCER: trace.SpanKind.PRODUCER,
    Kind.CLIENT: trace.SpanKind.CLIENT,
    Kind.INTERNAL: trace.SpanKind.INTERNAL,
}


def _traceparent(context: SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _parent_context(traceparent: str) -> Context:
    """The context of a remote parent given as a checked traceparent."""
    parent = SpanContext(
        trace_id=int(traceparent[3:35], 16), span_id=int(traceparent[36:52], 16),
        is_remote=True, trace_flags=TraceFlags(int(traceparent[53:55], 16)),
    )  # fmt: skip
    return trace.set_span_in_context(NonRecordingSpan(parent))


class OtelSpan(Span):
    __slots__ = ("_ended", "_span")

    def __init__(self, span: trace.Span) -> None:
        super().__init__(_traceparent(span.get_span_context()), recorded=span.is_recording())
        self._span = span
        self._ended = False

    def set(self, key: str, value: str | int | float | bool | None) -> None:
        if value is not None:
            self._span.set_attribute(key, value)

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        if error is not None:
            # The type only: an exception's text may quote what a client or receiver sent.
            self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self._span.end()


class OtelTracing(Tracing):
    enabled = True

    def __init__(self, config: TracingConfig) -> None:
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
            shutdown_on_exit=False,  # shut down by the service, bounded
        )
        self._exporter = OTLPSpanExporter(
            endpoint=config.traces_url(), timeout=config.export_timeout_seconds
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(
                self._exporter,
                schedule_delay_millis=config.export_interval_seconds * 1000,
                export_timeout_millis=config.export_timeout_seconds * 1000,
            )
        )
        self._tracer = self._provider.get_tracer("notifier")

    def start(
        self, name: str, parent: str | None, *, kind: Kind = Kind.INTERNAL,
        attributes: Attributes | None = None, new_trace: bool = True,
    ) -> Span:  # fmt: skip
        if parent is None and not new_trace:
            return Span(None)
        context = _parent_context(parent) if parent is not None else Context()
        span = self._tracer.start_span(
            name, context=context, kind=_KINDS[kind], attributes=attributes
        )
        return OtelSpan(span)

    def shutdown(self, timeout_seconds: float) -> None:
        # The spans waiting are sent. The SDK's flush takes no bound of its own (each send is
        # bounded by export_timeout_seconds, retries included), so the exporter is stopped
        # once the time is up, which ends a send that is retrying; a send under way ends
        # within its own timeout.
        cut = threading.Timer(timeout_seconds, self._exporter.shutdown)
        cut.daemon = True
        cut.start()
        try:
            self._provider.force_flush()
        finally:
            cut.cancel()
        self._provider.shutdown()
