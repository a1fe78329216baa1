"""What the aiormq modules share: aiormq's errors and what each means (``broker_errors``), and
waiting for or closing a channel over the bridge."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import aiormq
import trio

from notifier.bridge import aio
from notifier.broker.base import Confirm
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
BROKER_ERRORS = tuple(kind for kind, _ in _AIORMQ_ERRORS)


@contextmanager
def broker_errors(failure: str) -> Iterator[None]:
    """What aiormq raises inside, raised as ``BrokerError("<failure>: <the error>")``."""
    try:
        yield
    except BROKER_ERRORS as exc:
        raise BrokerError(f"{failure}: {exc!r}") from exc


def publish_outcome(exc: BaseException) -> Confirm | None:
    """What an exception from one publish means (None: not aiormq's)."""
    return next((confirm for kind, confirm in _AIORMQ_ERRORS if isinstance(exc, kind)), None)


async def wait_closing(obj: aiormq.abc.AbstractConnection | aiormq.abc.AbstractChannel) -> None:
    """Trio-flavoured. Return when an aiormq connection or channel is closed (by either side)."""

    async def wait() -> None:
        await obj.closing  # an independent observer: cancelling it closes nothing

    with suppress(Exception):  # the future carries the reason; we only need the fact
        await aio(wait)


async def close_quietly(ch: aiormq.abc.AbstractChannel) -> None:
    """Trio-flavoured; close a channel, bounded and shielded, ignoring a broken connection."""
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        try:
            if not ch.is_closed:
                await aio(ch.close)
        except Exception:
            log.debug("closing channel failed", exc_info=True)
