"""The httpx clients of the HTTP adapters (webhook, telegram).

One client per concurrent delivery: a single shared httpx client degrades sharply with
concurrency under trio (DESIGN §11). A delivery borrows an idle client or makes one and gives
it back afterwards, so the pool grows to the peak concurrency and its connections are reused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx


def new_client(
    timeout_seconds: float, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """An httpx client as every adapter wants it: no redirects, no environment proxies."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_seconds),
        follow_redirects=False,
        trust_env=False,  # environment proxies are never used
        limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
        transport=transport,
    )


class ClientPool:
    """Idle clients to borrow; ``make`` builds a new one when none is idle."""

    def __init__(self, make: Callable[[], httpx.AsyncClient]) -> None:
        self._make = make
        self._idle: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []

    @contextmanager
    def borrow(self) -> Iterator[httpx.AsyncClient]:
        if self._idle:
            client = self._idle.pop()
        else:
            client = self._make()
            self._all.append(client)
        try:
            yield client
        finally:
            self._idle.append(client)

    async def aclose(self) -> None:
        for client in self._all:
            await client.aclose()
        self._all.clear()
        self._idle.clear()
