"""``RecordingTracing``: tracing on, in memory. Each span started is kept as a
``RecordedSpan`` (its name, parent, attributes, whether and how it ended) with ids of its own,
so unit tests see what a component traced without an exporter."""

from __future__ import annotations

import itertools

from notifier.tracing import Attributes, Kind, Span, Tracing

TRACE_OF_NEW = "1" * 32  # the trace id of the traces it starts


class RecordedSpan(Span):
    __slots__ = ("attributes", "ended", "error", "kind", "name", "parent")

    def __init__(
        self, traceparent: str, *, name: str, parent: str | None, kind: Kind,
        attributes: Attributes | None,
    ) -> None:  # fmt: skip
        super().__init__(traceparent, recorded=True)
        self.name = name
        self.parent = parent
        self.kind = kind
        self.attributes: dict[str, str | int | float | bool] = dict(attributes or {})
        self.ended = 0  # how many times ``end`` was called
        self.error: BaseException | None = None

    def set(self, key: str, value: str | int | float | bool | None) -> None:
        if value is not None:
            self.attributes[key] = value

    def end(self, error: BaseException | None = None) -> None:
        if not self.ended:
            self.error = error
        self.ended += 1


class RecordingTracing(Tracing):
    enabled = True

    def __init__(self) -> None:
        self.spans: list[RecordedSpan] = []
        self._ids = itertools.count(1)

    def start(
        self, name: str, parent: str | None, *, kind: Kind = Kind.INTERNAL,
        attributes: Attributes | None = None, new_trace: bool = True,
    ) -> Span:  # fmt: skip
        if parent is None and not new_trace:
            return Span(None)
        trace_id = parent[3:35] if parent is not None else TRACE_OF_NEW
        span = RecordedSpan(
            f"00-{trace_id}-{next(self._ids):016x}-01", name=name, parent=parent, kind=kind,
            attributes=attributes,
        )  # fmt: skip
        self.spans.append(span)
        return span
