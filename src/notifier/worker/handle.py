"""One message, start to finish: decode → skip if settled → deliver → record → settle.

Per-message failures never leave ``handle``: anything an adapter raises becomes an attempt row
and a settlement, and the worker task goes on with the next message. ``trio.Cancelled`` always
propagates (an unsettled message simply returns to the queue).
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Protocol

import msgspec
import trio

from notifier.adapters.base import Adapter
from notifier.broker.base import Incoming, Settle
from notifier.errors import DeliveryError, PermanentError, RetriableError, StoreError
from notifier.messages import WorkerMessage, decode_message
from notifier.store.rows import TERMINAL_STATUSES, AttemptRecord, DeliveryState
from notifier.worker.decide import Result, decide

log = logging.getLogger("notifier.worker")

FINAL_WRITE_TIMEOUT_SECONDS = 10.0


class DeliveryStore(Protocol):
    async def delivery_state(self, delivery_id: uuid.UUID) -> DeliveryState | None: ...

    async def record_attempt(self, rec: AttemptRecord) -> bool: ...


class Handler:
    def __init__(self, store: DeliveryStore, adapter: Adapter, *, timeout_seconds: float) -> None:
        self._store = store
        self._adapter = adapter
        self._timeout = timeout_seconds

    async def handle(self, incoming: Incoming) -> None:
        """Trio-flavoured. Handle one message and record its settlement; never raises
        ``Exception``."""
        try:
            settle = await self._handle(incoming)
        except StoreError as exc:
            # Postgres is unreachable: we cannot know or record the state, so the message goes
            # back to the queue untouched and is tried again later.
            log.warning("delivery %s: store unavailable, requeueing: %s", incoming.message_id, exc)
            settle = Settle.REQUEUE
        except Exception:
            log.exception("delivery %s: handler failed; rejecting to the DLQ", incoming.message_id)
            settle = Settle.REJECT
        incoming.settle(settle)

    async def _handle(self, incoming: Incoming) -> Settle:
        try:
            message = decode_message(incoming.body)
        except msgspec.DecodeError:
            log.error("undecodable message %r; rejecting to the DLQ", incoming.message_id)
            return Settle.REJECT
        state = await self._store.delivery_state(message.delivery_id)
        if state is None or state.status in TERMINAL_STATUSES or state.attempt >= message.attempt:
            # Deleted, already finished, or a stale copy of an attempt that was made: a duplicate.
            return Settle.ACK
        return await self._attempt(message)

    async def _attempt(self, message: WorkerMessage) -> Settle:
        started_at = datetime.now(UTC)
        t0 = time.perf_counter()
        status_code: int | None = None
        excerpt: str | None = None
        error: str | None = None
        try:
            with trio.fail_after(self._timeout):
                receipt = await self._adapter.deliver(message)
            result = Result.DELIVERED
            if receipt is not None:
                status_code, excerpt = receipt.status_code, receipt.response_excerpt
        except trio.TooSlowError:
            result, error = Result.RETRIABLE, f"timed out after {self._timeout:g} s"
        except RetriableError as exc:
            result, error, status_code = Result.RETRIABLE, str(exc), exc.status_code
        except PermanentError as exc:
            result, error, status_code = Result.PERMANENT, str(exc), exc.status_code
        except DeliveryError as exc:
            result, error = Result.PERMANENT, str(exc)
        except Exception as exc:
            log.exception("delivery %s: adapter raised", message.delivery_id)
            result, error = Result.PANIC, f"adapter raised {type(exc).__name__}: {exc}"
        duration_ms = int((time.perf_counter() - t0) * 1000)
        decision = decide(result, attempt=message.attempt, max_attempts=message.max_attempts)
        record = AttemptRecord(
            delivery_id=message.delivery_id,
            attempt=message.attempt,
            status=decision.status,
            outcome=decision.outcome,
            started_at=started_at,
            duration_ms=duration_ms,
            status_code=status_code,
            error=error,
            response_excerpt=excerpt,
            next_attempt_at=decision.next_attempt_at,
        )
        # The attempt happened: record it even while shutting down (bounded). If it cannot be
        # recorded, the message goes back to the queue and the attempt is made again later.
        try:
            with trio.CancelScope(shield=True), trio.fail_after(FINAL_WRITE_TIMEOUT_SECONDS):
                await self._store.record_attempt(record)
        except (StoreError, trio.TooSlowError) as exc:
            log.warning(
                "delivery %s attempt %d: %s, but recording it failed (%r); requeueing",
                message.delivery_id, message.attempt, decision.outcome, exc,
            )  # fmt: skip
            return Settle.REQUEUE
        log.info(
            "delivery %s attempt %d: %s%s",
            message.delivery_id, message.attempt, decision.outcome,
            f" ({error})" if error else "",
        )  # fmt: skip
        return decision.settle
