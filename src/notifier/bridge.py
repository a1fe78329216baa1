"""The one trio ↔ asyncio bridge. asyncpg and aiormq run on the trio-asyncio loop opened here.

Only ``store`` and ``broker`` import from this module; everything else is trio all the way down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

import trio_asyncio

log = logging.getLogger("notifier.bridge")

P = ParamSpec("P")
T = TypeVar("T")


def _log_unhandled(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # trio-asyncio's default handler re-raises and would take the whole process down for an
    # exception nobody retrieved (e.g. a late confirm of a cancelled publish). Log it instead.
    exc = context.get("exception")
    log.warning("asyncio: %s", context.get("message", "unhandled error"), exc_info=exc)


@asynccontextmanager
async def open_bridge() -> AsyncIterator[None]:
    """Trio-flavoured. Open the trio-asyncio loop, unless one is already open in this task tree."""
    if trio_asyncio.current_loop.get() is not None:
        yield
        return
    async with trio_asyncio.open_loop() as loop:
        loop.set_exception_handler(_log_unhandled)
        yield


async def aio(fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Trio-flavoured: run the asyncio-flavoured ``fn(*args, **kwargs)`` on the bridge loop."""
    result: T = await trio_asyncio.aio_as_trio(fn)(*args, **kwargs)
    return result
