"""A bounded buffer that never makes its writer wait: when full, the oldest item goes."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class DropOldest(Generic[T]):
    """At most ``size`` items, first in, first out. ``put_nowait`` never blocks: with the
    buffer full it drops the oldest item (``on_drop`` is told of it) to make room, so a slow
    reader costs the oldest alerts, never the writer's time. One reader at a time."""

    def __init__(self, size: int, on_drop: Callable[[T], None] | None = None) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._items: deque[T] = deque()
        self._size = size
        self._on_drop = on_drop
        self._arrived = trio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, item: T) -> None:
        """Add ``item``; the oldest one goes when the buffer is full. Not after ``close``."""
        if self._closed:
            raise trio.ClosedResourceError("the buffer is closed")
        if len(self._items) >= self._size:
            dropped = self._items.popleft()
            if self._on_drop is not None:
                self._on_drop(dropped)
        self._items.append(item)
        self._arrived.set()

    def close(self) -> None:
        """Take no more items; ``get`` returns what is left, then raises ``EndOfChannel``."""
        self._closed = True
        self._arrived.set()

    async def get(self) -> T:
        """Trio-flavoured. The oldest item, waiting for one; ``trio.EndOfChannel`` once closed
        and empty."""
        while not self._items:
            if self._closed:
                raise trio.EndOfChannel
            self._arrived = trio.Event()
            await self._arrived.wait()
        await trio.lowlevel.checkpoint()
        return self._items.popleft()
