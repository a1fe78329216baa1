"""What the rest of notifier sees of a broker: plain values and two small protocols.

``broker.amqp`` implements them over RabbitMQ; ``notifier.testing`` ships in-memory fakes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple, Protocol


class Outgoing(NamedTuple):
    exchange: str
    routing_key: str
    body: bytes
    message_id: str


class Confirm(enum.Enum):
    CONFIRMED = "confirmed"  # the broker took responsibility for the message
    RETURNED = "returned"  # mandatory publish with no queue to route to
    NACKED = "nacked"  # the broker refused it (e.g. a full queue with reject-publish)
    UNCONFIRMED = "unconfirmed"  # no answer in time or the channel broke: treat as not sent


class Settle(enum.Enum):
    ACK = "ack"
    REJECT = "reject"  # requeue=false: dead-letters to the type's DLQ
    REQUEUE = "requeue"  # nack with requeue=true: back to the queue, status unchanged


class Publisher(Protocol):
    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        """Trio-flavoured. Publish all, await all confirms together; one result per message."""
        ...

    def check(self) -> None:
        """Raise ``BrokerError`` if the publisher can no longer publish (channel lost)."""
        ...


class Incoming:
    """One consumed message. ``settle`` only records the outcome; the consumer that delivered
    the message sends it, on its own channel, batched with others."""

    __slots__ = ("_settle", "body", "delivery_tag", "message_id", "redelivered")

    def __init__(
        self,
        body: bytes,
        message_id: str | None,
        delivery_tag: int,
        redelivered: bool,
        settle: SettleSink,
    ) -> None:
        self.body = body
        self.message_id = message_id
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self._settle = settle

    def settle(self, how: Settle) -> None:
        self._settle.settle(self.delivery_tag, how)


class SettleSink(Protocol):
    def settle(self, delivery_tag: int, how: Settle) -> None: ...
