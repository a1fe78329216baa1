"""``--soak N``: notifier's workers deliver N webhooks from a queue kept topped up (backlogs of
20,000), and the workers' RSS is printed as it goes, so one can see whether it is flat after the
warm-up. Delivered events are deleted as it goes, so the scratch database stays small.

With ``--trace`` the workers run under bench/traced.py: tracemalloc snapshots and gc object
counts every ``--trace-every`` seconds, the growth since the first snapshot after warm-up
written to ``trace.txt`` in the run's directory (tracemalloc slows the process several times:
the rate and RSS of a traced run are not comparable with an untraced one)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bench.procs import rss_kib, wait_for
from bench.sink import Sink

if TYPE_CHECKING:
    from bench.harness import Harness

CHUNK = 20_000
WARMUP = 0.1  # the fraction of N left out of the slope


def slope_bytes_per_delivery(samples: list[tuple[float, int, int]], after: int) -> float | None:
    """Least-squares slope of RSS (KiB) over deliveries, from ``after`` deliveries on, in bytes
    per delivery."""
    pts = [(d, kib) for _, d, kib in samples if d >= after]
    if len(pts) < 3:
        return None
    n = len(pts)
    mx = sum(d for d, _ in pts) / n
    my = sum(k for _, k in pts) / n
    var = sum((d - mx) ** 2 for d, _ in pts)
    if var == 0:
        return None
    return sum((d - mx) * (k - my) for d, k in pts) / var * 1024


def soak(
    bench: Harness, total: int, trace: bool = False, trace_every: float = 60.0,
    trace_frames: int = 1,
) -> None:  # fmt: skip
    s = bench.scratch
    bench.sink = sink = Sink(bench.procs, bench.tmp)
    s.create(sink.url)
    print(f"soak: {total} deliveries; scratch {s.name}; files in {bench.tmp}", flush=True)
    chunk = min(CHUNK, total)
    fed = 0
    chunks: list[str] = []

    def feed() -> None:
        nonlocal fed
        size = min(chunk, total - fed)
        kind = f"bench.soak.{len(chunks)}"
        s.publish(s.make_backlog(kind, size))
        chunks.append(kind)
        fed += size

    feed()
    if trace:
        proc = bench.start_notifier(
            "workers", traced_every=trace_every, traced_frames=trace_frames, wait=False
        )
    else:
        proc = bench.start_notifier("workers", wait=False)
    t0 = time.time()
    samples: list[tuple[float, int, int]] = []
    next_sample = 0.0
    wait_for(lambda: sink.count() > 0, 120, "the first webhook")  # RSS of a started process
    print(f"{'seconds':>8} {'delivered':>10} {'per s':>7} {'RSS MiB':>8}", flush=True)
    last_print = (0.0, 0)
    deadline = time.monotonic() + total / 20 + 600
    while (done := sink.count()) < total:
        now = time.time() - t0
        if proc.poll() is not None:
            raise RuntimeError(f"notifier exited {proc.returncode} during the soak")
        if time.monotonic() > deadline:
            raise TimeoutError(f"soak: only {done} of {total} delivered")
        if now >= next_sample:
            samples.append((now, done, rss_kib(proc.pid)))
            next_sample = now + 2.0
            if done - last_print[1] >= 25_000 or (done and not last_print[1]):
                rate = (done - last_print[1]) / max(0.001, now - last_print[0])
                print(f"{now:8.0f} {done:>10} {rate:7.0f} {samples[-1][2] / 1024:8.1f}",
                      flush=True)  # fmt: skip
                last_print = (now, done)
        if fed < total and s.queue_depth() < chunk // 2:
            feed()
            # delivered events (and their deliveries and attempts) go: the database stays small
            for kind in chunks[:-2]:
                s.execute(
                    "WITH gone AS (SELECT e.id FROM events e WHERE e.type = $1 AND NOT EXISTS "
                    "(SELECT 1 FROM deliveries d WHERE d.event_id = e.id "
                    "AND d.status <> 'DELIVERED')), "
                    "a AS (DELETE FROM delivery_attempts a USING deliveries d, gone g "
                    "WHERE a.delivery_id = d.id AND d.event_id = g.id), "
                    "d AS (DELETE FROM deliveries d USING gone g WHERE d.event_id = g.id) "
                    "DELETE FROM events e USING gone g WHERE e.id = g.id",
                    kind,
                )
        time.sleep(0.2)
    end = time.time() - t0
    samples.append((end, total, rss_kib(proc.pid)))
    print(f"{end:8.0f} {total:>10} {'':7} {samples[-1][2] / 1024:8.1f}", flush=True)
    bench.stop_subject()
    slope = slope_bytes_per_delivery(samples, int(total * WARMUP))
    late = slope_bytes_per_delivery(samples, total // 2)
    peak = max(k for _, _, k in samples)

    def grows(value: float | None) -> str:
        return f"{value:.1f} bytes per delivery" if value is not None else "(too few samples)"

    print(
        f"soak: {total} delivered in {end:.0f} s ({total / end:.0f}/s); RSS peak "
        f"{peak / 1024:.1f} MiB, end {samples[-1][2] / 1024:.1f} MiB; RSS grows "
        f"{grows(slope)} after the first {WARMUP:.0%}, {grows(late)} over the second half",
        flush=True,
    )
    bench.samples["soak.rss"] = samples
    bench.samples["soak.slope_bytes_per_delivery"] = slope
    bench.samples["soak.second_half_bytes_per_delivery"] = late
    if trace:
        print(f"allocation growth: {bench.tmp / 'trace.txt'}", flush=True)
