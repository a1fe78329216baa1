"""Trace context: the strict ``traceparent`` check (hostile values are ignored, never an
error), tracing off passing the context through, and tracing on exporting spans with their
parent links to a local OTLP/HTTP receiver."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable
from typing import Any

import trio

from notifier.config import TracingConfig
from notifier.logs import make_handler
from notifier.testing.otlp import open_otlp_receiver
from notifier.tracing import (
    NO_TRACING,
    Kind,
    Span,
    current_traceparent,
    parse_traceparent,
    setup_tracing,
    span_id_of,
    trace_id_of,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
GOOD = f"00-{TRACE}-{PARENT}-01"


def test_a_valid_traceparent_is_kept() -> None:
    assert parse_traceparent(GOOD) == GOOD
    assert parse_traceparent(GOOD.encode()) == GOOD
    assert parse_traceparent(f"00-{TRACE}-{PARENT}-00") == f"00-{TRACE}-{PARENT}-00"
    assert trace_id_of(GOOD) == TRACE
    assert span_id_of(GOOD) == PARENT


def test_a_later_version_is_read_as_version_00() -> None:
    assert parse_traceparent(f"01-{TRACE}-{PARENT}-01") == GOOD
    assert parse_traceparent(f"cc-{TRACE}-{PARENT}-01-what-comes-next") == GOOD


HOSTILE = [
    None,
    17,
    "",
    "00",
    GOOD.upper(),  # upper case hex
    f"00-{'0' * 32}-{PARENT}-01",  # an all-zero trace id
    f"00-{TRACE}-{'0' * 16}-01",  # an all-zero parent id
    f"ff-{TRACE}-{PARENT}-01",  # the forbidden version
    f"00-{TRACE}-{PARENT}-01-extra",  # version 00 has nothing more
    f"01-{TRACE}-{PARENT}-01extra",  # a later version's next field needs its dash
    f"00-{TRACE[:-1]}g-{PARENT}-01",  # not hex
    f"00_{TRACE}_{PARENT}_01",  # wrong separators
    f" {GOOD}"[:55],  # leading space
    f"00-{TRACE}-{PARENT}-0",  # short
    f"00-{TRACE}-{PARENT}-01\n",
    f"00-{TRACE}-{PARENT}-\u0661\u0662",  # non-ASCII digits
    "00-" + "é" * 32 + f"-{PARENT}-01",
    b"\xff" * 55,
    f"01-{TRACE}-{PARENT}-01-" + "x" * 10_000,  # absurdly long
]


def test_hostile_values_are_ignored() -> None:
    for value in HOSTILE:
        assert parse_traceparent(value) is None, value


def test_tracing_off_passes_the_context_through_unchanged() -> None:
    tracing = setup_tracing(TracingConfig())
    assert tracing is NO_TRACING
    assert current_traceparent() is None
    with tracing.span("notifier.ingest", GOOD, kind=Kind.SERVER) as span:
        assert span.traceparent == GOOD
        assert current_traceparent() == GOOD
        assert (span.trace_id, span.span_id) == (TRACE, None)  # no span of its own
    assert current_traceparent() is None
    with tracing.span("notifier.ingest", None) as span:
        assert span.traceparent is None
        assert span.trace_id is None


async def test_tracing_on_exports_spans_with_their_parents() -> None:
    async with open_otlp_receiver() as receiver:
        config = TracingConfig(
            otlp_endpoint=receiver.endpoint, service_name="notifier-test",
            export_interval_seconds=0.05, export_timeout_seconds=5,
        )  # fmt: skip
        tracing = setup_tracing(config)
        assert tracing.enabled
        with tracing.span("notifier.ingest", GOOD, kind=Kind.SERVER) as ingest:
            assert ingest.traceparent is not None
            assert ingest.trace_id == TRACE
            assert ingest.span_id is not None
            assert ingest.span_id != PARENT
            assert current_traceparent() == ingest.traceparent
        child = tracing.start("notifier.attempt", ingest.traceparent, kind=Kind.CLIENT)
        child.set("notifier.attempt", 2)
        child.set("http.response.status_code", None)  # left out
        child.end(RuntimeError("receiver said no"))
        with tracing.span("notifier.ingest", None) as root:
            pass
        assert root.trace_id is not None
        assert root.trace_id != TRACE
        with trio.fail_after(10):
            spans = await receiver.wait_for(lambda spans: len(spans) >= 3)
            await trio.to_thread.run_sync(tracing.shutdown, 5.0)
    by_id = {s.span_id: s for s in spans}
    first = by_id[ingest.span_id]
    assert (first.name, first.kind, first.trace_id) == ("notifier.ingest", "server", TRACE)
    assert first.parent_span_id == PARENT
    assert first.service_name == "notifier-test"
    second = by_id[child.span_id]  # type: ignore[index]
    assert second.parent_span_id == ingest.span_id
    assert second.attributes == {"notifier.attempt": 2}
    assert second.status == "error"
    third = by_id[root.span_id]  # type: ignore[index]
    assert third.parent_span_id is None
    assert third.trace_id == root.trace_id


def test_a_sampled_out_trace_records_no_span_but_passes_its_context() -> None:
    config = TracingConfig(otlp_endpoint="http://127.0.0.1:9", sample_ratio=0.0)
    tracing = setup_tracing(config)
    try:
        with tracing.span("notifier.ingest", None) as span:
            assert span.traceparent is not None
            assert int(span.traceparent[-2:], 16) & 1 == 0  # not sampled
            assert span.span_id is None
        sampled = f"00-{TRACE}-{PARENT}-01"  # the caller's decision is followed
        with tracing.span("notifier.ingest", sampled) as span:
            assert span.span_id is not None
    finally:
        tracing.shutdown(0.1)


def _json_lines(emit: Callable[[logging.Logger], None]) -> list[dict[str, Any]]:
    stream = io.StringIO()
    handler = make_handler("json", stream)
    logger = logging.getLogger("notifier.test_tracing")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_inside_a_span_carry_its_ids() -> None:
    tracing = setup_tracing(TracingConfig(otlp_endpoint="http://127.0.0.1:9"))
    try:

        def emit(logger: logging.Logger) -> None:
            logger.info("outside")
            with tracing.span("notifier.attempt", GOOD) as span:
                logger.info("inside")
                spans.append(span)
            with NO_TRACING.span("notifier.attempt", GOOD):
                logger.info("carried")

        spans: list[Span] = []
        outside, inside, carried = _json_lines(emit)
    finally:
        tracing.shutdown(0.1)
    assert "trace_id" not in outside
    assert "span_id" not in outside
    assert inside["trace_id"] == TRACE
    assert inside["span_id"] == spans[0].span_id
    # tracing off: the trace the event came with, and no span of notifier's own
    assert carried["trace_id"] == TRACE
    assert "span_id" not in carried


async def test_the_last_flush_is_bounded_when_the_receiver_is_down() -> None:
    # Nothing listens there: the exporter retries with backoff until the flush's time is up.
    tracing = setup_tracing(
        TracingConfig(otlp_endpoint="http://127.0.0.1:9", export_timeout_seconds=30)
    )
    with tracing.span("notifier.ingest", None):
        pass
    started = trio.current_time()
    with trio.fail_after(5):
        await trio.to_thread.run_sync(tracing.shutdown, 0.5)
    assert trio.current_time() - started < 2.0
