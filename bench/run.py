"""``just bench``: notifier's stages measured against baselines in the same invocation.

Stages (each notifier run is ``python -m notifier run --role … --config FILE``, a process of its
own; load from wrk, webhooks into an nginx sink):

- ingest single / batch: wrk -t1 -c16 POSTing ~1 KB events (100 per request for the batch);
  the same wrk script against a bare quart-trio app (bench/baseline_quart.py).
- relay: a backlog in the outbox, the relay alone publishing it to RabbitMQ.
- delivery: ``--role workers`` draining a backlog of signed webhooks into nginx; the same backlog
  size drained by a plain asyncio process doing the same work (bench/baseline_asyncio.py), on
  asyncio's loop with httpx and with a minimal h11 client, and on uvloop with aiohttp;
  ``--delivery`` runs only these.
- end to end: every role in one process, wrk unpaced (the saturation rate), then paced at a
  fraction of it for the ingest→delivered latency.
- scaling: ``--processes 1`` and ``--processes 2`` side by side, for ingest (wrk on the
  shared port) and delivery (draining a backlog); ``--scaling`` runs only these.
- memory (``--memory``): RSS of the workers while draining 100,000; ``--soak N``: RSS while
  delivering N.

CPU is utime+stime from /proc for notifier (or the baseline), every postgres process, RabbitMQ
(beam.smp), and the harness (wrk and nginx); per 1,000 items of the stage, and as cores busy over
the measured window, with each process's busy fraction sampled every half second
(bench/procs.py ``Sampler``): the scaling stages end with where the ceiling is on the machine's
cores (bench/report.py ``scaling``).
"""

from __future__ import annotations

import functools
import subprocess
import time
from collections.abc import Callable
from typing import Any

from bench import history, report, tracing
from bench.harness import Harness
from bench.procs import children, rss_kib, wait_for
from bench.sink import Sink
from bench.stage import Stage, percentile

# the delivery baselines (bench/baseline_asyncio.py): key, --loop, --http, what the table says
BASELINES = (
    ("asyncio", "asyncio", "httpx", "plain asyncio, same work, httpx"),
    ("asyncio_h11", "asyncio", "h11", "plain asyncio, same work, h11"),
    ("uvloop_aiohttp", "uvloop", "aiohttp", "uvloop + aiohttp, same work"),
)


class Bench(Harness):
    """The stages, one after the other (``run``), on the harness."""

    history_result: history.History | None = None  # what ``--history`` built and measured
    span_costs: list[dict[str, Any]] | None = None  # ``--tracing``: bench/span_cost.py's runs

    # -- stages --

    def ingest(self, key: str, name: str, server: str, path: str, batch: int,
               event_type: str, seconds: float) -> Stage:  # fmt: skip
        url = f"http://127.0.0.1:{self.port}"
        stop = self.measure()
        res = self.run_wrk(url, path=path, batch=batch, event_type=event_type,
                           seconds=seconds, connections=16)  # fmt: skip
        cpu, window = stop()
        stage = Stage(
            key, name, "events", (res.requests - res.errors["status"]) * batch, res.seconds,
            p50_ms=res.p50_ms,
            p99_ms=res.p99_ms, cpu=cpu, window=window,
            extra={"server": server, "requests": res.requests, "errors": res.errors,
                   "p90_ms": res.p90_ms, "max_ms": res.max_ms},
        )  # fmt: skip
        if res.failed:
            stage.extra["note"] = f"{res.failed} requests failed or were refused"
        return self.done(stage)

    def done(self, stage: Stage) -> Stage:
        self.stages.append(stage)
        print(report.line(stage), flush=True)
        return stage

    def drain(self, key: str, name: str, server: str, event_type: str, count: int,
              start: Callable[[], subprocess.Popen[bytes]], rss_every: float = 0.5,
              progress_every: int = 0, ready_first: bool = False) -> Stage:  # fmt: skip
        """Make a backlog of ``count`` deliveries in the queue, start the server, and measure
        from its first webhook to the ``count``-th (the start-up is not measured). With
        ``ready_first``, ``start`` returns once the server is ready (every process of a launch),
        and the measure starts then: what a process that was ready earlier delivered before
        is left out, so the figure is the rate of all of them running."""
        assert self.sink is not None
        t_make = time.time()
        bodies = self.scratch.make_backlog(event_type, count)
        self.scratch.publish(bodies)
        del bodies
        self.say(f"  {name}: backlog of {count} made and queued in {time.time() - t_make:.1f} s")
        base = self.sink.count()
        proc = start()
        if not ready_first:
            wait_for(lambda: self.sink is not None and self.sink.count() > base, 60,
                     "the first webhook")  # fmt: skip
        stop = self.measure()
        t0 = time.time()
        first = self.sink.count() - base
        rss: list[tuple[float, int, int]] = []  # (seconds, delivered, KiB)
        next_rss = 0.0
        deadline = time.monotonic() + max(120.0, count / 50)
        next_progress = progress_every
        while (n := self.sink.count() - base) < count:
            now = time.time()
            if now >= next_rss:
                rss.append((now - t0, n, rss_kib(proc.pid, *children(proc.pid))))
                next_rss = now + rss_every
            if progress_every and n >= next_progress:
                self.say(f"    {n:>8} delivered, RSS {rss[-1][2] / 1024:.1f} MiB")
                next_progress += progress_every
            if proc.poll() is not None:
                raise RuntimeError(f"{server} exited {proc.returncode} during the drain")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: only {n} of {count} delivered")
            time.sleep(0.05)
        rss.append((time.time() - t0, count, rss_kib(proc.pid, *children(proc.pid))))
        last = self.sink.arrivals(base + count - 1, base + count)[0]
        # the last webhook's attempt is recorded and acked just after it arrived: one check
        wait_for(lambda: self.scratch.delivered(event_type)[0] >= count, 30,
                 f"{count} DELIVERED in Postgres", every=0.5)  # fmt: skip
        cpu, window = stop()
        delivered, attempts = self.scratch.delivered(event_type)
        arrivals = self.sink.arrivals(base, base + count)
        stage = Stage(
            key, name, "deliveries", count - first, last.at - t0, cpu=cpu, window=window,
            extra={
                "server": server, "backlog": count, "delivered_in_postgres": delivered,
                "attempt_rows": attempts, "signed": sum(a.signed for a in arrivals),
                "rss_peak_kib": max(r[2] for r in rss), "rss_end_kib": rss[-1][2],
            },
        )  # fmt: skip
        self.samples[f"{key}.rss"] = rss
        if delivered != count or stage.extra["signed"] != count:
            stage.extra["note"] = (
                f"{delivered} DELIVERED, {stage.extra['signed']} signed of {count}"
            )
        return self.done(stage)

    def delivery(self, levels: list[str], backlog: int) -> None:
        """The workers at each log level, then the three asyncio baselines, each draining a
        backlog of the same size."""
        for level in levels:
            key = "delivery" if level == "INFO" else "delivery_warning"
            start = functools.partial(self.start_notifier, "workers", level, wait=False)
            self.drain(key, f"delivery, queue → webhook (log {level})", "notifier --role workers",
                       f"bench.delivery.{level.lower()}", backlog, start)  # fmt: skip
            self.stop_subject()
        for key, loop, http, what in BASELINES:
            self.drain(key, f"  baseline: {what}", f"{loop} baseline ({http})",
                       f"bench.delivery.{key}", backlog,
                       functools.partial(self.baseline_asyncio, loop, http))  # fmt: skip
            self.stop_subject()

    def scaling(self, seconds: float, backlog: int) -> None:
        """Ingest and delivery with 1 and with 2 processes, one after the other."""
        for n in (1, 2):
            self.start_notifier("ingest", processes=n)
            self.ingest(f"scale_ingest_{n}", f"scaling: POST /v1/events, {n} process(es)",
                        f"notifier --role ingest --processes {n}", "/v1/events", 1,
                        f"bench.scale.ingest.{n}", seconds)  # fmt: skip
            self.stop_subject()
        for n in (1, 2):
            start = functools.partial(self.start_notifier, "workers", processes=n)
            self.drain(f"scale_delivery_{n}", f"scaling: delivery, {n} process(es)",
                       f"notifier --role workers --processes {n}", f"bench.scale.delivery.{n}",
                       backlog, start, ready_first=True)  # fmt: skip
            self.stop_subject()

    def relay(self, limit: int) -> Stage:
        s = self.scratch
        s.execute("CREATE TABLE bench_hold AS SELECT * FROM outbox ORDER BY id LIMIT $1"
                  .replace("$1", str(limit)))  # fmt: skip
        s.execute("DELETE FROM outbox")
        rows = int(s.value("SELECT count(*) FROM bench_hold"))
        s.purge()
        self.start_notifier("relay")
        s.execute("INSERT INTO outbox SELECT * FROM bench_hold")
        stop = self.measure()
        t0 = time.time()
        wait_for(lambda: s.queue_depth() >= rows, max(60.0, rows / 100), "the relay")
        seconds = time.time() - t0
        wait_for(lambda: s.value("SELECT count(*) FROM outbox") == 0, 30,
                 "the outbox to empty", every=0.5)  # fmt: skip
        cpu, window = stop()
        self.stop_subject()
        s.execute("DROP TABLE bench_hold")
        s.purge()
        return self.done(Stage("relay", "relay, outbox → RabbitMQ", "messages", rows, seconds,
                               cpu=cpu, window=window,
                               extra={"server": "notifier --role relay"}))  # fmt: skip

    def end_to_end(self, seconds: float, paced_seconds: float, fraction: float) -> None:
        s = self.scratch
        assert self.sink is not None
        url = f"http://127.0.0.1:{self.port}"
        self.start_notifier("ingest,relay,workers,maintenance")
        # unpaced: the saturation rate, and how delivery fares while ingest is loaded
        base = self.sink.count()
        stop = self.measure()
        t0 = time.time()
        res = self.run_wrk(url, path="/v1/events", batch=1, event_type="bench.e2e",
                           seconds=seconds, connections=16)  # fmt: skip
        t_load = time.time()
        during = self.sink.count() - base
        accepted = int(s.value("SELECT count(*) FROM events WHERE type = 'bench.e2e'"))
        wait_for(lambda: self.sink is not None and self.sink.count() - base >= accepted,
                 max(120.0, accepted / 20), "end-to-end deliveries")  # fmt: skip
        last = self.sink.arrivals(base + accepted - 1, base + accepted)[0]
        cpu, window = stop()
        lat = self.latencies("bench.e2e", base, accepted)
        e2e = self.done(Stage(
            "e2e", "end to end, POST → delivered (unpaced)", "events", accepted, last.at - t0,
            p50_ms=percentile(lat, 50), p95_ms=percentile(lat, 95), p99_ms=percentile(lat, 99),
            cpu=cpu, window=window, extra={
                "server": "notifier, all roles", "accepted_per_s": res.requests / res.seconds,
                "ingest_p99_ms": res.p99_ms, "delivered_during_load": during,
                "delivered_during_load_per_s": during / (t_load - t0),
                "drain_after_load_s": last.at - t_load, "wrk_errors": res.errors,
            },
        ))  # fmt: skip
        self.say(
            f"  while the load lasted: {res.requests / res.seconds:.0f} events/s accepted, "
            f"{during / (t_load - t0):.0f}/s delivered; then {last.at - t_load:.1f} s to drain"
        )
        # paced at a fraction of the saturation rate: ingest→delivered latency
        target = max(1.0, fraction * e2e.rate)
        connections = 16  # wrk waits delay() after each answer: more connections, less drift
        delay_ms = connections * 1000 / target
        base = self.sink.count()
        stop = self.measure()
        t0 = time.time()
        res = self.run_wrk(url, path="/v1/events", batch=1, event_type="bench.paced",
                           seconds=paced_seconds, connections=connections,
                           delay_ms=delay_ms)  # fmt: skip
        accepted = int(s.value("SELECT count(*) FROM events WHERE type = 'bench.paced'"))
        wait_for(lambda: self.sink is not None and self.sink.count() - base >= accepted,
                 120, "paced deliveries")  # fmt: skip
        cpu, window = stop()
        lat = self.latencies("bench.paced", base, accepted)
        self.samples["paced.latency_ms"] = lat
        self.done(Stage(
            "paced", f"end to end, paced at {fraction:.0%} ({target:.0f}/s asked)", "events",
            accepted,
            res.seconds, p50_ms=percentile(lat, 50), p95_ms=percentile(lat, 95),
            p99_ms=percentile(lat, 99), cpu=cpu, window=window,
            extra={"server": "notifier, all roles", "target_per_s": target,
                   "ingest_p50_ms": res.p50_ms, "ingest_p99_ms": res.p99_ms,
                   "wrk_errors": res.errors},
        ))  # fmt: skip
        self.stop_subject()

    def latencies(self, event_type: str, base: int, count: int) -> list[float]:
        """ingest→delivered in ms per delivery: the sink's arrival minus the event's creation."""
        assert self.sink is not None
        created = self.scratch.created_at(event_type)
        return [
            (a.at - created[a.webhook_id]) * 1000
            for a in self.sink.arrivals(base, base + count)
            if a.webhook_id in created
        ]

    def history_stages(self, secs: float, backlog: int, rows: int, days: int,
                       month: tuple[int, int, int]) -> None:  # fmt: skip
        """Ingest (``POST /v1/events``) and delivery on the empty database, then the same with a
        history of ``rows`` deliveries over ``days`` days (bench/history.py), then one day
        dropped against one day deleted, then the simulated month (``month``: days, deliveries
        a day, retention_days; no month when its days are 0)."""
        from notifier.config import RetryConfig

        def stages(when: str) -> None:
            self.start_notifier("ingest")
            self.ingest(f"history_ingest_{when}", f"ingest, POST /v1/events ({when})",
                        "notifier --role ingest", "/v1/events", 1,
                        f"bench.history.ingest.{when}", secs)  # fmt: skip
            self.stop_subject()
            start = functools.partial(self.start_notifier, "workers", wait=False)
            self.drain(f"history_delivery_{when}", f"delivery, queue → webhook ({when})",
                       "notifier --role workers", f"bench.history.delivery.{when}", backlog,
                       start)  # fmt: skip
            self.stop_subject()

        tiers = RetryConfig().tiers_seconds
        stages("empty")
        self.history_result = history.build(self.scratch, rows, days, tiers, self.say)
        stages("history")
        history.retention(self.scratch, self.history_result, self.say)
        month_days, month_rows, month_retention = month
        if month_days:
            self.history_result.month = history.month(month_days, month_rows, month_retention,
                                                      tiers, self.say)  # fmt: skip

    # -- the whole run --

    def run(self) -> None:
        a = self.args
        quick = a.quick
        secs = 4.0 if quick else a.seconds
        backlog = 1000 if quick else a.backlog
        self.sink = Sink(self.procs, self.tmp)
        self.scratch.create(self.sink.url)
        self.say(f"scratch database and vhost {self.scratch.name}; files in {self.tmp}")
        print(report.header(), flush=True)
        if a.scaling:
            self.scaling(secs, backlog)
            return
        if a.delivery:
            self.delivery(["INFO"] if quick or not a.warning_run else ["INFO", "WARNING"], backlog)
            return
        if a.ingest_only:
            self.ingest_stages(secs)
            return
        if a.e2e:
            self.end_to_end(secs, 6.0 if quick else a.paced_seconds, a.paced_fraction)
            return
        if a.tracing:
            before = a.tracing_before or tracing.default_before()
            tracing.run_tracing(self, 3.0 if quick else a.tracing_seconds,
                                1 if quick else a.tracing_rounds,
                                None if before == "none" else before,
                                a.tracing_paced, tracing.known_modes(a.tracing_modes))  # fmt: skip
            return
        if a.history:
            self.history_stages(secs, backlog, a.history_rows, a.history_days,
                                (a.history_month_days, a.history_month_rows,
                                 a.history_month_retention))  # fmt: skip
            return

        self.ingest_stages(secs)

        # relay
        self.relay(2000 if quick else a.relay_rows)

        self.delivery(["INFO"] if quick or not a.warning_run else ["INFO", "WARNING"], backlog)

        # end to end
        self.end_to_end(secs, 6.0 if quick else a.paced_seconds, a.paced_fraction)

        # the same stages with 1 and with 2 processes
        self.scaling(secs, backlog)

        # memory
        if a.memory:
            self.drain("memory", "memory: workers draining 100,000", "notifier --role workers",
                       "bench.memory", 100_000, lambda: self.start_notifier("workers", wait=False),
                       rss_every=1.0, progress_every=10_000)  # fmt: skip
            self.stop_subject()

    def ingest_stages(self, secs: float) -> None:
        """POST /v1/events and /v1/events/batch, then the bare quart-trio app."""
        self.start_notifier("ingest")
        self.ingest("ingest_single", "ingest, POST /v1/events", "notifier --role ingest",
                    "/v1/events", 1, "bench.ingest", secs)  # fmt: skip
        self.ingest("ingest_batch", "ingest, POST /v1/events/batch (100 each)",
                    "notifier --role ingest", "/v1/events/batch", 100, "bench.batch",
                    secs / 2)  # fmt: skip
        self.stop_subject()
        self.baseline_quart()
        self.ingest("quart", "  baseline: quart-trio app, reads the body", "quart-trio",
                    "/v1/events", 1, "bench.quart", secs)  # fmt: skip
        self.stop_subject()
