"""RabbitMQ names and queue arguments, as pure functions (docs/architecture.md §4). No I/O here."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

EXCHANGE = "deliveries"
RETRY_EXCHANGE = "deliveries.retry"
DEAD_EXCHANGE = "deliveries.dead"

# A quorum queue dead-letters a message that has been returned this many times (e.g. a message
# that crashes its worker process every time), so a crash loop cannot spin forever.
DELIVERY_LIMIT = 20


def main_queue(channel_type: str) -> str:
    return f"deliveries.{channel_type}"


def retry_queue(channel_type: str, seconds: int) -> str:
    return f"deliveries.{channel_type}.retry.{seconds}s"


def dead_queue(channel_type: str) -> str:
    return f"deliveries.{channel_type}.dead"


def tier_for(delay_seconds: float, tiers: Sequence[int]) -> int:
    """The smallest tier ≥ the wanted delay; the largest tier when the delay is longer."""
    i = bisect.bisect_left(tiers, delay_seconds)
    return tiers[min(i, len(tiers) - 1)]


@dataclass(frozen=True)
class Queue:
    name: str
    arguments: dict[str, Any]
    exchange: str
    routing_key: str


@dataclass(frozen=True)
class Topology:
    exchanges: tuple[str, ...] = (EXCHANGE, RETRY_EXCHANGE, DEAD_EXCHANGE)
    queues: list[Queue] = field(default_factory=list)


def routes_to(topology: Topology, exchange: str, routing_key: str) -> Topology:
    """The part of ``topology`` that a publish to ``exchange`` with ``routing_key`` needs: that
    exchange and the queues bound to it with that key. A publish that comes back unroutable
    names exactly these; declaring them again is what repairs it."""
    queues = [q for q in topology.queues if (q.exchange, q.routing_key) == (exchange, routing_key)]
    exchanges = (exchange,) if exchange in topology.exchanges else ()
    return Topology(exchanges=exchanges, queues=queues)


def _kind(queue_type: str) -> dict[str, Any]:
    return {"x-queue-type": queue_type}


def _dead_lettering(queue_type: str, exchange: str, routing_key: str) -> dict[str, Any]:
    args: dict[str, Any] = {
        "x-dead-letter-exchange": exchange,
        "x-dead-letter-routing-key": routing_key,
    }
    if queue_type == "quorum":
        # At-least-once dead-lettering: the broker keeps a message until the target confirmed it
        # (needs reject-publish overflow); the default at-most-once can lose it on the way.
        args["x-dead-letter-strategy"] = "at-least-once"
        args["x-overflow"] = "reject-publish"
    return args


def build_topology(
    channel_types: Iterable[str], tiers_seconds: Sequence[int], queue_type: str
) -> Topology:
    queues: list[Queue] = []
    for t in channel_types:
        main_args = _kind(queue_type) | _dead_lettering(queue_type, DEAD_EXCHANGE, t)
        if queue_type == "quorum":
            main_args["x-delivery-limit"] = DELIVERY_LIMIT
        queues.append(Queue(main_queue(t), main_args, EXCHANGE, t))
        for s in tiers_seconds:
            name = retry_queue(t, s)
            args = _kind(queue_type) | _dead_lettering(queue_type, EXCHANGE, t)
            args["x-message-ttl"] = s * 1000
            queues.append(Queue(name, args, RETRY_EXCHANGE, name))
        queues.append(Queue(dead_queue(t), _kind(queue_type), DEAD_EXCHANGE, t))
    return Topology(queues=queues)


def ingest_topology(queue: str, dead_letter_queue: str, queue_type: str) -> Topology:
    """AMQP ingest (``[amqp_ingest]``): ``queue``, on the default exchange (publishers send
    with routing key = the queue name), and ``dead_letter_queue``, bound with routing key
    ``queue`` to a direct exchange of the same name."""
    # The ingest queue itself only dead-letters when the broker gives up on a message (RabbitMQ
    # 4 gives quorum queues a delivery limit by default); its copy then lands in the same DLQ
    # instead of being dropped.
    args = _kind(queue_type) | _dead_lettering(queue_type, dead_letter_queue, queue)
    return Topology(
        exchanges=(dead_letter_queue,),
        queues=[
            Queue(queue, args, "", queue),
            Queue(dead_letter_queue, _kind(queue_type), dead_letter_queue, queue),
        ],
    )
