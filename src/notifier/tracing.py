"""Trace context and spans (README, Tracing; docs/architecture.md §5).

An event's W3C ``traceparent`` travels with it as a plain string: ingest takes it from the
request (``parse_traceparent``: strict, anything else is ignored), stores it with the event and
its outbox rows, the relay sends it as the AMQP header ``traceparent``, the worker reads it back
and the webhook adapter sends it to the receiver. That much happens whether tracing is on or
not, and costs no more than carrying the string.

With ``[tracing] otlp_endpoint`` set, ``setup_tracing`` returns an ``OtelTracing``: each stage
then starts a span as a child of the context it was given (ingest, publish, one per attempt),
and what it passes on is the new span's traceparent. The OpenTelemetry SDK is imported only
then; with tracing off, ``NO_TRACING`` hands the given context through unchanged.

``current_span()`` is the span the running task is in (a trio task's context variable): the
log handler writes its ids into every line (``logs.TraceFilter``), and the webhook adapter
sends its ``traceparent`` (``current_traceparent()``).
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from notifier.config import TracingConfig

log = logging.getLogger("notifier.tracing")

HEADER = "traceparent"  # the HTTP and AMQP header
_HEX = frozenset("0123456789abcdef")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16

Attributes = Mapping[str, str | int | float | bool]
# At the end of a stop, the spans not sent yet are sent within this long.
FLUSH_ON_STOP_SECONDS = 5.0


def parse_traceparent(value: object) -> str | None:
    """A W3C ``traceparent`` value, strictly checked, as version 00; ``None`` for anything
    else (never an error: a bad header is ignored). Version 00 is exactly
    ``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``, lowercase, ids not all zeros;
    a later version (not ``ff``) may carry more fields after these, which are dropped."""
    if isinstance(value, bytes):
        if len(value) > 512:
            return None
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str) or len(value) < 55 or len(value) > 512:
        return None
    version = value[:2]
    if not (set(version) <= _HEX) or version == "ff":
        return None
    if version == "00" and len(value) != 55:
        return None
    if len(value) > 55 and value[55] != "-":
        return None
    head = value[:55]
    if head[2] != "-" or head[35] != "-" or head[52] != "-":
        return None
    trace_id, span_id, flags = head[3:35], head[36:52], head[53:55]
    if not (set(trace_id) <= _HEX and set(span_id) <= _HEX and set(flags) <= _HEX):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def trace_id_of(traceparent: str) -> str:
    """The trace id of a checked traceparent (``parse_traceparent``'s)."""
    return traceparent[3:35]


def span_id_of(traceparent: str) -> str:
    """The parent (span) id of a checked traceparent."""
    return traceparent[36:52]


class Kind(enum.Enum):
    SERVER = "server"
    PRODUCER = "producer"
    CLIENT = "client"
    INTERNAL = "internal"


class Span:
    """One started span, or (tracing off) the context passed through in its place.

    ``traceparent`` is what goes on: the span's own, or the given one with tracing off.
    ``span_id`` is ``None`` when no span was recorded."""

    __slots__ = ("span_id", "trace_id", "traceparent")

    def __init__(self, traceparent: str | None, *, recorded: bool = False) -> None:
        self.traceparent = traceparent
        self.trace_id = trace_id_of(traceparent) if traceparent else None
        self.span_id = span_id_of(traceparent) if traceparent and recorded else None

    def set(self, key: str, value: str | int | float | bool | None) -> None:
        """Set an attribute (a ``None`` value is left out)."""

    def end(self, error: BaseException | None = None) -> None:
        """End the span (once; later calls do nothing), failed when ``error`` is given."""


_current: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "notifier_span", default=None
)


def current_span() -> Span | None:
    """The span the running task is in (with tracing off: the context it carries along)."""
    return _current.get()


def current_traceparent() -> str | None:
    """The traceparent of the span the running task is in (or the context it carries along
    with tracing off); ``None`` outside any."""
    span = _current.get()
    return None if span is None else span.traceparent


class Tracing:
    """Tracing off: spans are not made; the given context is passed on unchanged."""

    enabled = False

    def start(
        self, name: str, parent: str | None, *, kind: Kind = Kind.INTERNAL,
        attributes: Attributes | None = None, new_trace: bool = True,
    ) -> Span:  # fmt: skip
        """Start a span named ``name`` as a child of ``parent`` (a checked traceparent), or as
        the root of a new trace without one when ``new_trace``. End it with ``Span.end``."""
        return Span(parent)

    @contextlib.contextmanager
    def span(
        self, name: str, parent: str | None, *, kind: Kind = Kind.INTERNAL,
        attributes: Attributes | None = None, new_trace: bool = True,
    ) -> Iterator[Span]:  # fmt: skip
        """``start`` for the block, the running task's current context meanwhile; ended
        when the block ends, failed when it raises."""
        span = self.start(name, parent, kind=kind, attributes=attributes, new_trace=new_trace)
        token = _current.set(span)
        error: BaseException | None = None
        try:
            yield span
        except BaseException as exc:
            error = exc
            raise
        finally:
            _current.reset(token)
            span.end(error)

    def shutdown(self, timeout_seconds: float) -> None:
        """Blocking. Send the spans not sent yet and stop the exporter, within about
        ``timeout_seconds``."""


NO_TRACING = Tracing()


def setup_tracing(config: TracingConfig) -> Tracing:
    """``NO_TRACING`` while ``otlp_endpoint`` is empty (the SDK is not imported); else spans
    exported in batches to ``<otlp_endpoint>/v1/traces``."""
    if not config.enabled:
        return NO_TRACING
    from notifier.tracing_otel import OtelTracing

    tracing = OtelTracing(config)
    log.info("tracing: spans are exported to %s", config.receiver())
    return tracing


@contextlib.asynccontextmanager
async def open_tracing(config: TracingConfig) -> AsyncIterator[Tracing]:
    """Trio-flavoured. ``setup_tracing`` for the block; when it ends (even cut short), the
    spans not sent yet are sent and the exporter stopped within ``FLUSH_ON_STOP_SECONDS``: a
    receiver that is down costs the stop no more."""
    tracing = setup_tracing(config)
    try:
        yield tracing
    finally:
        if tracing.enabled:
            with trio.CancelScope(shield=True), trio.move_on_after(FLUSH_ON_STOP_SECONDS + 1):
                await trio.to_thread.run_sync(
                    tracing.shutdown, FLUSH_ON_STOP_SECONDS, abandon_on_cancel=True
                )
