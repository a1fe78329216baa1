"""Serve the ingest app with hypercorn on trio, stopped by its shutdown trigger."""

from __future__ import annotations

import logging

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve
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
    await serve(app, hc, shutdown_trigger=stop.wait, task_status=task_status)
