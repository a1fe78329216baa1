"""RabbitMQ names and queue arguments (docs/architecture.md §4): pure functions, no broker."""

from __future__ import annotations

import pytest

from notifier.broker.topology import (
    DEAD_EXCHANGE,
    DELIVERY_LIMIT,
    EXCHANGE,
    RETRY_EXCHANGE,
    Queue,
    build_topology,
    dead_queue,
    main_queue,
    retry_queue,
    tier_for,
)
from notifier.config import RetryConfig

TIERS = RetryConfig().tiers_seconds


def test_names() -> None:
    assert (EXCHANGE, RETRY_EXCHANGE, DEAD_EXCHANGE) == (
        "deliveries",
        "deliveries.retry",
        "deliveries.dead",
    )
    assert main_queue("webhook") == "deliveries.webhook"
    assert retry_queue("webhook", 30) == "deliveries.webhook.retry.30s"
    assert dead_queue("webhook") == "deliveries.webhook.dead"


@pytest.mark.parametrize(
    ("delay", "tier"),
    [
        (0, 1),  # no delay: the shortest tier
        (0.2, 1),  # rounded up to the first tier
        (1, 1),  # exactly a tier
        (1.5, 5),  # rounded up, never down
        (5, 5),
        (30, 30),  # exactly a tier in the middle
        (31, 60),  # just past a tier: the next one
        (1800, 1800),  # the largest tier
        (1801, 1800),  # longer than the largest tier: the largest
        (99999, 1800),
    ],
)
def test_tier_for(delay: float, tier: int) -> None:
    assert tier_for(delay, TIERS) == tier


def test_tier_for_other_tiers() -> None:
    assert tier_for(3, [2, 4, 8]) == 4
    assert tier_for(9, [2, 4, 8]) == 8
    assert tier_for(9, [10]) == 10


def queues_by_name(queue_type: str, tiers: tuple[int, ...] = TIERS) -> dict[str, Queue]:
    topology = build_topology(["webhook"], tiers, queue_type)
    assert topology.exchanges == ("deliveries", "deliveries.retry", "deliveries.dead")
    by_name = {q.name: q for q in topology.queues}
    assert len(by_name) == len(topology.queues)  # no queue declared twice
    return by_name


def test_quorum_main_queue() -> None:
    q = queues_by_name("quorum")["deliveries.webhook"]
    assert (q.exchange, q.routing_key) == ("deliveries", "webhook")
    assert q.arguments == {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "deliveries.dead",
        "x-dead-letter-routing-key": "webhook",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-delivery-limit": DELIVERY_LIMIT,
    }


@pytest.mark.parametrize("seconds", TIERS)
def test_quorum_retry_tier(seconds: int) -> None:
    name = f"deliveries.webhook.retry.{seconds}s"
    q = queues_by_name("quorum")[name]
    assert (q.exchange, q.routing_key) == ("deliveries.retry", name)
    assert q.arguments == {
        "x-queue-type": "quorum",
        "x-message-ttl": seconds * 1000,
        "x-dead-letter-exchange": "deliveries",
        "x-dead-letter-routing-key": "webhook",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def test_quorum_dead_queue() -> None:
    q = queues_by_name("quorum")["deliveries.webhook.dead"]
    assert (q.exchange, q.routing_key) == ("deliveries.dead", "webhook")
    assert q.arguments == {"x-queue-type": "quorum"}


def test_one_retry_queue_per_tier_and_nothing_else() -> None:
    names = set(queues_by_name("quorum", (2, 4)))
    assert names == {
        "deliveries.webhook",
        "deliveries.webhook.retry.2s",
        "deliveries.webhook.retry.4s",
        "deliveries.webhook.dead",
    }


def test_classic_queues_omit_the_quorum_only_arguments() -> None:
    queues = queues_by_name("classic")
    assert queues["deliveries.webhook"].arguments == {
        "x-queue-type": "classic",
        "x-dead-letter-exchange": "deliveries.dead",
        "x-dead-letter-routing-key": "webhook",
    }
    assert queues["deliveries.webhook.retry.30s"].arguments == {
        "x-queue-type": "classic",
        "x-message-ttl": 30_000,
        "x-dead-letter-exchange": "deliveries",
        "x-dead-letter-routing-key": "webhook",
    }
    assert queues["deliveries.webhook.dead"].arguments == {"x-queue-type": "classic"}


def test_every_type_gets_its_own_queues() -> None:
    topology = build_topology(["webhook", "email"], (1, 5), "quorum")
    routes = {(q.name, q.exchange, q.routing_key) for q in topology.queues}
    assert ("deliveries.email", "deliveries", "email") in routes
    assert ("deliveries.email.dead", "deliveries.dead", "email") in routes
    assert (
        "deliveries.email.retry.5s",
        "deliveries.retry",
        "deliveries.email.retry.5s",
    ) in routes
    email_retry = next(q for q in topology.queues if q.name == "deliveries.email.retry.1s")
    assert email_retry.arguments["x-dead-letter-routing-key"] == "email"
    assert len(topology.queues) == 2 * (1 + 2 + 1)
