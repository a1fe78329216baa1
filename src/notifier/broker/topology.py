"""RabbitMQ names and queue arguments, as pure functions (docs/architecture.md §4). No I/O here."""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

EXCHANGE = "deliveries"
RETRY_EXCHANGE = "deliveries.retry"
DEAD_EXCHANGE = "deliveries.dead"
# FIFO channels (README "Ordered delivery (FIFO)"): single-active-consumer partitions, and the
# delay tiers that send a channel's wake-up back to its partition.
FIFO_EXCHANGE = "deliveries.fifo"
FIFO_WAIT_EXCHANGE = "deliveries.fifo.wait"
# An outbox row whose routing key is ``<type>`` + this is a FIFO channel's: the relay sends it
# to the channel's partition.
FIFO_SUFFIX = ".fifo"

# A quorum queue dead-letters a message that has been returned this many times (e.g. a message
# that crashes its worker process every time), so a crash loop cannot spin forever.
DELIVERY_LIMIT = 20


def main_queue(channel_type: str) -> str:
    return f"deliveries.{channel_type}"


def retry_queue(channel_type: str, seconds: int) -> str:
    return f"deliveries.{channel_type}.retry.{seconds}s"


def dead_queue(channel_type: str) -> str:
    return f"deliveries.{channel_type}.dead"


def fifo_partition(channel_id: uuid.UUID, partitions: int) -> int:
    """The partition of a FIFO channel: the same in every process, spread evenly (a uuid4's
    low bits are random)."""
    return channel_id.int % partitions


def fifo_routing_key(channel_type: str, partition: int) -> str:
    return f"{channel_type}{FIFO_SUFFIX}.{partition}"


def fifo_queue(channel_type: str, partition: int) -> str:
    return f"deliveries.{channel_type}{FIFO_SUFFIX}.{partition}"


def fifo_wait_queue(channel_type: str, seconds: int) -> str:
    return f"deliveries.{channel_type}{FIFO_SUFFIX}.wait.{seconds}s"


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


def fifo_queues(
    channel_type: str, tiers_seconds: Sequence[int], queue_type: str, partitions: int
) -> list[Queue]:
    """A type's FIFO partitions (single active consumer: one consumer of the fleet gets a
    partition's messages, the next takes over when it goes) and its FIFO delay tiers. A wake-up
    is published to a tier with the header ``CC`` naming its partition's routing key; the tier
    dead-letters with the message's own routing keys, so the ``CC`` one reaches the
    partition."""
    queues: list[Queue] = []
    for k in range(partitions):
        args = _kind(queue_type) | _dead_lettering(queue_type, DEAD_EXCHANGE, channel_type)
        args["x-single-active-consumer"] = True
        if queue_type == "quorum":
            args["x-delivery-limit"] = DELIVERY_LIMIT
        key = fifo_routing_key(channel_type, k)
        queues.append(Queue(fifo_queue(channel_type, k), args, FIFO_EXCHANGE, key))
    for s in tiers_seconds:
        name = fifo_wait_queue(channel_type, s)
        args = _kind(queue_type) | _dead_lettering(queue_type, FIFO_EXCHANGE, "")
        del args["x-dead-letter-routing-key"]  # the message's own keys, ``CC`` included
        args["x-message-ttl"] = s * 1000
        queues.append(Queue(name, args, FIFO_WAIT_EXCHANGE, name))
    return queues


def build_topology(
    channel_types: Iterable[str], tiers_seconds: Sequence[int], queue_type: str,
    fifo_partitions: int = 0,
) -> Topology:  # fmt: skip
    """Every type's queues; with ``fifo_partitions``, its FIFO partitions and tiers too."""
    queues: list[Queue] = []
    exchanges: tuple[str, ...] = (EXCHANGE, RETRY_EXCHANGE, DEAD_EXCHANGE)
    if fifo_partitions:
        exchanges += (FIFO_EXCHANGE, FIFO_WAIT_EXCHANGE)
    for t in channel_types:
        if fifo_partitions:
            queues.extend(fifo_queues(t, tiers_seconds, queue_type, fifo_partitions))
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
    return Topology(exchanges=exchanges, queues=queues)


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
