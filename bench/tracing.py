"""``--tracing``: what tracing costs, end to end. The same workload as the unpaced end-to-end
stage (every role in one process, wrk posting single events for ``--tracing-seconds``, each
delivered as a signed webhook into nginx) is run, in one invocation, in these modes:

- ``before``: notifier's code from before tracing (``--tracing-before REV``, by default the
  newest commit of this checkout's history without ``[tracing]``, ``default_before``;
  ``git archive`` of its ``src`` into the temporary directory, put first on the notifier
  process's PYTHONPATH), no ``[tracing]``;
- ``off``: this checkout, no ``[tracing]`` (no endpoint: tracing off);
- ``ratio0``: ``[tracing]`` with the OTLP sink's endpoint and ``sample_ratio = 0``: configured,
  recording nothing;
- ``ratio1``: the same with ``sample_ratio = 1.0``: every trace recorded and exported to the
  OTLP sink (bench/otlp_sink.py), a process of its own that counts the spans it receives.

Each run is two stages on the same process: wrk unpaced (the rate: what one process sustains),
then wrk paced at ``--tracing-paced`` events/s (``PACED_RATE``), a pace every mode keeps up with
on a busy machine, so that CPU per event compares the same work done at the same pace (unpaced,
a slower run also batches differently).

The modes run in rounds, in order in the even rounds and in reverse in the odd ones (ABCD DCBA),
so that a drift of the shared machine weighs on each mode alike. Per mode, the rounds are pooled:
events over seconds for the rate, CPU seconds over events for the CPU per 1,000; the ratios are
to ``off`` (and ``off`` to ``before``), with the spread of the same ratio round by round.

Each run's CPU window is the load and the drain (from the first POST to the last webhook), and
then ``SETTLE_SECONDS`` more in every mode, so that the spans of the last events are exported
inside it (the export interval is ``EXPORT_INTERVAL_SECONDS``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.otlp_sink import OtlpSink
from bench.procs import cpu_seconds, wait_for
from bench.report import line as report_line
from bench.stage import Stage, percentile

if TYPE_CHECKING:
    from bench.run import Bench

REPO = Path(__file__).resolve().parent.parent
# the [tracing] section's module: a commit without it is from before tracing
TRACING_MODULE = "src/notifier/config/tracing.py"
MIGRATIONS = "src/notifier/store/migrations"
# (key, what the table says)
MODES = (
    ("before", "before tracing"),
    ("off", "tracing off"),
    ("ratio0", "tracing on, sample_ratio 0"),
    ("ratio1", "tracing on, sample_ratio 1.0"),
)
EXPORT_INTERVAL_SECONDS = 1.0
SETTLE_SECONDS = EXPORT_INTERVAL_SECONDS + 0.5
WARMUP_SECONDS = 3.0
# the paced workload's rate (events/s asked): below what one process sustains on a busy
# two-core machine, so that every mode does the same work at the same pace
PACED_RATE = 150.0
# events of each bench/span_cost.py run
SPAN_COST_EVENTS = 20_000
ROLES = "ingest,relay,workers,maintenance"
# CPU groups of the table (bench/harness.py), and their headings
GROUPS = (
    ("server", "notifier"), ("pg_own", "pg own"), ("rabbitmq", "rabbit"), ("sink", "sink"),
    ("wrk", "wrk"), ("otlp_sink", "otlp"),
)  # fmt: skip
# notifier's CPU with what it makes Postgres and RabbitMQ do: the sum the ratios also give
WITH_SERVICES = ("server", "pg_own", "rabbitmq")
# the stage's own processes: the rest of what the machine ran is other load
OURS = ("server", "pg_own", "pg_server", "rabbitmq", "sink", "wrk", "otlp_sink", "bench")


def tracing_section(mode: str, endpoint: str) -> str:
    """The ``[tracing]`` section of a mode's config ("" for the modes without one)."""
    if mode not in ("ratio0", "ratio1"):
        return ""
    ratio = "0.0" if mode == "ratio0" else "1.0"
    return (
        f'[tracing]\notlp_endpoint = "{endpoint}"\nservice_name = "notifier-bench"\n'
        f"sample_ratio = {ratio}\nexport_interval_seconds = {EXPORT_INTERVAL_SECONDS}\n"
        f"export_timeout_seconds = 5.0\n"
    )


def order(modes: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """(round, mode) in the order they run: the modes in order, then reversed, and so on."""
    out = []
    for r in range(rounds):
        out += [(r, m) for m in (modes if r % 2 == 0 else list(reversed(modes)))]
    return out


# -- the code from before tracing --


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    return done.stdout.strip()


def default_before() -> str | None:
    """The newest commit (by commit date) in this checkout's history whose tree has no
    ``[tracing]`` module: the code the tracing work started from or, once the branch took in a
    newer main, that main, so that *before* differs from *off* by tracing alone as far as
    history allows. None when every commit has it, or this is not a git checkout."""
    try:
        commits = _git("rev-list", "--date-order", "HEAD").split()
        found = subprocess.run(
            ["git", "-C", str(REPO), "cat-file", "--batch-check"], check=True, text=True,
            input="".join(f"{c}:{TRACING_MODULE}\n" for c in commits), capture_output=True,
            timeout=120,
        ).stdout.splitlines()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    # one line per commit, in order: "<sha> blob <size>", or "<commit>:<path> missing"
    return next((c for c, line in zip(commits, found, strict=True) if line.endswith("missing")),
                None)  # fmt: skip


def checkout(rev: str, into: Path) -> tuple[Path, str]:
    """``src`` of ``rev`` extracted under ``into`` (``git archive``), with the migrations and
    schema.sql its package links to: the directory to put on PYTHONPATH, and the commit's short
    hash."""
    into.mkdir(parents=True)
    commit = _git("rev-parse", "--short", f"{rev}^{{commit}}")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src", "migrations",
                              "schema.sql"], check=True,
                             capture_output=True, timeout=120).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=120)
    return into / "src", commit


def migrations(src: Path) -> list[str]:
    return sorted(p.name for p in (src / "notifier/store/migrations").glob("*.sql"))


# -- the runs --


def known_modes(text: str) -> list[str]:
    """The modes of a comma-separated list, in ``MODES``'s order; empty when one is unknown
    or none is given."""
    asked = {m.strip() for m in text.split(",") if m.strip()}
    known = [m for m, _ in MODES if m in asked]
    return known if len(known) == len(asked) else []


def before_code(bench: Bench, before: str | None) -> str | None:
    """The code from before tracing (``checkout`` of ``before``) for the notifier process's
    PYTHONPATH; None, saying why, when there is none or it would not run on the scratch
    database."""
    if before is None:
        bench.say("tracing: no code from before tracing to compare with (--tracing-before)")
        return None
    src, commit = checkout(before, bench.tmp / "before")
    theirs = migrations(src)
    if migrations(REPO / "src")[: len(theirs)] != theirs:
        bench.say(
            f"tracing: {before} ({commit}) has migrations this checkout does not: its code "
            f"would not run on the scratch database; no 'before' runs"
        )
        return None
    # the scratch database has this checkout's schema: newer migrations only add, and
    # notifier runs on a schema ahead of its own (with a warning), as in a rolling update
    bench.say(
        f"tracing: 'before' runs the code of {commit} ({before}), on this checkout's schema "
        f"({len(theirs)} of its migrations known to it)"
    )
    return str(src)


def run_tracing(bench: Bench, seconds: float, rounds: int, before: str | None,
                paced: float = PACED_RATE, modes: Sequence[str] = ()) -> None:  # fmt: skip
    """Every mode of ``modes`` (all when empty) ``rounds`` times (``order``): each run unpaced
    (a stage keyed ``tracing_MODE_ROUND``), then paced at ``paced`` events/s
    (``tracing_paced_MODE_ROUND``; none when it is 0); then the spans alone (``span_costs``)
    when a tracing mode was asked."""
    chosen = list(modes) or [m for m, _ in MODES]
    pythonpath: str | None = None
    if "before" in chosen and (pythonpath := before_code(bench, before)) is None:
        chosen.remove("before")
    bench.otlp = OtlpSink(bench.procs)
    # a first run that is not counted: the first after the database and the vhost are made is
    # slower (caches, plans, the queue's first segments), whatever its mode
    run_one(bench, "ratio1", -1, min(seconds, WARMUP_SECONDS), 0.0, None)
    for r, mode in order(chosen, rounds):
        run_one(bench, mode, r, seconds, paced, pythonpath if mode == "before" else None)
    if {"ratio0", "ratio1"} & set(chosen):
        bench.span_costs = span_costs(bench, SPAN_COST_EVENTS if rounds > 1 else 2000, 2)


def span_costs(bench: Bench, events: int, rounds: int) -> list[dict[str, Any]]:
    """``bench/span_cost.py`` for each mode but ``before`` (tracing off: the floor), ``rounds``
    times in ``order``: its own CPU, the OTLP sink's, and the spans the sink received."""
    otlp = bench.otlp
    assert otlp is not None
    out = []
    for r, mode in order(["off", "ratio0", "ratio1"], rounds):
        argv = [sys.executable, "-m", "bench.span_cost", "--events", str(events)]
        if mode != "off":
            argv += ["--endpoint", otlp.endpoint, "--ratio", "0" if mode == "ratio0" else "1",
                     "--interval", str(EXPORT_INTERVAL_SECONDS)]  # fmt: skip
        env = {**os.environ, "OTEL_BSP_MAX_QUEUE_SIZE": str(4 * (events + 1))}
        stats0, sink0 = otlp.stats(), cpu_seconds(otlp.proc.pid)
        done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        stats1, sink1 = otlp.stats(), cpu_seconds(otlp.proc.pid)
        found = json.loads(done.stdout.strip().splitlines()[-1])
        found.update(mode=mode, round=r, spans=stats1["spans"] - stats0["spans"],
                     otlp_cpu_seconds=sink1 - sink0)  # fmt: skip
        bench.say(
            f"  span cost, {dict(MODES)[mode]} (round {r + 1}): {events} events, "
            f"{found['cpu_seconds'] / events * 1e6:.1f} µs of CPU each, "
            f"{found['spans']} spans received"
        )
        out.append(found)
    return out


def run_one(bench: Bench, mode: str, r: int, seconds: float, paced: float,
            pythonpath: str | None) -> None:  # fmt: skip
    """One run of a mode: notifier with every role; wrk unpaced for ``seconds``, then (unless
    ``paced`` is 0) paced at ``paced`` events/s for as long; each until every accepted event is
    delivered and then ``SETTLE_SECONDS``. Round -1 is the warm-up: printed, not kept."""
    assert bench.otlp is not None
    bench.start_notifier(ROLES, tag=mode, config_extra=tracing_section(mode, bench.otlp.endpoint),
                         pythonpath=pythonpath)  # fmt: skip
    stages = [segment(bench, mode, r, seconds, 0.0)]
    if paced > 0:
        stages.append(segment(bench, mode, r, seconds, paced))
    before = bench.otlp.stats()
    bench.stop_subject()
    # what the shutdown flushed: the last segment's spans
    after, last = bench.otlp.stats(), stages[-1].extra
    last["spans"] += after["spans"] - before["spans"]
    for name, n in after["names"].items():
        if n > (was := before["names"].get(name, 0)):
            last["span_names"][name] = last["span_names"].get(name, 0) + n - was
    for stage in stages:
        if r < 0:
            print(report_line(stage), flush=True)
        else:
            bench.done(stage)


def segment(bench: Bench, mode: str, r: int, seconds: float, rate: float) -> Stage:
    """wrk for ``seconds`` (unpaced, or paced at ``rate`` events/s), until every accepted event
    is delivered, then ``SETTLE_SECONDS``: a stage."""
    s, sink, otlp = bench.scratch, bench.sink, bench.otlp
    assert sink is not None
    assert otlp is not None
    workload = "paced" if rate > 0 else "unpaced"
    what = dict(MODES)[mode] + (f", paced at {rate:.0f}/s" if rate > 0 else "")
    event_type = f"bench.tracing.{workload}.{mode}.{r}"
    connections = 16  # wrk waits delay() after each answer: 16 connections, little drift
    base = sink.count()
    spans0 = otlp.stats()
    stop = bench.measure()
    t0 = time.time()
    res = bench.run_wrk(f"http://127.0.0.1:{bench.port}", path="/v1/events", batch=1,
                        event_type=event_type, seconds=seconds, connections=connections,
                        delay_ms=connections * 1000 / rate if rate > 0 else 0.0)  # fmt: skip
    accepted = int(s.value("SELECT count(*) FROM events WHERE type = $1", event_type))
    wait_for(lambda: sink.count() - base >= accepted, max(120.0, accepted / 20),
             f"{what}: the deliveries")  # fmt: skip
    last = sink.arrivals(base + accepted - 1, base + accepted)[0]
    time.sleep(SETTLE_SECONDS)  # the last spans' export, inside the window in every mode
    cpu, window = stop()
    spans1 = otlp.stats()
    lat = bench.latencies(event_type, base, accepted)
    names = {k: v - spans0["names"].get(k, 0) for k, v in spans1["names"].items()}
    return Stage(
        f"tracing_{'paced_' if rate > 0 else ''}{mode}_{r}",
        f"{what} (round {r + 1})" if r >= 0 else f"warm-up: {what}", "events", accepted,
        last.at - t0, p50_ms=percentile(lat, 50) if lat else None,
        p95_ms=percentile(lat, 95) if lat else None, p99_ms=percentile(lat, 99) if lat else None,
        cpu=cpu, window=window,
        extra={
            "server": "notifier, all roles", "mode": mode, "round": r, "workload": workload,
            "target_per_s": rate or None, "accepted_per_s": res.requests / res.seconds,
            "ingest_p99_ms": res.p99_ms, "wrk_errors": res.errors,
            "spans": spans1["spans"] - spans0["spans"],
            "span_names": {k: v for k, v in names.items() if v},
            "otlp_requests": spans1["requests"] - spans0["requests"],
            "otlp_bytes": spans1["bytes"] - spans0["bytes"],
            "otlp_refused": spans1["refused"] - spans0["refused"],
        },
    )  # fmt: skip


# -- the arithmetic and the report --


def pooled(stages: Iterable[Stage]) -> dict[str, Any] | None:
    """One mode's runs together: events, seconds, the rate (events over seconds), CPU seconds
    and CPU per 1,000 events per group, spans and spans per event; None without runs."""
    runs = list(stages)
    if not runs:
        return None
    items = sum(s.items for s in runs)
    secs = sum(s.seconds for s in runs)
    cpu: dict[str, float] = {}
    for s in runs:
        for group, value in s.cpu.items():
            cpu[group] = cpu.get(group, 0.0) + value
    spans = sum(int(s.extra.get("spans", 0)) for s in runs)
    names: dict[str, int] = {}
    for s in runs:
        for name, n in (s.extra.get("span_names") or {}).items():
            names[name] = names.get(name, 0) + int(n)
    per = {g: v / items * 1000 if items else 0.0 for g, v in cpu.items()}
    windows = [s.window for s in runs if s.window is not None and s.window.seconds > 0]
    wall = sum(w.seconds for w in windows)
    other = sum(w.machine_cpu for w in windows) - sum(
        s.cpu.get(g, 0.0) for s in runs if s.window is not None and s.window.seconds > 0
        for g in OURS
    )  # fmt: skip
    return {
        "runs": len(runs), "events": items, "seconds": secs,
        "rate": items / secs if secs > 0 else 0.0, "cpu": cpu, "cpu_per_1000": per,
        "cpu_per_1000_with_services": sum(per.get(g, 0.0) for g in WITH_SERVICES),
        "spans": spans, "spans_per_event": spans / items if items else 0.0,
        "span_names_per_event": {k: v / items for k, v in sorted(names.items())} if items else {},
        "p50_ms": _mean(s.p50_ms for s in runs), "p99_ms": _mean(s.p99_ms for s in runs),
        # cores the rest of the machine kept busy meanwhile (other users): the contention
        "other_cores": max(0.0, other) / wall if wall > 0 else None,
    }  # fmt: skip


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def ratio(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """``a`` over ``b``: the rate, notifier's CPU per event, and that with its Postgres backends
    and RabbitMQ (0.0 where ``b``'s figure is 0)."""

    def over(x: float, y: float) -> float:
        return x / y if y else 0.0

    return {
        "rate": over(a["rate"], b["rate"]),
        "cpu_per_item": over(a["cpu_per_1000"].get("server", 0.0),
                             b["cpu_per_1000"].get("server", 0.0)),
        "cpu_per_item_with_services": over(a["cpu_per_1000_with_services"],
                                           b["cpu_per_1000_with_services"]),
    }  # fmt: skip


# (mode, what it is compared with)
COMPARED = (("off", "before"), ("ratio0", "off"), ("ratio1", "off"))


WORKLOADS = ("unpaced", "paced")


def values(stages: Sequence[Stage]) -> dict[str, Any]:
    """The JSON's ``tracing``: per workload (``WORKLOADS``) that has runs, ``_values`` of them."""
    runs = [s for s in stages if s.key.startswith("tracing_") and "mode" in s.extra]
    by = {w: [s for s in runs if s.extra.get("workload", "unpaced") == w] for w in WORKLOADS}
    return {w: _values(found) for w, found in by.items() if found}


def _values(runs: Sequence[Stage]) -> dict[str, Any]:
    """Per mode the pooled figures, the ratios of ``COMPARED`` pooled, and the same ratios
    round by round (each round's runs against each other)."""
    modes = {m: p for m, _ in MODES if (p := pooled(s for s in runs if s.extra["mode"] == m))}
    ratios: dict[str, Any] = {}
    for mode, base in COMPARED:
        if mode not in modes or base not in modes:
            continue
        by_round = []
        for r in sorted({s.extra["round"] for s in runs}):
            a = pooled(s for s in runs if s.extra["mode"] == mode and s.extra["round"] == r)
            b = pooled(s for s in runs if s.extra["mode"] == base and s.extra["round"] == r)
            if a is not None and b is not None:
                by_round.append(ratio(a, b))
        ratios[f"{mode}/{base}"] = {"pooled": ratio(modes[mode], modes[base]),
                                    "rounds": by_round}  # fmt: skip
    return {"modes": modes, "ratios": ratios}


def _cores(value: float | None) -> str:
    return f"{value:.2f} cores" if value is not None else "?"


def _spread(rounds: list[dict[str, float]], key: str) -> str:
    if len(rounds) < 2:
        return ""
    low, high = min(r[key] for r in rounds), max(r[key] for r in rounds)
    return f" [{low:.2f}-{high:.2f}]"


def span_cost_values(costs: Sequence[dict[str, Any]],
                     stages: Sequence[Stage] = ()) -> dict[str, Any]:  # fmt: skip
    """bench/span_cost.py's runs pooled per mode: µs of CPU per event (its process's, and the
    OTLP sink's), spans received per event, and what a mode costs over tracing off (the loop
    alone) in µs per event; with ``stages``, that cost as a share of notifier's CPU per event
    end to end with tracing off (unpaced, pooled)."""
    out: dict[str, Any] = {}
    for mode in ("off", "ratio0", "ratio1"):
        runs = [c for c in costs if c["mode"] == mode]
        events = sum(int(c["events"]) for c in runs)
        if not events:
            continue
        out[mode] = {
            "runs": len(runs), "events": events,
            "cpu_us_per_event": sum(c["cpu_seconds"] for c in runs) / events * 1e6,
            "otlp_cpu_us_per_event": sum(c["otlp_cpu_seconds"] for c in runs) / events * 1e6,
            "spans_per_event": sum(int(c["spans"]) for c in runs) / events,
        }  # fmt: skip
    e2e = values(stages).get("unpaced", {}).get("modes", {}).get("off")
    per_event_us = e2e["cpu_per_1000"].get("server", 0.0) * 1000 if e2e else 0.0
    if (off := out.get("off")) is not None:
        for mode in ("ratio0", "ratio1"):
            if (m := out.get(mode)) is not None:
                m["over_off_us"] = m["cpu_us_per_event"] - off["cpu_us_per_event"]
                m["share_of_e2e"] = m["over_off_us"] / per_event_us if per_event_us else None
    return out


def report(stages: Sequence[Stage], costs: Sequence[dict[str, Any]] = ()) -> str:
    out = []
    for workload, v in values(stages).items():
        rate = next((s.extra.get("target_per_s") for s in stages
                     if s.extra.get("workload") == workload), None)  # fmt: skip
        how = f"paced at {rate:.0f} events/s" if workload == "paced" and rate else "unpaced"
        out.append(_report(v, how))
    if found := span_cost_values(costs, stages):
        out += ["", "the spans alone (bench/span_cost.py: an event's three spans in a loop, "
                    "exported to the OTLP sink), runs pooled:"]  # fmt: skip
        for mode, p in found.items():
            line = (
                f"  {dict(MODES)[mode]:<30} {p['events']:>7} events: {p['cpu_us_per_event']:7.1f} "
                f"µs of CPU per event, the OTLP sink {p['otlp_cpu_us_per_event']:6.1f} µs, "
                f"{p['spans_per_event']:.2f} spans received per event"
            )
            if "over_off_us" in p:
                line += f"; over off {p['over_off_us']:+.1f} µs"
                if p["share_of_e2e"] is not None:
                    line += f" = {p['share_of_e2e']:.1%} of notifier's CPU per event end to end"
            out.append(line)
    return "\n".join(out)


def _report(v: dict[str, Any], how: str) -> str:
    heads = " ".join(f"{h:>8}" for _, h in GROUPS)
    lines = [
        "",
        f"tracing, end to end (every role in one process), wrk {how}; the rounds of each mode "
        "pooled:",
        f"  {'':<30} {'runs':>4} {'events':>7} {'per s':>7} {'p50 ms':>7} {'p99 ms':>7} | "
        f"CPU s / 1,000: {heads} {'n+pg+mq':>8} | spans/event | other load",
    ]
    for mode, what in MODES:
        if (p := v["modes"].get(mode)) is None:
            continue
        cells = " ".join(f"{p['cpu_per_1000'].get(g, 0.0):8.3f}" for g, _ in GROUPS)
        lat = " ".join(f"{x:7.0f}" if x is not None else f"{'':7}"
                       for x in (p["p50_ms"], p["p99_ms"]))  # fmt: skip
        lines.append(
            f"  {what:<30} {p['runs']:>4} {p['events']:>7} {p['rate']:7.0f} {lat} | "
            f"{'':15}{cells} {p['cpu_per_1000_with_services']:8.3f} | "
            f"{p['spans_per_event']:11.2f} | {_cores(p['other_cores'])}"
        )
    lines += ["", f"ratios, {how}, same run (pooled; [lowest-highest] of the rounds):"]
    names = dict(MODES)
    for key, r in v["ratios"].items():
        mode, base = key.split("/")
        p, rounds = r["pooled"], r["rounds"]
        with_services = _spread(rounds, "cpu_per_item_with_services")
        lines.append(
            f"  {names[mode] + ' / ' + names[base]:<58} rate {p['rate']:5.3f}x"
            f"{_spread(rounds, 'rate')}   notifier CPU per event {p['cpu_per_item']:5.3f}x"
            f"{_spread(rounds, 'cpu_per_item')}   with pg+rabbitmq "
            f"{p['cpu_per_item_with_services']:5.3f}x{with_services}"
        )
    if (on := v["modes"].get("ratio1")) and on["span_names_per_event"]:
        parts = ", ".join(f"{name} {n:.2f}" for name, n in on["span_names_per_event"].items())
        lines.append(f"  spans per event at sample_ratio 1.0: {parts}")
    return "\n".join(lines)
