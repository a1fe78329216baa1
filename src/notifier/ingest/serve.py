"""Serve the ingest app with hypercorn on trio, stopped by its shutdown trigger."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)
from quart_trio import QuartTrio

from notifier.lifecycle import Stop

log = logging.getLogger("notifier.ingest")


async def serve_ingest(
    app: QuartTrio,
    bind: str,
    stop: Stop,
    *,
    grace_seconds: float,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Serve until ``stop``; then stop accepting and let requests finish."""
    hc = HyperConfig()
    hc.bind = [bind]
    hc.graceful_timeout = grace_seconds
    hc.accesslog = None
    hc.errorlog = log
    hc.keep_alive_timeout = 30
    await serve(
        shielded_sends(app), hc, shutdown_trigger=stop.wait, task_status=task_status, mode="asgi"
    )


def shielded_sends(app: ASGIFramework) -> ASGIFramework:
    """``app``, with the sends of an answer after which the connection closes shielded from
    cancellation.

    quart-trio cancels a request's tasks as soon as its answer is sent, and hypercorn closes a
    connection that is not kept alive (HTTP/1.0, or ``Connection: close`` on either side) from
    inside that last ``send``: cancelled there, the close never happens, and the socket stays
    open until the client gives up. Answers on kept-alive connections are left alone: there the
    cancellation only skips hypercorn's idle timer, which would otherwise hold a socket the
    client has closed for ``keep_alive_timeout``."""

    async def wrapped(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        closing = scope["type"] == "http" and (
            scope["http_version"] == "1.0" or _says_close(scope["headers"])
        )

        async def send_shielded(message: ASGISendEvent) -> None:
            nonlocal closing
            if message["type"] == "http.response.start" and _says_close(message["headers"]):
                closing = True
            if not closing:
                await send(message)
                return
            with trio.CancelScope(shield=True):
                await send(message)

        await app(scope, receive, send_shielded)

    return wrapped


def _says_close(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(
        name.lower() == b"connection" and b"close" in value.lower() for name, value in headers
    )
