"""``just bench --history``: the ingest and delivery stages with a large history in the
database against the same stages on the empty one, and what one day's retention costs today.

The history is made in Postgres with INSERT … SELECT FROM generate_series (not through the
API), a day per statement: finished events spread over ``days`` days back, each with its one
webhook delivery (DELIVERED, after one attempt or after a retry; a few DEAD after every
attempt) and its attempt rows, with every index, constraint, foreign key and trigger of
schema.sql in place. Each day's events lie in that day's [2 h, 22 h) past midnight-of-the-run
(counted back from the moment the build starts): the oldest day is due for retention with
``retention_days = days - 1`` and the next day is not, for two hours, whatever the clock does
meanwhile. Retention is the maintenance role's own statement (``retention`` in
queries_maintenance.sql), in batches of the role's default size, one transaction each, back to
back until none is due."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import notifier
from bench.scratch import Scratch

QUERIES = Path(notifier.__file__).parent / "store" / "queries_maintenance.sql"
TABLES = ("events", "deliveries", "delivery_attempts")
EVENT_TYPE = "history.order"
# the slack at either end of each day (hours): the oldest day's last event and the next day's
# first are this far from the retention cut-off when the build starts
SLACK_HOURS = 2
# per 1,000 deliveries: DEAD after every attempt, DELIVERED on the second attempt (the rest on
# the first)
DEAD_PER_MILLE = 10
RETRIED_PER_MILLE = 50
MAX_ATTEMPTS = 5
# the maintenance role's defaults ([maintenance] batch_size, statement timeout, batches a pass)
RETENTION_BATCH = 500
RETENTION_TIMEOUT_MS = 60_000
BATCHES_PER_PASS = 20
PASS_SECONDS = 30.0


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


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


# One day of history in one statement. $1 tenant, $2 channel, $3 the day's first instant, $4 the
# seconds its events are spread over, $5 how many, $6 the attempts' offsets (seconds), $7 DEAD
# and $8 retried per 1,000. Each event's delivery and attempts follow from its draw `r`.
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
                               status_code, error, response_excerpt)
SELECT dl.id, a.n, dl.created_at + ($6::float8[])[a.n] * interval '1 second', 40 + a.n % 40,
       CASE WHEN a.n < dl.attempt THEN 'retry' WHEN dl.status = 'DEAD' THEN 'dead'
            ELSE 'delivered' END,
       CASE WHEN a.n = dl.attempt AND dl.status = 'DELIVERED' THEN 200 ELSE 503 END,
       CASE WHEN a.n = dl.attempt AND dl.status = 'DELIVERED' THEN NULL ELSE 'HTTP 503' END,
       CASE WHEN a.n = dl.attempt AND dl.status = 'DELIVERED' THEN 'ok' ELSE 'unavailable' END
FROM dl, generate_series(1, dl.attempt) AS a(n)
"""
)


@dataclass
class History:
    """What the build and the retention measured, for the report and the JSON."""

    days: int
    rows: int
    build_seconds: float = 0.0
    vacuum_seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)  # when → table → bytes
    retention: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"days": self.days, "rows": self.rows, "build_seconds": self.build_seconds,
                "vacuum_seconds": self.vacuum_seconds, "counts": self.counts,
                "sizes": self.sizes, "retention": self.retention}  # fmt: skip


def sizes(s: Scratch) -> dict[str, int]:
    """pg_total_relation_size (table, TOAST and indexes) of the history's tables, and of the
    whole database."""
    out = {t: int(s.value("SELECT pg_total_relation_size($1::regclass)", t)) for t in TABLES}
    out["database"] = int(s.value("SELECT pg_database_size(current_database())"))
    return out


def build(s: Scratch, rows: int, days: int, tiers: tuple[float, ...],
          say: Any = print) -> History:  # fmt: skip
    """Fill the scratch database with ``rows`` finished deliveries over ``days`` days back."""
    h = History(days=days, rows=rows)
    offsets = attempt_offsets(tiers, MAX_ATTEMPTS)
    start = float(s.value("SELECT extract(epoch FROM now())::float8"))
    span = (24 - 2 * SLACK_HOURS) * 3600.0
    t0 = time.monotonic()
    counts = per_day(rows, days)
    for i, n in enumerate(counts):
        back = days - i  # the oldest first
        first = start - back * 86400 + SLACK_HOURS * 3600
        t = time.monotonic()
        s.execute(DAY_SQL, s.tenant, s.channel_id, _ts(first), span, n, offsets,
                  DEAD_PER_MILLE, RETRIED_PER_MILLE)  # fmt: skip
        say(f"  history: day -{back:<3} {n:>9,} events  {time.monotonic() - t:6.1f} s  "
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
    """Run the maintenance role's retention statement until the oldest day is gone; its wall
    time, the WAL it wrote, and the sizes before and after."""
    sql = load_query("retention")
    keep = h.days - 1
    due = f"created_at < now() - {keep} * interval '1 day'"
    due_before = int(s.value(f"SELECT count(*) FROM events WHERE {due}"))
    h.sizes["before_retention"] = sizes(s)
    lsn = s.value("SELECT pg_current_wal_lsn()")
    batches = deleted = 0
    t0 = time.monotonic()
    while True:
        n = s.retention_batch(sql, keep, RETENTION_BATCH, RETENTION_TIMEOUT_MS)
        batches += 1
        deleted += n
        if n == 0:
            break
    seconds = time.monotonic() - t0
    wal = int(s.value("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)", lsn))
    h.sizes["after_retention"] = sizes(s)
    left = int(s.value(f"SELECT count(*) FROM events WHERE {due}"))
    passes = -(-deleted // (RETENTION_BATCH * BATCHES_PER_PASS))
    h.retention = {
        "retention_days": keep, "due": due_before, "deleted_events": deleted, "left_due": left,
        "batches": batches, "batch_size": RETENTION_BATCH, "seconds": seconds,
        "wal_bytes": wal, "wal_bytes_per_event": wal / deleted if deleted else None,
        "role_passes": passes, "role_minutes_at_default_interval": passes * PASS_SECONDS / 60,
    }  # fmt: skip
    say(f"  retention: {deleted:,} events (and their deliveries and attempts) in {batches} "
        f"batches, {seconds:.1f} s, WAL {mib(wal)}")  # fmt: skip


def report(h: History) -> str:
    """The history's figures: the build, the sizes, and one day's retention."""
    lines = ["", f"history: {h.rows:,} deliveries over {h.days} days, built in "
             f"{h.build_seconds:.0f} s (+ VACUUM ANALYZE {h.vacuum_seconds:.0f} s); rows: "
             + ", ".join(f"{t} {n:,}" for t, n in h.counts.items())]  # fmt: skip
    when = [w for w in ("built", "before_retention", "after_retention") if w in h.sizes]
    if when:
        lines.append(f"  {'size (table + indexes)':<24}" + "".join(f"{w:>20}" for w in when))
        for t in (*TABLES, "database"):
            lines.append(f"  {t:<24}" + "".join(f"{mib(h.sizes[w][t]):>20}" for w in when))
    if r := h.retention:
        lines.append(
            f"  one day's retention (DELETE, {r['batch_size']} a batch, back to back): "
            f"{r['deleted_events']:,} events in {r['seconds']:.1f} s "
            f"({r['batches']} batches), WAL {mib(r['wal_bytes'])} "
            f"({r['wal_bytes_per_event'] or 0:,.0f} bytes per event); {r['left_due']} left due"
        )
        lines.append(
            f"  the maintenance role deletes {RETENTION_BATCH * BATCHES_PER_PASS:,} a pass: "
            f"{r['role_passes']} passes, {r['role_minutes_at_default_interval']:.0f} minutes at "
            f"its default interval; DELETE leaves the tables and indexes their size"
        )
    return "\n".join(lines)


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

    def over(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    return {
        "rate": over(full.rate, empty.rate) or 0.0,
        "cpu_server": over(full.per_1000("server"), empty.per_1000("server")),
        "cpu_pg_own": over(full.per_1000("pg_own"), empty.per_1000("pg_own")),
    }


def _x(v: float | None) -> str:
    return f"{v:5.2f}x" if v is not None else "   - "


def _ts(epoch: float) -> Any:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
