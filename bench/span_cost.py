"""What tracing's spans cost one event, apart from everything else the event costs: a process
that makes, for each of ``--events`` events, the three spans notifier makes for an event with
the names, kinds, parents and attributes its ingest, relay and workers give them
(``notifier.ingest`` with two attributes set at its end, ``notifier.publish`` a child of it
with one, ``notifier.attempt`` a child of that), through ``notifier.tracing.setup_tracing`` and
the configured exporter, then stops tracing as notifier does (the last spans sent). Its CPU
(every thread's: the SDK's exporter thread too) from before the first span to after the stop
is printed as JSON. Run by ``just bench --tracing`` in a process of its own per mode:

    python -m bench.span_cost --events N [--endpoint URL --ratio R]

Without ``--endpoint``, tracing is off and no span is made, as notifier's code skips them then:
the loop alone, the floor the other modes are compared with. The SDK's span queue is made large
enough for every span (``OTEL_BSP_MAX_QUEUE_SIZE``, set by the harness), so that none is dropped
for want of room in a loop that makes them faster than notifier does."""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import uuid

from notifier.config import TracingConfig
from notifier.tracing import Kind, Tracing, setup_tracing


def cpu() -> float:
    """This process's CPU seconds so far, every thread's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_event(tracing: Tracing, tenant: str) -> None:
    """The spans of one delivered event, as ingest, the relay and a worker make them; with
    tracing off none, as notifier's code skips them then."""
    delivery, event = str(uuid.uuid4()), str(uuid.uuid4())
    if not tracing.enabled:
        return
    with tracing.span(
        "notifier.ingest", None, kind=Kind.SERVER,
        attributes={"url.path": "/v1/events", "notifier.tenant_id": tenant},
    ) as ingest:  # fmt: skip
        ingest.set("http.response.status_code", 202)
        ingest.set("notifier.event_id", event)
    publish = tracing.start(
        "notifier.publish", ingest.traceparent, kind=Kind.PRODUCER, new_trace=False,
        attributes={"messaging.system": "rabbitmq", "messaging.destination.name": "deliveries",
                    "messaging.rabbitmq.destination.routing_key": "webhook",
                    "notifier.delivery_id": delivery},
    )  # fmt: skip
    publish.set("notifier.confirm", "ack")
    publish.end()
    with tracing.span(
        "notifier.attempt", publish.traceparent, kind=Kind.CLIENT,
        attributes={"notifier.channel_type": "webhook",
                    "notifier.destination_origin": "http://127.0.0.1:8080",
                    "notifier.attempt": 1, "notifier.delivery_id": delivery},
    ):  # fmt: skip
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--endpoint", default="")
    parser.add_argument("--ratio", type=float, default=1.0)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    config = TracingConfig(otlp_endpoint=args.endpoint, sample_ratio=args.ratio,
                           export_interval_seconds=args.interval)  # fmt: skip
    tracing = setup_tracing(config)
    tenant = str(uuid.uuid4())
    one_event(tracing, tenant)  # the first spans pay for lazy set-up: not counted
    cpu0, t0 = cpu(), time.monotonic()
    for _ in range(args.events):
        one_event(tracing, tenant)
    cpu1, t1 = cpu(), time.monotonic()
    tracing.shutdown(10.0)
    cpu2, t2 = cpu(), time.monotonic()
    print(json.dumps({"events": args.events, "cpu_seconds": cpu2 - cpu0, "seconds": t2 - t0,
                      "cpu_seconds_spans": cpu1 - cpu0,
                      "cpu_seconds_stop": cpu2 - cpu1, "seconds_stop": t2 - t1}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
