"""A connection to one of the Postgres hosts a URL lists (``postgresql://u@pg1:5432,pg2:5432/db
?target_session_attrs=read-write``), trying them all at once.

asyncpg tries the hosts of a URL one after the other within one timeout for the whole attempt.
A host that neither answers nor refuses — a machine that died, whose packets are dropped, or a
server that hangs — takes all of that timeout, and the next host is never tried: after a
failover, no new connection would ever reach the promoted standby while the old primary's
address stays silent. So each host gets a connection attempt of its own, all at the same
time, each bounded by the caller's timeout and checked by asyncpg against the URL's
``target_session_attrs``; the first that succeeds is kept, the others are closed.

Only a URL whose every host names its port is split so (asyncpg fills a missing port from the
environment); any other goes to asyncpg as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from typing import Any

import asyncpg


def url_hosts(dsn: str) -> list[tuple[str, int]]:
    """Pure. The ``(host, port)`` of each host the URL lists, in order; ``[]`` unless every
    host has a port (then asyncpg reads the URL on its own)."""
    try:
        netloc = urllib.parse.urlsplit(dsn).netloc
    except ValueError:
        return []
    hostspec = netloc.partition("@")[2] if "@" in netloc else netloc
    hosts: list[tuple[str, int]] = []
    for item in hostspec.split(",") if hostspec else ():
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":") if rest.startswith(":") else ""
        else:
            host, _, port = item.partition(":")
        if not host or not (port.isascii() and port.isdigit()):
            return []
        hosts.append((urllib.parse.unquote(host), int(port)))
    return hosts


async def connect(dsn: str | None = None, **kwargs: Any) -> asyncpg.Connection:
    """Asyncio-flavoured. ``asyncpg.connect(dsn, **kwargs)``, with a URL of several hosts
    tried on all of them at once (see the module's docstring); when none succeeds, the first
    host's error is raised."""
    hosts = url_hosts(dsn) if dsn else []
    if len(hosts) < 2:
        return await asyncpg.connect(dsn, **kwargs)
    attempts = [
        asyncio.ensure_future(asyncpg.connect(dsn, host=host, port=port, **kwargs))
        for host, port in hosts
    ]
    chosen: asyncpg.Connection | None = None
    try:
        for finished in asyncio.as_completed(attempts):
            with contextlib.suppress(Exception):
                chosen = await finished
                return chosen
        await attempts[0]  # every one failed: raise the first host's error
        raise AssertionError("unreachable")
    finally:
        for attempt in attempts:
            if not attempt.done():
                attempt.cancel()
                attempt.add_done_callback(_close_late)
            elif _connected(attempt) and attempt.result() is not chosen:
                attempt.result().terminate()


def _connected(attempt: asyncio.Future[asyncpg.Connection]) -> bool:
    return not attempt.cancelled() and attempt.exception() is None


def _close_late(attempt: asyncio.Future[asyncpg.Connection]) -> None:
    """A connection that came after the cancel (the attempt was past its last await)."""
    if _connected(attempt):
        attempt.result().terminate()
