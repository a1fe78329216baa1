"""The only aiormq code: trio-flavoured connection, publisher and consumer over the bridge.

Publishing crosses the bridge once per batch (all confirms awaited together); consuming crosses
it not at all per message (the aiormq callback hands messages to a bounded trio channel) and
acknowledgements are sent in batches on the channel that delivered them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import aiormq
import trio
from pamqp.commands import Basic

from notifier.bridge import aio, open_bridge
from notifier.broker.base import Confirm, Incoming, Outgoing, Settle
from notifier.broker.topology import Topology
from notifier.errors import BrokerError

log = logging.getLogger("notifier.broker")

# What aiormq raises, and what it means for a publish, most specific first. Any of them is a
# ``BrokerError`` to every other call (``broker_errors``): the broker refused, or the broker,
# the connection or the channel is gone. A channel closed under a publish or an
# acknowledgement raises ChannelInvalidStateError, a RuntimeError.
_AIORMQ_ERRORS: tuple[tuple[type[BaseException], Confirm], ...] = (
    (aiormq.exceptions.PublishError, Confirm.RETURNED),  # mandatory, and no queue to route to
    (aiormq.exceptions.DeliveryError, Confirm.NACKED),
    (aiormq.exceptions.AMQPError, Confirm.UNCONFIRMED),
    (aiormq.exceptions.ChannelInvalidStateError, Confirm.UNCONFIRMED),
    (OSError, Confirm.UNCONFIRMED),
    (asyncio.TimeoutError, Confirm.UNCONFIRMED),
    (ConnectionError, Confirm.UNCONFIRMED),
)
_BROKER_ERRORS = tuple(kind for kind, _ in _AIORMQ_ERRORS)


@contextmanager
def broker_errors(failure: str) -> Iterator[None]:
    """What aiormq raises inside, raised as ``BrokerError("<failure>: <the error>")``."""
    try:
        yield
    except _BROKER_ERRORS as exc:
        raise BrokerError(f"{failure}: {exc!r}") from exc


def _publish_outcome(exc: BaseException) -> Confirm | None:
    """What an exception from one publish means (None: not aiormq's)."""
    return next((confirm for kind, confirm in _AIORMQ_ERRORS if isinstance(exc, kind)), None)


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

    def __init__(self, conn: aiormq.Connection, name: str) -> None:
        self._conn = conn
        self.name = name

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
        await _wait_closing(self._conn)

    @asynccontextmanager
    async def open_publisher(self, timeout_seconds: float) -> AsyncIterator[AmqpPublisher]:
        """Trio-flavoured. A channel in confirm mode; messages are published ``mandatory``."""
        with broker_errors("opening a publisher channel failed"):
            ch = await aio(self._conn.channel, publisher_confirms=True, on_return_raises=True)
        try:
            yield AmqpPublisher(ch, timeout_seconds, self._conn)
        finally:
            await _close_quietly(ch)

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
            await _close_quietly(ch)


async def _wait_closing(obj: aiormq.abc.AbstractConnection | aiormq.abc.AbstractChannel) -> None:
    """Trio-flavoured. Return when an aiormq connection or channel is closed (by either side)."""

    async def wait() -> None:
        await obj.closing  # an independent observer: cancelling it closes nothing

    with suppress(Exception):  # the future carries the reason; we only need the fact
        await aio(wait)


async def _close_quietly(ch: aiormq.abc.AbstractChannel) -> None:
    """Trio-flavoured; close a channel, bounded and shielded, ignoring a broken connection."""
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        try:
            if not ch.is_closed:
                await aio(ch.close)
        except Exception:
            log.debug("closing channel failed", exc_info=True)


# AMQP basic properties passed through as plain values: AMQP name → pamqp attribute name.
_PASSED_PROPERTIES = {
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "correlation_id": "correlation_id",
    "reply_to": "reply_to",
    "timestamp": "timestamp",
    "priority": "priority",
    "type": "message_type",
}


def _plain_properties(props: Basic.Properties) -> dict[str, Any]:
    """The passed-through properties a publisher set (``Incoming.properties``)."""
    found = ((name, getattr(props, attr)) for name, attr in _PASSED_PROPERTIES.items())
    return {name: value for name, value in found if value is not None}


def _publish_properties(m: Outgoing) -> dict[str, Any]:
    """pamqp ``Basic.Properties`` arguments: persistent JSON, plus what ``m`` sets."""
    props: dict[str, Any] = {
        "delivery_mode": 2,
        "message_id": m.message_id or None,
        "content_type": "application/json",
    }
    if m.headers:
        props["headers"] = dict(m.headers)
    for name, value in (m.properties or {}).items():
        if name == "app_id":
            props["app_id"] = value
        elif name in _PASSED_PROPERTIES:
            props[_PASSED_PROPERTIES[name]] = value
    return props


def id_rounds(messages: Sequence[Outgoing]) -> list[list[int]]:
    """The indexes of ``messages`` in publish rounds in which no ``message_id`` appears twice.

    aiormq matches a returned message to its publish by ``message_id`` (a return carries no
    delivery tag): with two copies of one id in flight, one's return would be taken for the
    other's, and a lost copy counted as confirmed. Usually one round; messages without an id
    get a unique one from aiormq."""
    rounds: list[list[int]] = []
    uses: dict[str, int] = {}
    for index, m in enumerate(messages):
        n = 0
        if m.message_id:
            n = uses.get(m.message_id, 0)
            uses[m.message_id] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(index)
    return rounds


class AmqpPublisher:
    """Trio-flavoured publisher on one confirm-mode channel."""

    def __init__(
        self,
        channel: aiormq.abc.AbstractChannel,
        timeout_seconds: float,
        connection: aiormq.abc.AbstractConnection,
    ) -> None:
        self._ch = channel
        self._timeout = timeout_seconds
        self._conn = connection

    def check(self) -> None:
        if self._ch.is_closed:
            raise BrokerError("publisher channel is closed")

    async def wait_publishable(self) -> None:
        """Trio-flavoured. Wait for aiormq's ``ready()`` (connected and not blocked by the
        broker, which sends ``connection.blocked`` during a memory or disk alarm and holds our
        frames), raising ``BrokerError`` if the channel or connection closes first: a connection
        lost while blocked never becomes ready. One bridge crossing."""
        self.check()
        if not await aio(self._ready_or_closed):
            raise BrokerError("the publishing connection closed while waiting to publish")

    async def _ready_or_closed(self) -> bool:
        """Asyncio-flavoured: True once the connection is ready, False if the channel or the
        connection closed first."""
        ready = asyncio.ensure_future(self._conn.ready())
        # independent observers of the closing (cancelling one closes nothing)
        closings = [self._ch.closing, self._conn.closing]
        try:
            await asyncio.wait([ready, *closings], return_when=asyncio.FIRST_COMPLETED)
            return ready.done() and not any(c.done() for c in closings)
        finally:  # before the observers are cancelled, which makes them done
            for waiting in (ready, *closings):
                if not waiting.done():
                    waiting.cancel()

    async def wait_closed(self) -> None:
        """Trio-flavoured. Return when the channel is closed (by either side)."""
        await _wait_closing(self._ch)

    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        """Trio-flavoured. Publish all, await all confirms together; one result per message.
        Messages that share a ``message_id`` go in rounds of their own (``id_rounds``)."""
        if not messages:
            return []
        return await aio(self._publish_batch_aio, messages)

    async def _publish_batch_aio(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        """Asyncio-flavoured: each round of ``id_rounds`` published, then its confirms awaited."""
        results = [Confirm.UNCONFIRMED] * len(messages)
        for indexes in id_rounds(messages):
            confirms = await self._publish_round([messages[i] for i in indexes])
            for i, confirm in zip(indexes, confirms, strict=True):
                results[i] = confirm
        return results

    async def _publish_round(self, messages: Sequence[Outgoing]) -> list[Confirm]:
        """Asyncio-flavoured: publish everything, then await every confirm (bounded)."""

        async def one(m: Outgoing) -> Confirm:
            try:
                await self._ch.basic_publish(
                    m.body,
                    exchange=m.exchange,
                    routing_key=m.routing_key,
                    mandatory=True,
                    properties=Basic.Properties(**_publish_properties(m)),
                )
            except asyncio.CancelledError:
                return Confirm.UNCONFIRMED
            except Exception as exc:
                if (outcome := _publish_outcome(exc)) is None:
                    raise
                return outcome
            return Confirm.CONFIRMED

        tasks = [asyncio.ensure_future(one(m)) for m in messages]
        done, pending = await asyncio.wait(tasks, timeout=self._timeout)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending)
        return [t.result() if t in done else Confirm.UNCONFIRMED for t in tasks]


class Consumer:
    """Messages of one consumer on its own channel, and their batched settlement."""

    def __init__(self, channel: aiormq.abc.AbstractChannel, prefetch: int) -> None:
        self._ch = channel
        self._tag: str | None = None
        self._send, self.receive = trio.open_memory_channel[Incoming](prefetch)
        # delivery tag -> settlement, in delivery order (tags only grow on a channel)
        self._pending: dict[int, Settle | None] = {}
        self._dirty = trio.Event()
        self._stopped = False
        self._cancelled = trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None  # set by open_consumer

    @property
    def unsettled(self) -> int:
        return len(self._pending)

    async def wait_closed(self) -> None:
        """Trio-flavoured. Return when the channel is closed (by either side), or when the
        broker cancelled the consumer (its queue was deleted): either way nothing more comes."""
        async with trio.open_nursery() as nursery:

            async def channel_closed() -> None:
                await _wait_closing(self._ch)
                nursery.cancel_scope.cancel()

            nursery.start_soon(channel_closed)
            await self._cancelled.wait()
            nursery.cancel_scope.cancel()

    async def _on_broker_cancel(self, _frame: object) -> None:
        """Asyncio-flavoured aiormq callback: the broker cancelled this consumer."""
        if not self._stopped:
            log.warning("the broker cancelled the consumer (was its queue deleted?)")
        if self._token is not None:
            self._token.run_sync_soon(self._cancelled.set)

    async def _on_message(self, message: aiormq.abc.DeliveredMessage) -> None:
        """Asyncio-flavoured aiormq callback. Must never raise: aiormq would only log it."""
        try:
            tag = message.delivery_tag
            if tag is None or self._stopped:
                return  # left unacked: the channel close returns it to the queue
            props = message.header.properties
            incoming = Incoming(
                message.body, props.message_id, tag, bool(message.redelivered), self,
                app_id=props.app_id, headers=props.headers, properties=_plain_properties(props),
            )  # fmt: skip
            self._pending[tag] = None
            self._send.send_nowait(incoming)  # never full: prefetch bounds unacked messages
        except Exception:
            log.exception("consumer callback failed; the message returns when the channel closes")

    def settle(self, delivery_tag: int, how: Settle) -> None:
        if delivery_tag in self._pending:
            self._pending[delivery_tag] = how
            self._dirty.set()

    def _take_settled(self) -> list[tuple[str, int]]:
        """Plan the frames for what is settled: individual reject/requeue/ack frames first,
        then one ``ack(multiple=True)`` for the longest fully-acked prefix."""
        frames: list[tuple[str, int]] = []
        prefix_ack: int | None = None
        in_prefix = True
        for tag, how in list(self._pending.items()):
            if how is None:
                in_prefix = False
                continue
            del self._pending[tag]
            if how is Settle.ACK and in_prefix:
                prefix_ack = tag
            else:
                frames.append((how.value, tag))
        if prefix_ack is not None:
            frames.append(("ack_multiple", prefix_ack))
        return frames

    async def _send_frames(self, frames: list[tuple[str, int]]) -> None:
        """Asyncio-flavoured: write the settlement frames in order."""
        for kind, tag in frames:
            if kind == "ack_multiple":
                await self._ch.basic_ack(tag, multiple=True)
            elif kind == Settle.ACK.value:
                await self._ch.basic_ack(tag)
            elif kind == Settle.REJECT.value:
                await self._ch.basic_reject(tag, requeue=False)
            else:
                await self._ch.basic_nack(tag, requeue=True)

    async def _flush(self) -> None:
        frames = self._take_settled()
        if not frames:
            return
        try:
            with broker_errors(f"sending {len(frames)} acknowledgements failed"):
                await aio(self._send_frames, frames)
        except BrokerError as exc:
            # The channel is gone: its unacked messages go back to the queue by themselves.
            log.warning("%s", exc)

    async def _ack_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty = trio.Event()
            await self._flush()

    async def _stop(self) -> None:
        """Trio-flavoured: stop deliveries, then acknowledge whatever was settled."""
        self._stopped = True
        self._send.close()
        if self._tag is not None and not self._ch.is_closed:
            with suppress(BrokerError), broker_errors("cancelling the consumer failed"):
                await aio(self._ch.basic_cancel, self._tag)
        await self._flush()


# A connection attempt that gets no answer (a broker that accepts TCP but never speaks, a
# network that swallows packets) fails after this, so its component can try again.
CONNECT_TIMEOUT_SECONDS = 10.0


@asynccontextmanager
async def open_connection(
    url: str,
    *,
    name: str,
    heartbeat_seconds: int = 15,
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
) -> AsyncIterator[AmqpConnection]:
    """Trio-flavoured. Connect to RabbitMQ (within ``connect_timeout_seconds``); close on exit
    (unacked messages return to queues)."""
    async with open_bridge():
        try:
            with (
                trio.fail_after(connect_timeout_seconds),
                broker_errors("cannot connect to RabbitMQ"),
            ):
                conn: Any = await aio(
                    aiormq.connect,
                    _with_heartbeat(url, heartbeat_seconds),
                    client_properties={"connection_name": f"notifier {name}"},
                )
        except trio.TooSlowError as exc:
            raise BrokerError(
                f"cannot connect to RabbitMQ: no answer in {connect_timeout_seconds:g} s"
            ) from exc
        try:
            yield AmqpConnection(conn, name)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await aio(conn.close)
                except Exception:
                    log.debug("closing connection failed", exc_info=True)


async def probe(url: str, *, timeout_seconds: float = 3.0) -> None:
    """Trio-flavoured. Connect and disconnect; raise ``BrokerError`` if RabbitMQ is unreachable."""
    with trio.move_on_after(timeout_seconds) as scope:
        async with open_connection(url, name="probe"):
            return
    if scope.cancelled_caught:
        raise BrokerError("RabbitMQ did not answer in time")


async def queue_depths(
    url: str, queues: Sequence[str], *, timeout_seconds: float = 3.0
) -> dict[str, int]:
    """Trio-flavoured. The number of ready messages in each of ``queues``, read with passive
    declares on a short connection of its own (for the metrics endpoint). A queue that does not
    exist (its topology was not declared yet) is left out. Raise ``BrokerError`` when RabbitMQ
    is unreachable or has not answered within ``timeout_seconds``."""
    with trio.move_on_after(timeout_seconds):
        async with open_connection(url, name="metrics") as conn:
            with broker_errors("reading queue depths failed"):
                return await aio(_queue_depths_aio, conn._conn, queues)
    raise BrokerError("RabbitMQ did not answer in time")


async def _queue_depths_aio(
    conn: aiormq.abc.AbstractConnection, queues: Sequence[str]
) -> dict[str, int]:
    """Asyncio-flavoured: passive-declare each queue, on one channel while they exist (a
    missing queue closes the channel: the next one gets a new channel)."""
    depths: dict[str, int] = {}
    ch = await conn.channel()
    try:
        for name in queues:
            try:
                ok = await ch.queue_declare(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                ch = await conn.channel()
                continue
            depths[name] = ok.message_count or 0
    finally:
        if not ch.is_closed:
            await ch.close()
    return depths
