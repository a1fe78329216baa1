"""Tracing end to end on the real Postgres and RabbitMQ, with a local OTLP/HTTP receiver and a
local webhook receiver that fails the first request and then succeeds: one event's spans, their
parent links and attributes, the traceparent the receiver saw, the API's attempt records and a
JSON log line."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from notifier.logs import make_handler
from notifier.testing import open_sink
from notifier.testing.otlp import ReceivedSpan, open_otlp_receiver
from tests.integration.conftest import create_tenant, run_notifier, sql, wait_status
from tests.integration.test_worker import answers, fast_retries

TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
CALLER = f"00-{TRACE}-{CALLER_SPAN}-01"


@contextmanager
def json_log_lines(name: str) -> Iterator[io.StringIO]:
    """The JSON lines ``name``'s loggers write meanwhile, through the real handler."""
    stream = io.StringIO()
    handler = make_handler("json", stream)
    logger = logging.getLogger(name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    (span,) = [s for s in spans if s.name == name]
    return span


def complete(spans: list[ReceivedSpan]) -> bool:
    """The event's ingest and publish spans and its two attempts' are in."""
    names = [s.name for s in spans if s.trace_id == TRACE]
    return names.count("notifier.attempt") >= 2 and {"notifier.ingest", "notifier.publish"} <= {
        *names
    }


async def test_one_event_is_traced_from_ingest_through_a_retry_to_its_delivery(
    database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    async with open_otlp_receiver() as receiver, open_sink(answers(500)) as sink:
        config = fast_retries(
            database_url, broker_url,
            tracing={"otlp_endpoint": receiver.endpoint, "service_name": "notifier-it",
                     "export_interval_seconds": 0.1, "export_timeout_seconds": 5},
        )  # fmt: skip
        with json_log_lines("notifier.worker") as log_lines:
            async with run_notifier(config) as running, running.client(key) as api:
                channel = await api.post(
                    "/v1/channels",
                    json={"type": "webhook", "config": {"url": sink.url}, "event_types": ["*"]},
                )
                assert channel.status_code == 201, channel.text
                posted = await api.post(
                    "/v1/events", json={"type": "order.created", "payload": {"n": 1}},
                    headers={"traceparent": CALLER},
                )  # fmt: skip
                assert posted.status_code == 202, posted.text
                delivery_id = posted.json()["deliveries"][0]["id"]
                with trio.fail_after(30):
                    await wait_status(database_url, delivery_id, "DELIVERED")
                    spans = await receiver.wait_for(complete)
                detail = (await api.get(f"/v1/deliveries/{delivery_id}")).json()
    spans = [s for s in spans if s.trace_id == TRACE]
    assert {s.service_name for s in spans} == {"notifier-it"}

    # ingest: a child of the caller's span, stored with the event
    ingest = one(spans, "notifier.ingest")
    assert (ingest.kind, ingest.parent_span_id) == ("server", CALLER_SPAN)
    assert ingest.attributes["http.response.status_code"] == 202
    (stored,) = await sql(
        database_url, "SELECT traceparent FROM events WHERE id = $1", posted.json()["id"]
    )
    assert stored["traceparent"] == f"00-{TRACE}-{ingest.span_id}-01"

    # publish: the relay's, a child of the ingest span
    publish = one(spans, "notifier.publish")
    assert (publish.kind, publish.parent_span_id) == ("producer", ingest.span_id)
    assert publish.attributes["messaging.rabbitmq.destination.routing_key"] == "webhook"
    assert publish.attributes["notifier.confirm"] == "confirmed"

    # the two attempts: siblings under the publish span, the first a retry, then delivered
    attempts = sorted(
        (s for s in spans if s.name == "notifier.attempt"),
        key=lambda s: s.attributes["notifier.attempt"],
    )
    assert [s.parent_span_id for s in attempts] == [publish.span_id, publish.span_id]
    assert [s.kind for s in attempts] == ["client", "client"]
    origin = sink.url.rsplit("/", 1)[0]  # http://127.0.0.1:<port>, no path
    expected: list[dict[str, Any]] = [
        {"notifier.channel_type": "webhook", "notifier.destination_origin": origin,
         "notifier.attempt": n, "notifier.outcome": outcome, "http.response.status_code": code,
         "notifier.delivery_id": delivery_id}
        for n, outcome, code in ((1, "retry", 500), (2, "delivered", 200))
    ]  # fmt: skip
    assert [s.attributes for s in attempts] == expected

    # the receiver saw each attempt's own span as its parent
    first, second = sink.received
    assert first.headers["traceparent"] == f"00-{TRACE}-{attempts[0].span_id}-01"
    assert second.headers["traceparent"] == f"00-{TRACE}-{attempts[1].span_id}-01"

    # the API's attempt records name the spans
    assert [(a["outcome"], a["trace_id"], a["span_id"]) for a in detail["attempts"]] == [
        ("retry", TRACE, attempts[0].span_id),
        ("delivered", TRACE, attempts[1].span_id),
    ]

    # the worker's line of each attempt carries its trace and span
    lines = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    attempt_lines = [line for line in lines if line.get("delivery_id") == delivery_id]
    assert {(line["trace_id"], line["span_id"]) for line in attempt_lines} >= {
        (TRACE, attempts[0].span_id),
        (TRACE, attempts[1].span_id),
    }


async def test_with_tracing_off_a_caller_traceparent_reaches_the_receiver_unchanged(
    database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    config = fast_retries(database_url, broker_url)
    async with (
        open_sink(answers(500)) as sink,
        run_notifier(config) as running,
        running.client(key) as api,
    ):
        channel = await api.post(
            "/v1/channels",
            json={"type": "webhook", "config": {"url": sink.url}, "event_types": ["*"]},
        )
        assert channel.status_code == 201, channel.text
        posted = await api.post(
            "/v1/events", json={"type": "order.created", "payload": {}},
            headers={"traceparent": CALLER},
        )  # fmt: skip
        delivery_id = posted.json()["deliveries"][0]["id"]
        with trio.fail_after(30):
            await wait_status(database_url, delivery_id, "DELIVERED")
        detail = (await api.get(f"/v1/deliveries/{delivery_id}")).json()
    assert [r.headers["traceparent"] for r in sink.received] == [CALLER, CALLER]
    assert [(a["trace_id"], a["span_id"]) for a in detail["attempts"]] == [(TRACE, None)] * 2
