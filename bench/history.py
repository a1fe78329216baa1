"""``just bench --history``: the ingest and delivery stages with a large history in the
database against the same stages on the empty one, what one day's retention costs by dropping
its partitions against the DELETE it replaced, and the history's size across a simulated month
with retention on.

The history is made in Postgres with INSERT … SELECT FROM generate_series (not through the
API), a day per statement: finished events over ``days`` UTC calendar days back from the UTC
date the build starts on (the oldest first, today not among them), each with its one webhook
delivery (DELIVERED, after one attempt or after a retry; a few DEAD after every attempt) and
its attempt rows, with every index, constraint and trigger of schema.sql in place. Before a
day's INSERT its three partitions are made (``notifier_partitions_ensure``); its events lie in
[00:00 + SLACK_HOURS, 24:00 - SLACK_HOURS) of that UTC date, so a day of the build is one
partition of each table, and its deliveries and attempts are in the same day's partitions.

Retention, in one run: the oldest day by the maintenance role's own statements (``partitions_due``
and ``partition_drop`` of queries_maintenance.sql, each in a transaction of its own with the
role's statement and lock timeouts), and the second-oldest day, as large, by the DELETE retention
ran before the history was partitioned (``OLD_RETENTION_SQL``), in batches of 500 events, a
transaction each. The month (``month``) repeats a smaller day's build and the retention that
follows it, day after day, in a database of its own, once for each way."""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import notifier
from bench.scratch import Scratch

QUERIES = Path(notifier.__file__).parent / "store" / "queries_maintenance.sql"
TABLES = ("events", "deliveries", "delivery_attempts")
# what the history's size is: its three tables and the idempotency keys of its events
SIZED = (*TABLES, "event_keys")
EVENT_TYPE = "history.order"
# the hours left empty at either end of each UTC day: every attempt of a day's event (the retry
# delays add under a minute for five) starts on the same day
SLACK_HOURS = 2
# per 1,000 deliveries: DEAD after every attempt, DELIVERED on the second attempt (the rest on
# the first)
DEAD_PER_MILLE = 10
RETRIED_PER_MILLE = 50
MAX_ATTEMPTS = 5
# the maintenance role's (store/maintenance.py: MAINTENANCE_STATEMENT_TIMEOUT_SECONDS,
# PARTITION_LOCK_TIMEOUT_MS), copied: importing notifier.store would install trio-asyncio's
# event loop policy, and the harness runs on plain asyncio (tests/unit/test_bench_history.py
# holds the copies to the originals)
STATEMENT_TIMEOUT_MS = 60_000
PARTITION_LOCK_TIMEOUT_MS = 500
# the DELETE retention's batch: the maintenance role's default [maintenance] batch_size
DELETE_BATCH = 500
# the month's defaults: days simulated, deliveries a day, retention_days
MONTH_DAYS = 30
MONTH_ROWS = 100_000
MONTH_RETENTION = 7

# The retention before the history was partitioned, kept for comparison: the maintenance role
# deleted up to $2 events whose deliveries were all finished, a batch per transaction, and their
# deliveries and attempts went with them by ON DELETE CASCADE. The partitioned tables have no
# foreign keys, so this copy deletes the batch's attempts, deliveries and events itself, each
# probe with its partition key (a delivery's created_at is its event's, an attempt's
# delivery_created_at its delivery's). One more change: $1 is the time the deleted events were
# made before (the role had `now() - retention_days`), so that it takes whole UTC days.
OLD_RETENTION_SQL = """
WITH batch AS (
    SELECT e.id, e.created_at FROM events e
    WHERE e.created_at < $1::timestamptz
      AND NOT EXISTS (SELECT 1 FROM deliveries d
                      WHERE d.event_id = e.id AND d.created_at = e.created_at
                        AND d.status IN ('PENDING', 'RETRYING'))
    ORDER BY e.created_at
    LIMIT $2
    FOR UPDATE OF e SKIP LOCKED
),
dl AS (
    DELETE FROM deliveries d USING batch b
    WHERE d.event_id = b.id AND d.created_at = b.created_at AND d.created_at < $1::timestamptz
    RETURNING d.id, d.created_at
),
att AS (
    DELETE FROM delivery_attempts a USING dl
    WHERE a.delivery_id = dl.id AND a.delivery_created_at = dl.created_at
      AND a.delivery_created_at < $1::timestamptz
)
DELETE FROM events e USING batch b
WHERE e.id = b.id AND e.created_at = b.created_at AND e.created_at < $1::timestamptz
RETURNING e.id
"""


def load_query(name: str, text: str | None = None) -> str:
    """The named block (``-- name: NAME``) of notifier's queries_maintenance.sql."""
    blocks = re.split(r"^-- name: *(\S+) *$", text or QUERIES.read_text(), flags=re.M)
    found = dict(zip(blocks[1::2], blocks[2::2], strict=True))
    return found[name].strip()


def per_day(total: int, days: int) -> list[int]:
    """``total`` events over ``days`` days, as even as can be (the oldest days take the
    remainder): oldest first."""
    if days < 1 or total < days:
        raise ValueError(f"{total} events cannot fill {days} days")
    base, extra = divmod(total, days)
    return [base + (1 if i < extra else 0) for i in range(days)]


def attempt_offsets(tiers: tuple[float, ...], attempts: int) -> list[float]:
    """Seconds from an event's creation to the start of each of its attempts, the n-th retry
    waiting the retry policy's n-th delay: 0 for the first."""
    out, at = [0.0], 0.0
    for n in range(attempts - 1):
        at += tiers[min(n, len(tiers) - 1)]
        out.append(at)
    return out


def day_dates(today: datetime.date, days: int) -> list[datetime.date]:
    """The UTC dates of a history of ``days`` days before ``today``, oldest first."""
    return [today - datetime.timedelta(days=days - i) for i in range(days)]


def day_window(day: datetime.date) -> tuple[datetime.datetime, float]:
    """The first instant of a day's events and the seconds they are spread over: all within
    the UTC date, ``SLACK_HOURS`` clear of either end."""
    midnight = datetime.datetime.combine(day, datetime.time(), tzinfo=datetime.UTC)
    return midnight + datetime.timedelta(hours=SLACK_HOURS), (24 - 2 * SLACK_HOURS) * 3600.0


def midnight(day: datetime.date) -> datetime.datetime:
    """A UTC date's first instant."""
    return datetime.datetime.combine(day, datetime.time(), tzinfo=datetime.UTC)


def suffix_of(day: datetime.date) -> str:
    """The suffix of a day's partitions (``_pYYYYMMDD``, as notifier_partitions_ensure names
    them)."""
    return day.strftime("_p%Y%m%d")


def day_of(suffix: str) -> datetime.date | None:
    """The UTC date of a day's partitions from their suffix; None for another (``_legacy``)."""
    m = re.fullmatch(r"_p(\d{8})", suffix)
    return datetime.datetime.strptime(m.group(1), "%Y%m%d").date() if m else None


def due_suffixes(suffixes: list[str], day: datetime.date, retention_days: int) -> list[str]:
    """The days of ``suffixes`` that retention with ``retention_days`` drops on ``day``: those
    that ended more than ``retention_days`` days before it (dated more than ``retention_days``
    days before it), oldest first; ``retention_days`` + 1 days are left."""
    cut = day - datetime.timedelta(days=retention_days)
    dated = [(d, s) for s in suffixes if (d := day_of(s)) is not None and d < cut]
    return [s for _, s in sorted(dated)]


def spread(values: list[int]) -> float:
    """(largest - smallest) / smallest: how far from flat a series of sizes is."""
    low, high = min(values, default=0), max(values, default=0)
    return (high - low) / low if low else 0.0


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def size(n: float) -> str:
    """Bytes in the unit that shows them best (B, KiB, MiB, GiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# One day of history in one statement. $1 tenant, $2 channel, $3 the day's first instant, $4 the
# seconds its events are spread over, $5 how many, $6 the attempts' offsets (seconds), $7 DEAD
# and $8 retried per 1,000. Each event's delivery and attempts follow from its draw `r`; a
# delivery's created_at is its event's and an attempt's delivery_created_at its delivery's, so
# the day's three partitions hold them all.
DAY_SQL = (
    """
WITH ev AS (
    INSERT INTO events (id, tenant_id, type, payload, created_at)
    SELECT gen_random_uuid(), $1, '"""
    + EVENT_TYPE
    + """',
           jsonb_build_object('order_id', format('ord_%s', lpad(g::text, 8, '0')),
                              'amount_cents', 1000 + g % 90000, 'currency', 'EUR',
                              'items', 1 + g % 7),
           $3::timestamptz + (g::float8 / $5::integer) * $4::float8 * interval '1 second'
    FROM generate_series(0, $5::integer - 1) AS g
    RETURNING id, tenant_id, created_at
),
drawn AS (
    SELECT ev.*, CASE WHEN r < $7::integer / 1000.0 THEN 'DEAD' ELSE 'DELIVERED' END AS status,
           CASE WHEN r < $7::integer / 1000.0 THEN cardinality($6::float8[])
                WHEN r < ($7::integer + $8::integer) / 1000.0 THEN 2 ELSE 1 END AS attempts
    FROM (SELECT ev.*, random() AS r FROM ev) AS ev
),
dl AS (
    INSERT INTO deliveries (id, event_id, channel_id, tenant_id, channel_type, status, attempt,
                            max_attempts, last_error, delivered_at, created_at, updated_at)
    SELECT gen_random_uuid(), d.id, $2, d.tenant_id, 'webhook', d.status, d.attempts,
           cardinality($6::float8[]),
           CASE WHEN d.status = 'DEAD' THEN 'HTTP 503' END,
           CASE WHEN d.status = 'DELIVERED' THEN d.finished END, d.created_at, d.finished
    FROM (SELECT drawn.*, created_at + ($6::float8[])[attempts] * interval '1 second'
                          + interval '80 milliseconds' AS finished
          FROM drawn) AS d
    RETURNING id, status, attempt, created_at
)
INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome,
                               status_code, error, response_excerpt, delivery_created_at)
SELECT dl.id, a.n, dl.created_at + ($6::float8[])[a.n] * interval '1 second', 40 + a.n % 40,
       CASE WHEN a.n < dl.attempt THEN 'retry' WHEN dl.status = 'DEAD' THEN 'dead'
            ELSE 'delivered' END,
       CASE WHEN a.n = dl.attempt AND dl.status = 'DELIVERED' THEN 200 ELSE 503 END,
       CASE WHEN a.n = dl.attempt AND dl.status = 'DELIVERED' THEN NULL ELSE 'HTTP 503' END,
       CASE WHEN a.n = dl.attempt AND dl.status = 'DELIVERED' THEN 'ok' ELSE 'unavailable' END,
       dl.created_at
FROM dl, generate_series(1, dl.attempt) AS a(n)
"""
)


@dataclass
class History:
    """What the build and the retention measured, for the report and the JSON."""

    days: int
    rows: int
    first_day: str = ""  # the oldest day's UTC date (ISO)
    build_seconds: float = 0.0
    vacuum_seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)  # when → table → bytes
    retention: dict[str, Any] = field(default_factory=dict)  # "drop", "delete" → figures
    month: dict[str, Any] = field(default_factory=dict)  # see ``month``

    def as_dict(self) -> dict[str, Any]:
        return {"days": self.days, "rows": self.rows, "first_day": self.first_day,
                "build_seconds": self.build_seconds, "vacuum_seconds": self.vacuum_seconds,
                "counts": self.counts, "sizes": self.sizes, "retention": self.retention,
                "month": self.month}  # fmt: skip


def sizes(s: Scratch) -> dict[str, int]:
    """Bytes of each of the history's tables, every partition with its TOAST and indexes
    (pg_total_relation_size over pg_partition_tree), and of the whole database."""
    out = {t: int(s.value(TREE_SIZE_SQL, t)) for t in SIZED}
    out["database"] = int(s.value("SELECT pg_database_size(current_database())"))
    return out


def day_sizes(s: Scratch, suffix: str) -> dict[str, int]:
    """Bytes of one day's partitions (with their TOAST and indexes); 0 for one not there."""
    sql = "SELECT coalesce(pg_total_relation_size(to_regclass($1)), 0)::bigint"
    return {t: int(s.value(sql, t + suffix)) for t in TABLES}


def day_counts(s: Scratch, suffix: str) -> dict[str, int]:
    """Rows in one day's partitions."""
    return {t: int(s.value(f'SELECT count(*) FROM "{t}{suffix}"')) for t in TABLES}


TREE_SIZE_SQL = (
    "SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint "
    "FROM pg_partition_tree($1::regclass)"
)


def wal_lsn(s: Scratch) -> str:
    return str(s.value("SELECT pg_current_wal_lsn()::text"))


def wal_since(s: Scratch, lsn: str) -> int:
    """WAL bytes the cluster wrote since ``lsn`` (every database's: the server is shared)."""
    return int(s.value("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)", lsn))


def add_day(s: Scratch, day: datetime.date, n: int, offsets: list[float]) -> None:
    """One day of history: its partitions (as the maintenance role makes them, ahead), then
    ``n`` events with their deliveries and attempts in one statement."""
    s.value(load_query("partitions_ensure"), day, day)
    first, span = day_window(day)
    s.execute(DAY_SQL, s.tenant, s.channel_id, first, span, n, offsets,
              DEAD_PER_MILLE, RETRIED_PER_MILLE)  # fmt: skip


def drop_day(s: Scratch, suffix: str) -> bool:
    """The maintenance role's drop of one day (``_drop_day``): ``partition_drop`` in a
    transaction of its own, with its statement and lock timeouts; whether it dropped."""
    rows = s.in_transaction(load_query("partition_drop"), suffix,
                            statement_timeout_ms=STATEMENT_TIMEOUT_MS,
                            lock_timeout_ms=PARTITION_LOCK_TIMEOUT_MS)  # fmt: skip
    return bool(rows[0][0])


def delete_before(s: Scratch, cutoff: datetime.datetime) -> tuple[int, int]:
    """The pre-partitioning retention: ``OLD_RETENTION_SQL`` a batch per transaction, back to
    back until it finds none; (events deleted, batches)."""
    deleted = batches = 0
    while True:
        n = len(s.in_transaction(OLD_RETENTION_SQL, cutoff, DELETE_BATCH,
                                 statement_timeout_ms=STATEMENT_TIMEOUT_MS))  # fmt: skip
        batches += 1
        deleted += n
        if n == 0:
            return deleted, batches


def build(s: Scratch, rows: int, days: int, tiers: tuple[float, ...],
          say: Any = print) -> History:  # fmt: skip
    """Fill the scratch database with ``rows`` finished deliveries over the ``days`` UTC days
    before today."""
    h = History(days=days, rows=rows)
    offsets = attempt_offsets(tiers, MAX_ATTEMPTS)
    today = s.value("SELECT (now() AT TIME ZONE 'UTC')::date")
    dates = day_dates(today, days)
    h.first_day = dates[0].isoformat()
    t0 = time.monotonic()
    for day, n in zip(dates, per_day(rows, days), strict=True):
        t = time.monotonic()
        add_day(s, day, n, offsets)
        say(f"  history: {day} {n:>9,} events  {time.monotonic() - t:6.1f} s  "
            f"(total {time.monotonic() - t0:6.0f} s)")  # fmt: skip
    h.build_seconds = time.monotonic() - t0
    t = time.monotonic()
    for table in TABLES:
        s.execute(f"VACUUM ANALYZE {table}")
    h.vacuum_seconds = time.monotonic() - t
    h.counts = {t: int(s.value(f"SELECT count(*) FROM {t}")) for t in TABLES}
    h.sizes["built"] = sizes(s)
    say(f"  history: {h.counts['deliveries']:,} deliveries, {h.counts['delivery_attempts']:,} "
        f"attempts in {h.build_seconds:.0f} s, VACUUM ANALYZE {h.vacuum_seconds:.0f} s; "
        f"database {mib(h.sizes['built']['database'])}")  # fmt: skip
    return h


def retention(s: Scratch, h: History, say: Any = print) -> None:
    """The oldest day dropped as the maintenance role drops it, then the second-oldest deleted
    as it was deleted before the partitioning: wall time, WAL, rows, sizes before and after."""
    oldest = datetime.date.fromisoformat(h.first_day)
    second = oldest + datetime.timedelta(days=1)
    # retention_days such that exactly the oldest day is due now, whatever the date is by now
    today = s.value("SELECT (now() AT TIME ZONE 'UTC')::date")
    keep = (today - oldest).days - 1

    # -- drop: partitions_due, then partition_drop of each due day, a transaction each --
    suffix = suffix_of(oldest)
    rows = day_counts(s, suffix)
    part_before = day_sizes(s, suffix)
    h.sizes["before_drop"] = sizes(s)
    lsn = wal_lsn(s)
    t0 = time.monotonic()
    due_sql = load_query("partitions_due")
    due_rows = s.in_transaction(due_sql, keep, statement_timeout_ms=STATEMENT_TIMEOUT_MS)
    due = [r["suffix"] for r in due_rows]
    dropped = [d for d in due if drop_day(s, d)]
    seconds = time.monotonic() - t0
    wal = wal_since(s, lsn)
    h.sizes["after_drop"] = sizes(s)
    h.retention["drop"] = {
        "day": oldest.isoformat(), "retention_days": keep, "due": due, "dropped": dropped,
        "rows": rows, "seconds": seconds, "wal_bytes": wal, "day_sizes_before": part_before,
        "day_sizes_after": day_sizes(s, suffix),
    }  # fmt: skip
    say(f"  retention, drop: {', '.join(dropped) or 'nothing'} ({rows['events']:,} events) in "
        f"{seconds * 1000:.0f} ms, WAL {size(wal)}")  # fmt: skip

    # -- DELETE: the second-oldest day's events, deliveries and attempts, 500 events a batch --
    suffix = suffix_of(second)
    rows = day_counts(s, suffix)
    part_before = day_sizes(s, suffix)
    h.sizes["before_delete"] = sizes(s)
    lsn = wal_lsn(s)
    t0 = time.monotonic()
    deleted, batches = delete_before(s, midnight(second + datetime.timedelta(days=1)))
    seconds = time.monotonic() - t0
    wal = wal_since(s, lsn)
    h.sizes["after_delete"] = sizes(s)
    h.retention["delete"] = {
        "day": second.isoformat(), "rows": rows, "deleted_events": deleted,
        "left": day_counts(s, suffix), "batches": batches, "batch_size": DELETE_BATCH,
        "seconds": seconds, "wal_bytes": wal, "day_sizes_before": part_before,
        "day_sizes_after": day_sizes(s, suffix),
    }  # fmt: skip
    d, x = h.retention["drop"], h.retention["delete"]
    h.retention["drop_over_delete"] = {
        "seconds": over(d["seconds"], x["seconds"]),
        "wal_bytes": over(d["wal_bytes"], x["wal_bytes"]),
    }
    say(f"  retention, DELETE: {deleted:,} events in {batches} batches, {seconds:.1f} s, "
        f"WAL {size(wal)}")  # fmt: skip


def month(days: int, rows: int, retention_days: int, tiers: tuple[float, ...],
          say: Any = print, scratch: Callable[[], Scratch] = Scratch,
          ) -> dict[str, Any]:  # fmt: skip
    """The history across ``days`` simulated days of ``rows`` deliveries each, with retention
    of ``retention_days``, once dropping the due days' partitions (``drop``) and once deleting
    their rows with the DELETE retention of before the partitioning (``delete``), each in a
    scratch database of its own (Postgres alone). Simulated day k is the UTC date ``days`` - k
    days before today; after its build, retention treats it as today: it takes the days dated
    more than ``retention_days`` before it. After the DELETE, the day's partitions are
    vacuumed (autovacuum's work after it, done at once so that the sizes do not depend on when
    autovacuum comes). Per day: the history's size (``SIZED``, every partition with its
    indexes) after the retention, the WAL of the build and of the retention (and of the
    VACUUM), the retention's wall time."""
    offsets = attempt_offsets(tiers, MAX_ATTEMPTS)
    out: dict[str, Any] = {"days": days, "rows_per_day": rows, "retention_days": retention_days}
    for way in ("drop", "delete"):
        s = scratch()
        try:
            s.create("http://127.0.0.1:9/", broker=False)
            today = s.value("SELECT (now() AT TIME ZONE 'UTC')::date")
            dates = day_dates(today, days)
            series: dict[str, list[Any]] = {
                "day": [], "size": [], "wal_build": [], "wal_retention": [], "wal_vacuum": [],
                "seconds_retention": [], "days_removed": [],
            }  # fmt: skip
            for k, day in enumerate(dates, 1):
                lsn = wal_lsn(s)
                add_day(s, day, rows, offsets)
                series["wal_build"].append(wal_since(s, lsn))
                lsn, t0 = wal_lsn(s), time.monotonic()
                if way == "drop":
                    parts = [r["suffix"] for r in s.fetch(
                        "SELECT suffix FROM notifier_history_partitions()")]  # fmt: skip
                    gone = [x for x in due_suffixes(parts, day, retention_days) if drop_day(s, x)]
                    removed = [str(day_of(x)) for x in gone]
                    seconds, vacuum = time.monotonic() - t0, 0
                else:
                    cut = day - datetime.timedelta(days=retention_days)
                    deleted, _ = delete_before(s, midnight(cut))
                    seconds = time.monotonic() - t0
                    # the days it emptied: their partitions vacuumed
                    removed = [str(cut - datetime.timedelta(days=1))] if deleted else []
                    vlsn = wal_lsn(s)
                    for d in removed:
                        for t in TABLES:
                            s.execute(f'VACUUM "{t}{suffix_of(datetime.date.fromisoformat(d))}"')
                    vacuum = wal_since(s, vlsn)
                series["wal_retention"].append(wal_since(s, lsn) - vacuum)
                series["wal_vacuum"].append(vacuum)
                series["seconds_retention"].append(seconds)
                series["days_removed"].append(removed)
                series["day"].append(k)
                series["size"].append(sum(v for t, v in sizes(s).items() if t in SIZED))
                say(f"  month, {way:<6} day {k:>2} ({day}): {size(series['size'][-1]):>10}  "
                    f"retention {seconds:6.2f} s, WAL {size(series['wal_retention'][-1])}"
                    + (f" (+ VACUUM {size(vacuum)})" if vacuum else "")
                    + (f"; removed {', '.join(removed)}" if removed else ""))  # fmt: skip
            out[way] = series
        finally:
            s.drop()
    return out


def month_summary(m: dict[str, Any]) -> dict[str, Any]:
    """Per way: the size's high-water mark and its last value, how far from flat it is once
    ``retention_days`` + 1 days are kept, and the WAL totals."""
    r = m["retention_days"]
    out: dict[str, Any] = {}
    for way in ("drop", "delete"):
        series = m.get(way)
        if not series:
            continue
        steady = series["size"][r + 1 :]
        out[way] = {
            "max_size": max(series["size"]), "last_size": series["size"][-1],
            "steady_spread": spread(steady) if steady else None,
            "wal_build": sum(series["wal_build"]), "wal_retention": sum(series["wal_retention"]),
            "wal_vacuum": sum(series["wal_vacuum"]),
            "seconds_retention": sum(series["seconds_retention"]),
        }  # fmt: skip
    return out


def report(h: History) -> str:
    """The history's figures: the build, the sizes, one day dropped against one deleted, and
    the month."""
    lines = ["", f"history: {h.rows:,} deliveries over {h.days} days from {h.first_day}, built "
             f"in {h.build_seconds:.0f} s (+ VACUUM ANALYZE {h.vacuum_seconds:.0f} s); rows: "
             + ", ".join(f"{t} {n:,}" for t, n in h.counts.items())]  # fmt: skip
    when = [w for w in ("built", "before_drop", "after_drop", "before_delete", "after_delete")
            if w in h.sizes]  # fmt: skip
    if when:
        lines.append(f"  {'size (with indexes)':<20}" + "".join(f"{w:>15}" for w in when))
        for t in (*SIZED, "database"):
            lines.append(f"  {t:<20}" + "".join(f"{mib(h.sizes[w][t]):>15}" for w in when))
    if (d := h.retention.get("drop")) and (x := h.retention.get("delete")):
        dsize = sum(d["day_sizes_before"].values())
        lines.append(
            f"  one day dropped ({d['day']}, retention_days {d['retention_days']}: partitions_due "
            f"+ partition_drop): {d['rows']['events']:,} events, {d['rows']['deliveries']:,} "
            f"deliveries, {d['rows']['delivery_attempts']:,} attempts in "
            f"{d['seconds'] * 1000:,.0f} ms, WAL {size(d['wal_bytes'])}; its partitions' "
            f"{size(dsize)} given back"
        )  # fmt: skip
        xsize = sum(x["day_sizes_before"].values())
        lines.append(
            f"  one day deleted ({x['day']}, the DELETE of before, {x['batch_size']} events a "
            f"batch): {x['deleted_events']:,} events, {x['rows']['deliveries']:,} deliveries, "
            f"{x['rows']['delivery_attempts']:,} attempts in {x['seconds']:.1f} s "
            f"({x['batches']} batches), WAL {size(x['wal_bytes'])}; its partitions "
            f"{size(xsize)} before, {size(sum(x['day_sizes_after'].values()))} after"
        )  # fmt: skip
        r = h.retention["drop_over_delete"]
        lines.append(
            f"  drop / DELETE: time {r['seconds'] or 0:.4f}x, WAL {r['wal_bytes'] or 0:.5f}x"
        )
    if m := h.month:
        lines.append(month_report(m))
    return "\n".join(lines)


def month_report(m: dict[str, Any]) -> str:
    """The month's series side by side, and its totals."""
    r = m["retention_days"]
    lines = [
        "",
        f"a simulated month: {m['days']} days of {m['rows_per_day']:,} deliveries, "
        f"retention_days {r}; the history's size after each day's retention "
        f"({', '.join(SIZED)}, with indexes):",
        f"  {'day':>4} {'drop':>12} {'DELETE':>12} {'WAL drop':>12} {'WAL DELETE':>12}",
    ]
    drop, delete = m.get("drop"), m.get("delete")
    for i, k in enumerate((drop or delete or {"day": []})["day"]):
        cells = []
        for series, key in ((drop, "size"), (delete, "size"), (drop, "wal_retention"),
                            (delete, "wal_retention")):  # fmt: skip
            cells.append(f"{size(series[key][i]):>12}" if series else f"{'-':>12}")
        lines.append(f"  {k:>4} " + " ".join(cells))
    summary = month_summary(m)
    for way, name in (("drop", "drop"), ("delete", "DELETE")):
        if (v := summary.get(way)) is None:
            continue
        flat = (f", within {v['steady_spread']:.1%} from day {r + 2} on"
                if v["steady_spread"] is not None else "")  # fmt: skip
        lines.append(
            f"  {name}: largest {size(v['max_size'])}, last {size(v['last_size'])}{flat}; WAL of "
            f"the builds {size(v['wal_build'])}, of the retention {size(v['wal_retention'])}"
            + (f" + VACUUM {size(v['wal_vacuum'])}" if v["wal_vacuum"] else "")
            + f", retention {v['seconds_retention']:.1f} s in all"
        )  # fmt: skip
    if "drop" in summary and "delete" in summary:
        d, x = summary["drop"], summary["delete"]
        smaller = over(d["last_size"], x["last_size"]) or 0.0
        wal = over(d["wal_retention"], x["wal_retention"] + x["wal_vacuum"]) or 0.0
        lines.append(
            f"  drop / DELETE: last size {smaller:.2f}x, retention WAL {wal:.4f}x (the DELETE's "
            f"with its VACUUM)"
        )
    return "\n".join(lines)


def chart(result: dict[str, Any], path: Path) -> None:
    """The month's sizes day by day, dropping against deleting, and the WAL of each day's
    retention."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = (result.get("history") or {}).get("month") or {}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    if not m:
        for ax in axes:
            ax.axis("off")
        fig.savefig(path, dpi=110)
        return
    r = m["retention_days"]
    for way, label in (("drop", "drop the day's partitions"), ("delete", "DELETE (before)")):
        if series := m.get(way):
            axes[0].plot(series["day"], [v / 2**20 for v in series["size"]], marker=".",
                         label=label)  # fmt: skip
            # the days whose retention took something: the others wrote nothing of their own
            took = [i for i, gone in enumerate(series["days_removed"]) if gone]
            axes[1].plot([series["day"][i] for i in took],
                         [(series["wal_retention"][i] + series["wal_vacuum"][i]) / 2**20
                          for i in took], marker=".",
                         label=label + (" + VACUUM" if way == "delete" else ""))  # fmt: skip
    for ax in axes:
        ax.axvline(r + 1.5, color="grey", linewidth=0.8)
        ax.set_xlabel("simulated day")
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[0].set_ylim(bottom=0)
    axes[0].set_title(
        f"history size (MiB) after retention: {m['rows_per_day']:,} deliveries a day, "
        f"retention_days {r}",
        fontsize=10,
    )
    axes[1].set_yscale("log")
    axes[1].set_title("WAL of each day's retention (MiB; the server's, any database)",
                      fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def ratio_lines(pairs: list[tuple[str, Any, Any]]) -> str:
    """history / empty per stage: rate and CPU per 1,000 of notifier and of Postgres's
    backends of the scratch database."""
    lines = ["", "with the history / on the empty database, same run:"]
    for what, empty, full in pairs:
        if empty is None or full is None:
            continue
        values = stage_ratio(empty, full)
        lines.append(
            f"  {what:<28} rate {values['rate']:5.2f}x   CPU per item: notifier "
            f"{_x(values['cpu_server'])}  pg own {_x(values['cpu_pg_own'])}"
        )
    return "\n".join(lines)


def stage_ratio(empty: Any, full: Any) -> dict[str, float | None]:
    """The history stage's figures over the empty one's: rate, and CPU per item per group."""
    return {
        "rate": over(full.rate, empty.rate) or 0.0,
        "cpu_server": over(full.per_1000("server"), empty.per_1000("server")),
        "cpu_pg_own": over(full.per_1000("pg_own"), empty.per_1000("pg_own")),
    }


def _x(v: float | None) -> str:
    return f"{v:5.2f}x" if v is not None else "   - "
