"""Coalesce concurrent single-item calls into batched calls.

Worker tasks each ask "what is the state of delivery X?" and "record this attempt"; crossing the
trio-asyncio bridge once per message is what limits throughput (docs/architecture.md §7). A
``Batcher`` lets every task keep calling with one item while a single flusher task sends whatever
has piled up since its last call as one batch — one bridge crossing, one SQL statement.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import outcome
import trio

In = TypeVar("In")
Out = TypeVar("Out")


class _Slot(Generic[In, Out]):
    __slots__ = ("done", "item", "result")

    def __init__(self, item: In) -> None:
        self.item = item
        self.done = trio.Event()
        self.result: outcome.Outcome[Out] | None = None


class Batcher(Generic[In, Out]):
    """``await batcher(item)`` → the result for ``item`` from ``run_batch(items)``.

    ``run_batch`` gets up to ``max_batch`` items and returns one result per item, in order; if
    it raises, every caller of that batch gets the exception. ``run()`` is the flusher: start it
    in the nursery that owns the callers, and cancel it after they are done.
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[In]], Awaitable[Sequence[Out]]],
        *,
        max_batch: int = 256,
        shield_seconds: float | None = None,
        closed: Callable[[], Exception] | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._max_batch = max_batch
        # When set, a batch that has started is finished even if the flusher is cancelled (a
        # write that happened must be recorded), bounded by this many seconds.
        self._shield_seconds = shield_seconds
        self._pending: list[_Slot[In, Out]] = []
        self._wakeup = trio.Event()
        # When set, callers waiting (or arriving) after the flusher was cancelled get this
        # error at once instead of waiting for a flusher that will not come back.
        self._closed = closed
        self._stopped = False

    async def __call__(self, item: In) -> Out:
        if self._stopped and self._closed is not None:
            raise self._closed()
        slot: _Slot[In, Out] = _Slot(item)
        self._pending.append(slot)
        self._wakeup.set()
        await slot.done.wait()
        assert slot.result is not None
        return slot.result.unwrap()

    async def run(self) -> None:
        try:
            await self._flush_forever()
        finally:
            self._stop()

    async def _flush_forever(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                try:
                    results = await self._run_one(batch)
                    if len(results) != len(batch):
                        raise RuntimeError("run_batch returned the wrong number of results")
                except Exception as exc:
                    for s in batch:
                        s.result = outcome.Error(exc)
                        s.done.set()
                except BaseException:
                    # Cancelled: these callers get no answer; put them back for a next flusher.
                    self._pending[:0] = batch
                    raise
                else:
                    for s, r in zip(batch, results, strict=True):
                        s.result = outcome.Value(r)
                        s.done.set()

    def _stop(self) -> None:
        if self._closed is None:
            return
        self._stopped = True
        for s in self._pending:
            s.result = outcome.Error(self._closed())
            s.done.set()
        self._pending.clear()

    async def _run_one(self, batch: list[_Slot[In, Out]]) -> Sequence[Out]:
        items = [s.item for s in batch]
        if self._shield_seconds is None:
            return await self._run_batch(items)
        with trio.CancelScope(shield=True), trio.fail_after(self._shield_seconds):
            results = await self._run_batch(items)
        return results
