"""Ingest keeps an event's trace context: a valid ``traceparent`` header is stored with the
event (the lean routes and quart alike), a hostile one is ignored without an error, and with
tracing on the event keeps its ingest span's context, a child of the caller's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio

from notifier.config import TracingConfig, parse_config
from notifier.ingest.api.hot import ingest_routes
from notifier.ingest.api.http import ApiError
from notifier.ingest.app import create_app
from notifier.ingest.tenants import hash_api_key
from notifier.testing import RecordingAdapter
from notifier.testing.api import MemoryApiStore
from notifier.testing.otlp import open_otlp_receiver
from notifier.testing.tracing import RecordingTracing
from notifier.tracing import NO_TRACING, Tracing, setup_tracing
from tests.unit.test_ingest_hot_route import EVENT, exchange, post

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
GOOD = f"00-{TRACE}-00f067aa0ba902b7-01"


async def app_and_store(*, hot: bool, tracing: Tracing = NO_TRACING) -> tuple[Any, MemoryApiStore]:
    store = MemoryApiStore()
    await store.create_tenant("a", hash_api_key("key-a"))
    config = parse_config({"workers": {"webhook": {}}}, env={})
    app = create_app(store, config, {"webhook": RecordingAdapter("webhook")}, tracing=tracing)
    return (ingest_routes(app) if hot else app), store


async def stored_traceparents(
    headers: Sequence[tuple[str, str]], *, hot: bool, batch: bool = False
) -> list[str | None]:
    app, store = await app_and_store(hot=hot)
    request = (
        post("/v1/events/batch", {"events": [EVENT, EVENT]}, extra=headers)
        if batch
        else (post(extra=headers))
    )
    answer = await exchange(app, request)
    assert answer is not None
    assert answer.status == 202
    return [e.traceparent for e in store.events.values()]


@pytest.mark.parametrize("hot", [True, False])
async def test_a_valid_traceparent_is_stored_with_the_event(hot: bool) -> None:
    assert await stored_traceparents([("traceparent", GOOD)], hot=hot) == [GOOD]
    both = await stored_traceparents([("traceparent", GOOD)], hot=hot, batch=True)
    assert both == [GOOD, GOOD]
    assert await stored_traceparents([], hot=hot) == [None]


@pytest.mark.parametrize("hot", [True, False])
@pytest.mark.parametrize(
    "headers",
    [
        [("traceparent", "00-nonsense")],
        [("traceparent", GOOD.upper())],
        [("traceparent", f"00-{'0' * 32}-00f067aa0ba902b7-01")],
        [("traceparent", GOOD + " ")],
        [("traceparent", GOOD), ("traceparent", GOOD)],  # given twice: ignored
    ],
)
async def test_a_bad_traceparent_is_ignored(hot: bool, headers: list[tuple[str, str]]) -> None:
    assert await stored_traceparents(headers, hot=hot) == [None]


@pytest.mark.parametrize("hot", [True, False])
async def test_with_tracing_on_the_event_keeps_its_ingest_span(hot: bool) -> None:
    async with open_otlp_receiver() as receiver:
        tracing = setup_tracing(
            TracingConfig(otlp_endpoint=receiver.endpoint, export_interval_seconds=0.05)
        )
        app, store = await app_and_store(hot=hot, tracing=tracing)
        answer = await exchange(app, post(extra=[("traceparent", GOOD)]))
        assert answer is not None
        assert answer.status == 202
        answer = await exchange(app, post())  # no context: a new trace
        assert answer is not None
        with trio.fail_after(10):
            spans = await receiver.wait_for(lambda spans: len(spans) >= 2)
        await trio.to_thread.run_sync(tracing.shutdown, 1.0)
    child, root = (e.traceparent for e in store.events.values())
    assert child is not None
    assert root is not None
    by_id = {s.span_id: s for s in spans}
    span = by_id[child[36:52]]
    assert (span.name, span.kind, span.trace_id) == ("notifier.ingest", "server", TRACE)
    assert span.parent_span_id == "00f067aa0ba902b7"
    assert span.attributes["http.response.status_code"] == 202
    other = by_id[root[36:52]]
    assert other.parent_span_id is None
    assert other.trace_id != TRACE


@pytest.mark.parametrize("hot", [True, False])
async def test_a_refused_event_ends_its_ingest_span_failed(hot: bool) -> None:
    tracing = RecordingTracing()
    app, store = await app_and_store(hot=hot, tracing=tracing)
    answer = await exchange(app, post(extra=[("traceparent", GOOD), ("idempotency-key", " x")]))
    assert answer is not None
    assert answer.status == 422
    (span,) = tracing.spans
    assert (span.name, span.parent, span.ended) == ("notifier.ingest", GOOD, 1)
    assert isinstance(span.error, ApiError)
    assert store.events == {}
