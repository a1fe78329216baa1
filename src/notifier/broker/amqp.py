"""The aiormq code (with ``amqp_base``, ``amqp_publisher`` and ``amqp_consumer`` beside it):
trio-flavoured connection, publisher and consumer over the bridge.

Publishing crosses the bridge once per batch (all confirms awaited together); consuming crosses
it not at all per message (the aiormq callback hands messages to a bounded trio channel) and
acknowledgements are sent in batches on the channel that delivered them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiormq
import trio

from notifier.bridge import aio, open_bridge
from notifier.broker.amqp_base import broker_errors, close_quietly, wait_closing
from notifier.broker.amqp_consumer import Consumer
from notifier.broker.amqp_publisher import AmqpPublisher
from notifier.broker.base import QueueCounts
from notifier.broker.nodes import CHOOSER, BrokerUrls, node_address, node_urls
from notifier.broker.topology import Topology
from notifier.errors import BrokerError

__all__ = [  # the publisher, the consumer and the error table live beside this module
    "AmqpConnection", "AmqpPublisher", "Consumer", "broker_errors",
    "open_connection", "probe", "queue_depths",
]  # fmt: skip

log = logging.getLogger("notifier.broker")


class _NoFrameBodies(logging.Filter):
    """aiormq logs every outgoing frame at DEBUG with its raw bytes, message bodies included,
    and a delivery message carries its channel's config (webhook secrets, user-set headers).
    This filter, on aiormq's connection logger, replaces such an argument with its size."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(map(_payload, record.args)):
            record.args = tuple(map(_without_payload, record.args))
        return True


def _payload(arg: object) -> bytes | bytearray | memoryview | None:
    payload = getattr(arg, "payload", None)
    return payload if isinstance(payload, (bytes, bytearray, memoryview)) else None


def _without_payload(arg: object) -> object:
    payload = _payload(arg)
    return arg if payload is None else f"<{type(arg).__name__}: {len(payload)} bytes>"


logging.getLogger("aiormq.connection").addFilter(_NoFrameBodies())


def _with_heartbeat(url: str, heartbeat_seconds: int) -> str:
    if "heartbeat=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}heartbeat={heartbeat_seconds}"


class AmqpConnection:
    """Trio-flavoured wrapper of one aiormq connection. Create with ``open_connection``."""

    def __init__(self, conn: aiormq.Connection, name: str, node: str = "") -> None:
        self._conn = conn
        self.name = name
        self.node = node  # host:port/vhost of the node it is connected to

    async def declare(self, topology: Topology) -> None:
        """Trio-flavoured. Declare exchanges, queues and bindings; idempotent."""

        async def declare() -> None:
            ch = await self._conn.channel()
            try:
                for exchange in topology.exchanges:
                    await ch.exchange_declare(exchange, exchange_type="direct", durable=True)
                for q in topology.queues:
                    await ch.queue_declare(q.name, durable=True, arguments=q.arguments)
                    if q.exchange:  # "" is the default exchange: every queue is bound to it
                        await ch.queue_bind(q.name, q.exchange, routing_key=q.routing_key)
            finally:
                if not ch.is_closed:
                    await ch.close()

        with broker_errors("declaring the topology failed"):
            await aio(declare)

    async def wait_closed(self) -> None:
        """Trio-flavoured. Return when the connection is closed (by either side)."""
        await wait_closing(self._conn)

    @asynccontextmanager
    async def open_publisher(self, timeout_seconds: float) -> AsyncIterator[AmqpPublisher]:
        """Trio-flavoured. A channel in confirm mode; messages are published ``mandatory``."""
        with broker_errors("opening a publisher channel failed"):
            ch = await aio(self._conn.channel, publisher_confirms=True, on_return_raises=True)
        try:
            yield AmqpPublisher(ch, timeout_seconds, self._conn)
        finally:
            await close_quietly(ch)

    @asynccontextmanager
    async def open_consumer(self, queue: str, prefetch: int) -> AsyncIterator[Consumer]:
        """Trio-flavoured. Consume ``queue`` with at most ``prefetch`` unacked messages.

        Messages arrive on ``consumer.receive``, a trio channel bounded by ``prefetch`` (so the
        callback never blocks). On exit the consumer is cancelled, settled messages are
        acknowledged, and the channel is closed: unsettled messages go back to the queue.
        """
        with broker_errors("opening a consumer channel failed"):
            ch = await aio(self._conn.channel)
            await aio(ch.basic_qos, prefetch_count=prefetch)
        consumer = Consumer(ch, prefetch)
        consumer._token = trio.lowlevel.current_trio_token()
        ch.on_consumer_cancel_callbacks.add(consumer._on_broker_cancel)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consumer._ack_loop)
                with broker_errors(f"consuming {queue} failed"):
                    ok = await aio(ch.basic_consume, queue, consumer._on_message, no_ack=False)
                consumer._tag = ok.consumer_tag
                try:
                    yield consumer
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(5):
                        await consumer._stop()
                    nursery.cancel_scope.cancel()
        finally:
            await close_quietly(ch)


# A connection attempt that gets no answer (a broker that accepts TCP but never speaks, a
# network that swallows packets) fails after this, so its component can try again. With several
# nodes, this bounds the attempt at all of them together.
CONNECT_TIMEOUT_SECONDS = 10.0


async def _connect_one(url: str, name: str, heartbeat_seconds: int, within: float) -> Any:
    """Trio-flavoured: an aiormq connection to one node, within ``within`` seconds."""
    try:
        with trio.fail_after(within), broker_errors("cannot connect to RabbitMQ"):
            return await aio(
                aiormq.connect,
                _with_heartbeat(url, heartbeat_seconds),
                client_properties={"connection_name": f"notifier {name}"},
            )
    except trio.TooSlowError as exc:
        raise BrokerError(f"cannot connect to RabbitMQ: no answer in {within:g} s") from exc


async def _connect(
    urls: tuple[str, ...], name: str, heartbeat_seconds: int, timeout_seconds: float, level: int
) -> tuple[Any, str]:
    """Trio-flavoured: a connection to the first node that answers, in ``CHOOSER``'s order;
    each attempt gets an equal share of the time left. Return it with the node's address."""
    order = CHOOSER.order(name, len(urls))
    deadline = trio.current_time() + timeout_seconds
    failures: list[str] = []
    for tried, index in enumerate(order):
        address = node_address(urls[index])
        left = timeout_seconds if tried == 0 else deadline - trio.current_time()
        share = left / (len(order) - tried)
        try:
            try:
                conn = await _connect_one(urls[index], name, heartbeat_seconds, max(share, 0.001))
            except ValueError:
                # aiormq reads the URL with yarl, which refuses one with an unencoded / # ? in
                # its password (the config refuses those too). Not chained: yarl's message
                # may quote the URL, password and all.
                raise BrokerError(f"node {index}: unreadable URL") from None
        except BrokerError as exc:
            if len(urls) == 1:
                raise
            failures.append(f"{address}: {exc}")
            log.log(level, "%s: RabbitMQ node %s did not answer: %s", name, address, exc)
            continue
        CHOOSER.connected(name, index, len(urls))
        return conn, address
    raise BrokerError(f"no RabbitMQ node took the connection ({'; '.join(failures)})")


@asynccontextmanager
async def open_connection(
    url: BrokerUrls,
    *,
    name: str,
    heartbeat_seconds: int = 15,
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
    short_lived: bool = False,
) -> AsyncIterator[AmqpConnection]:
    """Trio-flavoured. Connect to RabbitMQ (within ``connect_timeout_seconds``); close on exit
    (unacked messages return to queues).

    ``url`` is one node's URL or the URLs of a cluster's nodes: they are tried in turn, from
    the node ``nodes.CHOOSER`` picks for ``name``, until one answers (docs/architecture.md §4).
    The node it is on is logged (at DEBUG for a ``short_lived`` one, like a probe), and so is
    a node that did not answer (a warning, unless ``short_lived``).
    """
    urls = node_urls(url)
    level = logging.DEBUG if short_lived else logging.WARNING
    async with open_bridge():
        conn, address = await _connect(
            urls, name, heartbeat_seconds, connect_timeout_seconds, level
        )
        log.log(
            logging.DEBUG if short_lived else logging.INFO,
            "%s connected to RabbitMQ at %s", name, address,
        )  # fmt: skip
        try:
            yield AmqpConnection(conn, name, address)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await aio(conn.close)
                except Exception:
                    log.debug("closing connection failed", exc_info=True)


# The share of a probe's or a metrics read's time its connecting gets: when no node answers,
# the connecting fails with the list of the nodes and why before the whole call runs out.
_CONNECT_SHARE = 0.9


async def probe(url: BrokerUrls, *, timeout_seconds: float = 3.0) -> None:
    """Trio-flavoured. Connect and disconnect; raise ``BrokerError`` if RabbitMQ is unreachable."""
    with trio.move_on_after(timeout_seconds) as scope:
        async with open_connection(
            url, name="probe", connect_timeout_seconds=timeout_seconds * _CONNECT_SHARE,
            short_lived=True,
        ):  # fmt: skip
            return
    if scope.cancelled_caught:
        raise BrokerError("RabbitMQ did not answer in time")


async def queue_depths(
    url: BrokerUrls, queues: Sequence[str], *, timeout_seconds: float = 3.0
) -> dict[str, QueueCounts]:
    """Trio-flavoured. The number of ready messages and of consumers of each of ``queues``,
    read with passive declares on a short connection of its own (for the metrics endpoint). A
    queue that does not exist (its topology was not declared yet) is left out. Raise
    ``BrokerError`` when RabbitMQ is unreachable or has not answered within ``timeout_seconds``."""
    with trio.move_on_after(timeout_seconds):
        async with open_connection(
            url,
            name="metrics",
            connect_timeout_seconds=timeout_seconds * _CONNECT_SHARE,
            short_lived=True,
        ) as conn:
            with broker_errors("reading queue depths failed"):
                return await aio(_queue_depths_aio, conn._conn, queues)
    raise BrokerError("RabbitMQ did not answer in time")


async def _queue_depths_aio(
    conn: aiormq.abc.AbstractConnection, queues: Sequence[str]
) -> dict[str, QueueCounts]:
    """Asyncio-flavoured: passive-declare each queue, on one channel while they exist (a
    missing queue closes the channel: the next one gets a new channel)."""
    depths: dict[str, QueueCounts] = {}
    ch = await conn.channel()
    try:
        for name in queues:
            try:
                ok = await ch.queue_declare(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                ch = await conn.channel()
                continue
            depths[name] = QueueCounts(ok.message_count or 0, ok.consumer_count or 0)
    finally:
        if not ch.is_closed:
            await ch.close()
    return depths


async def missing_topology(
    url: str, exchanges: Sequence[str], queues: Sequence[str], *, timeout_seconds: float = 3.0
) -> list[str]:
    """Trio-flavoured. Which of ``exchanges`` and ``queues`` do not exist on the node ``url``
    (``"exchange NAME"``, ``"queue NAME"``), found with passive declares on a short connection
    of its own (for ``notifier check``). Raise ``BrokerError`` when RabbitMQ is unreachable or
    has not answered within ``timeout_seconds``."""
    with trio.move_on_after(timeout_seconds):
        async with open_connection(
            url, name="check", connect_timeout_seconds=timeout_seconds * _CONNECT_SHARE,
            short_lived=True,
        ) as conn:  # fmt: skip
            with broker_errors("checking the topology failed"):
                return await aio(_missing_aio, conn._conn, exchanges, queues)
    raise BrokerError("RabbitMQ did not answer in time")


async def _missing_aio(
    conn: aiormq.abc.AbstractConnection, exchanges: Sequence[str], queues: Sequence[str]
) -> list[str]:
    """Asyncio-flavoured: passive-declare each, on one channel while they exist (a missing one
    closes the channel: the next gets a new channel)."""
    missing: list[str] = []
    ch = await conn.channel()
    try:
        for kind, name in [*(("exchange", e) for e in exchanges), *(("queue", q) for q in queues)]:
            try:
                if kind == "exchange":
                    await ch.exchange_declare(name, passive=True)
                else:
                    await ch.queue_declare(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                missing.append(f"{kind} {name}")
                ch = await conn.channel()
    finally:
        if not ch.is_closed:
            await ch.close()
    return missing
