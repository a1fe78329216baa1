"""Group commit: concurrent single-item calls, such as the events of concurrent
``POST /v1/events`` requests, stored by one call for all of them.

Storing one event costs a bridge crossing, a pooled connection and a round trip to Postgres,
about as much as storing a hundred. ``GroupCommit`` lets every request keep calling with its own
item: a caller that finds no batch running runs one at once (it leads) with whatever has piled
up; callers arriving meanwhile wait, and when the batch in flight ends, the first of them leads
the next batch with everything that arrived during the last one. Nothing is delayed on purpose
(an idle service stores a lone event at once) and no background task is needed: the batches are
run by the requests themselves.

Unlike ``notifier.batching.Batcher``, which a flusher task of its own drives, this one runs in
whatever task tree its callers are in (the HTTP server's request tasks), so it needs no nursery
and nothing to stop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import outcome
import trio

In = TypeVar("In")
Out = TypeVar("Out")


class _Slot(Generic[In, Out]):
    __slots__ = ("item", "leads", "result", "turn")

    def __init__(self, item: In) -> None:
        self.item = item
        self.result: outcome.Outcome[Out] | None = None
        self.leads = False  # told to lead the next batch
        # Set when the result is in, or (with no result) when this caller leads the next batch.
        self.turn = trio.Event()


class GroupCommit(Generic[In, Out]):
    """``await commit(item)`` → the result for ``item`` from ``run_batch(items)``.

    ``run_batch`` gets up to ``max_batch`` items, in the order their callers came, and returns
    one result per item, in order; if it raises, every caller of that batch gets the exception
    (a ``run_batch`` that must keep one item's failure from the others returns it as that item's
    result instead). One batch runs at a time — more only when callers have waited
    ``patience_seconds`` for it (see ``_wait_for_turn``).

    A batch that has started is finished even if the caller leading it is cancelled (the
    others are waiting for it): ``run_batch`` must bound its own time. A waiting caller that is
    cancelled before its batch starts is left out of it; one cancelled after gets no answer,
    whatever the batch did with its item.
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[In]], Awaitable[Sequence[Out]]],
        *,
        max_batch: int = 100,
        patience_seconds: float | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._patience = patience_seconds
        self._pending: list[_Slot[In, Out]] = []
        # Batches running, plus callers told to lead the next one that have not started it yet.
        self._leaders = 0

    async def __call__(self, item: In) -> Out:
        slot: _Slot[In, Out] = _Slot(item)
        if self._leaders == 0:
            self._leaders += 1  # a batch may start: lead it at once
        else:
            self._pending.append(slot)
            try:
                await self._wait_for_turn(slot)
            except BaseException:
                # Cancelled before the batch holding the item started: leave it out; told to
                # lead meanwhile, hand that on.
                if slot.leads:
                    self._hand_over()
                elif slot in self._pending:
                    self._pending.remove(slot)
                raise
            if slot.result is not None:
                return slot.result.unwrap()
        batch = [slot, *self._pending[: self._max_batch - 1]]
        del self._pending[: self._max_batch - 1]
        try:
            with trio.CancelScope(shield=True):
                await self._run(batch)
        finally:
            self._hand_over()
        assert slot.result is not None
        return slot.result.unwrap()

    async def _wait_for_turn(self, slot: _Slot[In, Out]) -> None:
        """Until ``slot`` has its result or leads. Still queued after ``patience_seconds``
        (the batches running are slow: Postgres stalls), it leads a batch of its own beside
        them, so that a caller waits for one slow batch at most, not for a queue of them."""
        if self._patience is not None:
            with trio.move_on_after(self._patience):
                await slot.turn.wait()
            if not slot.turn.is_set() and slot in self._pending:
                self._pending.remove(slot)
                self._leaders += 1
                slot.leads = True
                return
        await slot.turn.wait()

    def _hand_over(self) -> None:
        """A leader is done: the first waiting caller leads the next batch (the count of
        leaders stays), or there is none to lead."""
        if self._pending:
            nxt = self._pending.pop(0)
            nxt.leads = True
            nxt.turn.set()
        else:
            self._leaders -= 1

    async def _run(self, batch: list[_Slot[In, Out]]) -> None:
        try:
            results = await self._run_batch([s.item for s in batch])
            if len(results) != len(batch):
                raise RuntimeError("run_batch returned the wrong number of results")
        except Exception as exc:
            for s in batch:
                s.result = outcome.Error(exc)
                s.turn.set()
        except BaseException as exc:  # not for the others to raise: they get an error
            for s in batch:
                s.result = outcome.Error(RuntimeError(f"the batch was interrupted: {exc!r}"))
                s.turn.set()
            raise
        else:
            for s, r in zip(batch, results, strict=True):
                s.result = outcome.Value(r)
                s.turn.set()
