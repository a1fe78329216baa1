"""The consumer: messages of one queue handed to a bounded trio channel by aiormq's callback
(no bridge crossing per message), and their settlements sent in batches on the channel that
delivered them."""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import Any

import aiormq
import trio
from pamqp.commands import Basic

from notifier.bridge import aio, never_suspends
from notifier.broker.amqp_base import broker_errors, wait_closing
from notifier.broker.amqp_publisher import PASSED_PROPERTIES
from notifier.broker.base import Incoming, Settle
from notifier.errors import BrokerError

log = logging.getLogger("notifier.broker")


def _plain_properties(props: Basic.Properties) -> dict[str, Any]:
    """The passed-through properties a publisher set (``Incoming.properties``)."""
    found = ((name, getattr(props, attr)) for name, attr in PASSED_PROPERTIES.items())
    return {name: value for name, value in found if value is not None}


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
                await wait_closing(self._ch)
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

    @never_suspends  # one per message: aiormq's task of it would cost four loop callbacks
    async def _on_message(self, message: aiormq.abc.DeliveredMessage) -> None:
        """Asyncio-flavoured aiormq callback. Must never raise: aiormq would only log it. Never
        suspends: run at once where aiormq makes a task of it (``bridge.never_suspends``)."""
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
