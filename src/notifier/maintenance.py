"""The maintenance task (``--role maintenance``): what keeps Postgres, the source of truth, and
the transport in step over time.

Every ``interval_seconds`` one pass:

- **reconciler**: deliveries ``PENDING``/``RETRYING`` well past their due time with no outbox
  row are enqueued again through the outbox. Their message was lost on the way (a deleted
  queue, a broker that lost its data, a message dead-lettered by the delivery limit); a copy
  that was merely slow is deduplicated by the worker (by the delivery's state), so the worst
  case of a false alarm is one extra delivery, never a lost one.
- **partitions**: the history (events, deliveries, attempts) is partitioned by day; the
  partitions of today and the ``PARTITION_DAYS_AHEAD`` days after it are made when missing.
- **retention**: a day of history that ended more than ``retention_days`` ago is dropped, its
  three partitions at once, when none of its deliveries is unfinished; a day with an unfinished
  one is kept (and counted: ``notifier_history_days_overdue``) until it finishes. Then the
  idempotency keys of the events dropped are deleted in batches.
- **outbox hygiene**: outbox rows whose delivery is finished or gone are deleted; rows the
  broker keeps refusing are reported.
- **rate buckets**: shared rate-limit buckets full again for a minute are deleted (a new bucket
  is the same), so the table holds only the keys in use.
- **circuits**: destinations' circuits closed and unchanged for an hour are deleted (a missing
  row is a closed circuit with no failure).
- **console**: expired console sessions are deleted, and the failed sign-ins of addresses quiet
  for 15 minutes (they are forgotten by then).

Several processes may run it at once: every statement claims its rows ``SKIP LOCKED``.
"""

from __future__ import annotations

import logging
import uuid
from typing import Protocol

import msgspec
import trio

from notifier.config import MaintenanceConfig
from notifier.lifecycle import Stop
from notifier.store.maintenance import PARTITION_DAYS_AHEAD

log = logging.getLogger("notifier.maintenance")

# Per pass, at most this many batches of each kind: one pass never runs for long, the next one
# goes on where it stopped.
MAX_BATCHES_PER_PASS = 20
# An outbox row refused this many times (about a minute of backoff) is worth a warning.
REFUSED_WARNING_AFTER = 6


class MaintenanceStore(Protocol):
    async def reconcile(self, *, stuck_after_seconds: float, limit: int) -> list[uuid.UUID]: ...

    async def ensure_partitions(self, *, days_ahead: int) -> int: ...

    async def drop_expired_days(self, *, retention_days: int) -> tuple[list[str], list[str]]: ...

    async def clean_event_keys(self, *, retention_days: int, limit: int) -> int: ...

    async def clean_outbox(self, *, limit: int, refused_after: int) -> tuple[int, int]: ...

    async def clean_rate_buckets(self, *, limit: int) -> int: ...

    async def clean_circuits(self, *, limit: int) -> int: ...

    async def clean_console(self, *, limit: int) -> int: ...


class PassResult(msgspec.Struct, kw_only=True):
    """What one maintenance pass did."""

    reenqueued: int = 0
    partitions_made: int = 0
    days_dropped: int = 0
    days_kept: int = 0
    keys_expired: int = 0
    outbox_cleaned: int = 0
    outbox_refused: int = 0
    rate_buckets_cleaned: int = 0
    circuits_cleaned: int = 0
    console_cleaned: int = 0


async def maintenance_pass(
    config: MaintenanceConfig, store: MaintenanceStore, stop: Stop | None = None
) -> PassResult:
    """Trio-flavoured. One pass of reconciler, partitions, retention and outbox hygiene."""
    result = PassResult()
    size = config.batch_size

    def stopping() -> bool:
        return stop is not None and stop.is_set()

    for _ in range(MAX_BATCHES_PER_PASS):
        ids = await store.reconcile(stuck_after_seconds=config.stuck_after_seconds, limit=size)
        result.reenqueued += len(ids)
        if len(ids) < size or stopping():
            break
    if result.reenqueued:
        log.warning(
            "reconciler: %d stuck deliveries (due over %g s ago, no message in the outbox) "
            "enqueued again", result.reenqueued, config.stuck_after_seconds,
        )  # fmt: skip
    result.partitions_made = await store.ensure_partitions(days_ahead=PARTITION_DAYS_AHEAD)
    if result.partitions_made:
        log.info("partitions: made %d for the days to come", result.partitions_made)
    if config.retention_days > 0 and not stopping():
        dropped, kept = await store.drop_expired_days(retention_days=config.retention_days)
        result.days_dropped, result.days_kept = len(dropped), len(kept)
        if dropped:
            log.info("retention: dropped the history of %s (older than %d days)",
                     ", ".join(d.lstrip("_") for d in dropped), config.retention_days)  # fmt: skip
        if kept:
            log.warning(
                "retention: kept the history of %s, past %d days: a delivery of it is not "
                "finished yet (or its tables were busy); it is dropped once it is",
                ", ".join(d.lstrip("_") for d in kept), config.retention_days,
            )  # fmt: skip
        for _ in range(MAX_BATCHES_PER_PASS):
            if stopping():
                break
            deleted = await store.clean_event_keys(retention_days=config.retention_days, limit=size)
            result.keys_expired += deleted
            if deleted < size:
                break
    result.outbox_cleaned, result.outbox_refused = await store.clean_outbox(
        limit=size, refused_after=REFUSED_WARNING_AFTER
    )
    if result.outbox_cleaned:
        log.info("outbox: deleted %d rows of finished or deleted deliveries", result.outbox_cleaned)
    if result.outbox_refused:
        log.warning(
            "outbox: %d rows refused by the broker %d times or more (is their channel type "
            "enabled in some [workers.<type>]?)", result.outbox_refused, REFUSED_WARNING_AFTER,
        )  # fmt: skip
    for _ in range(MAX_BATCHES_PER_PASS):
        if stopping():
            break
        cleaned = await store.clean_rate_buckets(limit=size)
        result.rate_buckets_cleaned += cleaned
        if cleaned < size:
            break
    if result.rate_buckets_cleaned:
        log.debug("rate buckets: deleted %d idle buckets", result.rate_buckets_cleaned)
    for _ in range(MAX_BATCHES_PER_PASS):
        if stopping():
            break
        cleaned = await store.clean_circuits(limit=size)
        result.circuits_cleaned += cleaned
        if cleaned < size:
            break
    if result.circuits_cleaned:
        log.debug("circuits: deleted %d closed circuits", result.circuits_cleaned)
    for _ in range(MAX_BATCHES_PER_PASS):
        if stopping():
            break
        cleaned = await store.clean_console(limit=size)
        result.console_cleaned += cleaned
        if cleaned < size:
            break
    if result.console_cleaned:
        log.debug("console: deleted %d expired sessions and forgotten sign-in failures",
                  result.console_cleaned)  # fmt: skip
    return result


async def run_maintenance(
    config: MaintenanceConfig,
    store: MaintenanceStore,
    stop: Stop,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. A pass every ``interval_seconds`` until ``stop``; a pass in progress
    finishes its current statement (each is one short transaction). Store failures propagate,
    so the supervisor restarts the task with backoff."""
    task_status.started()
    while not stop.is_set():
        await maintenance_pass(config, store, stop)
        with stop.intake():
            await trio.sleep(config.interval_seconds)
