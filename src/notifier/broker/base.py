"""What the rest of notifier sees of a broker: plain values and two small protocols.

``broker.amqp`` implements them over RabbitMQ; ``notifier.testing`` ships in-memory fakes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from notifier.settle import Settle as Settle  # where the broker's callers have it from


class Outgoing(NamedTuple):
    exchange: str
    routing_key: str
    body: bytes
    message_id: str  # "" for none
    # Message headers, and other AMQP properties by their AMQP names (``content_type``,
    # ``app_id``, ``type`` ...) replacing the defaults; see ``Incoming.properties``.
    headers: Mapping[str, Any] | None = None
    properties: Mapping[str, Any] | None = None


class QueueCounts(NamedTuple):
    """What a passive declare says of a queue (``amqp.queue_depths``, for ``/metrics``)."""

    messages: int  # ready messages (not those a consumer holds)
    consumers: int


class Confirm(enum.Enum):
    CONFIRMED = "confirmed"  # the broker took responsibility for the message
    RETURNED = "returned"  # mandatory publish with no queue to route to
    NACKED = "nacked"  # the broker refused it (e.g. a full queue with reject-publish)
    UNCONFIRMED = "unconfirmed"  # no answer in time or the channel broke: treat as not sent


class Publisher(Protocol):
    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        """Trio-flavoured. Publish all, await all confirms together; one result per message."""
        ...

    def check(self) -> None:
        """Raise ``BrokerError`` if the publisher can no longer publish (channel lost)."""
        ...

    async def wait_publishable(self) -> None:
        """Trio-flavoured. Return once the broker accepts publishes from this publisher: at
        once, except while it blocks publishing connections (a memory or disk alarm)."""
        ...


class Incoming:
    """One consumed message. ``settle`` only records the outcome; the consumer that delivered
    the message sends it, on its own channel, batched with others."""

    __slots__ = (
        "_settle", "app_id", "body", "delivery_tag", "headers", "message_id", "properties",
        "redelivered",
    )  # fmt: skip

    def __init__(
        self,
        body: bytes,
        message_id: str | None,
        delivery_tag: int,
        redelivered: bool,
        settle: SettleSink,
        *,
        app_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        self.body = body
        self.message_id = message_id
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self._settle = settle
        self.app_id = app_id
        self.headers: Mapping[str, Any] = headers or {}
        # The other AMQP properties the publisher set, by their AMQP names (``content_type``,
        # ``content_encoding``, ``correlation_id``, ``reply_to``, ``timestamp``, ``priority``,
        # ``type``), as plain values.
        self.properties: Mapping[str, Any] = properties or {}

    def settle(self, how: Settle) -> None:
        self._settle.settle(self.delivery_tag, how)


class SettleSink(Protocol):
    def settle(self, delivery_tag: int, how: Settle) -> None: ...
