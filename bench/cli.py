"""``python -m bench``'s command line: parses the options, runs the stages (bench/run.py) or
the soak (bench/soak.py), and prints and writes the report (bench/report.py)."""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench import history, report, run, tracing
from bench.soak import soak


def main() -> int:
    title = run.__doc__.splitlines()[0] if run.__doc__ else None
    parser = argparse.ArgumentParser(description=title)
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke test")
    parser.add_argument("--seconds", type=float, default=15.0, help="wrk duration per stage")
    parser.add_argument("--backlog", type=int, default=10_000, help="deliveries per drain")
    parser.add_argument("--relay-rows", type=int, default=20_000)
    parser.add_argument("--paced-seconds", type=float, default=20.0)
    parser.add_argument("--paced-fraction", type=float, default=0.5)
    parser.add_argument("--no-warning-run", dest="warning_run", action="store_false",
                        help="skip the delivery stage at log level WARNING")  # fmt: skip
    parser.add_argument("--scaling", action="store_true",
                        help="only the scaling stages: 1 and 2 processes")  # fmt: skip
    parser.add_argument("--delivery", action="store_true",
                        help="only the delivery stages: the workers and the baselines")  # fmt: skip
    parser.add_argument("--ingest", dest="ingest_only", action="store_true",
                        help="only the ingest stages and the bare quart-trio baseline")  # fmt: skip
    parser.add_argument("--e2e", action="store_true",
                        help="only the end-to-end stages: unpaced, then paced")  # fmt: skip
    parser.add_argument("--memory", action="store_true",
                        help="also drain 100,000 deliveries sampling the workers' RSS")  # fmt: skip
    parser.add_argument("--soak", type=int, nargs="?", const=500_000, default=0, metavar="N",
                        help="only the soak: deliver N (default 500,000), print RSS")  # fmt: skip
    parser.add_argument("--trace", action="store_true",
                        help="with --soak: tracemalloc and gc counts in the workers")  # fmt: skip
    parser.add_argument("--trace-every", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--trace-frames", type=int, default=1, metavar="N",
                        help="frames kept per allocation (more: slower)")  # fmt: skip
    parser.add_argument("--history", action="store_true",
                        help="only ingest and delivery with a large history against the empty "
                             "database, one day dropped against one deleted, and a simulated "
                             "month with retention on")  # fmt: skip
    parser.add_argument("--history-rows", type=int, default=10_000_000, metavar="N",
                        help="with --history: deliveries in it (default 10,000,000)")  # fmt: skip
    parser.add_argument("--history-days", type=int, default=30, metavar="DAYS",
                        help="with --history: days the history spans (default 30)")  # fmt: skip
    parser.add_argument("--history-month-days", type=int, default=history.MONTH_DAYS,
                        metavar="DAYS",
                        help="with --history: days of the simulated month with retention on "
                             f"(default {history.MONTH_DAYS}; 0: no month)")  # fmt: skip
    parser.add_argument("--history-month-rows", type=int, default=history.MONTH_ROWS,
                        metavar="N",
                        help="with --history: deliveries a simulated day "
                             f"(default {history.MONTH_ROWS:,})")  # fmt: skip
    parser.add_argument("--history-month-retention", type=int, default=history.MONTH_RETENTION,
                        metavar="DAYS",
                        help="with --history: the month's retention_days "
                             f"(default {history.MONTH_RETENTION})")  # fmt: skip
    parser.add_argument("--tracing", action="store_true",
                        help="only what tracing costs: end to end before tracing, with it off, "
                             "on at sample_ratio 0 and at 1.0 (an OTLP sink)")  # fmt: skip
    parser.add_argument("--tracing-seconds", type=float, default=6.0, metavar="SECONDS",
                        help="with --tracing: wrk duration per run (default 6)")  # fmt: skip
    parser.add_argument("--tracing-rounds", type=int, default=3, metavar="N",
                        help="with --tracing: runs of each mode, interleaved "
                             "(default 3)")  # fmt: skip
    parser.add_argument("--tracing-paced", type=float, default=tracing.PACED_RATE,
                        metavar="EVENTS_PER_S",
                        help="with --tracing: each run's paced part, events/s asked "
                             f"(default {tracing.PACED_RATE:.0f}; 0: none)")  # fmt: skip
    parser.add_argument("--tracing-modes", default=",".join(m for m, _ in tracing.MODES),
                        metavar="M,M",
                        help="with --tracing: the modes run, of "
                             f"{','.join(m for m, _ in tracing.MODES)} (default: all)")  # fmt: skip
    parser.add_argument("--tracing-before", metavar="REV",
                        help="with --tracing: the code from before tracing (default: the "
                             "newest commit of the history without [tracing]; 'none': no "
                             "such runs)")  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="FILE")
    parser.add_argument("--chart", type=Path, metavar="FILE.png")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    if args.tracing and (args.tracing_rounds < 1 or args.tracing_seconds < 1
                         or args.tracing_paced < 0
                         or not tracing.known_modes(args.tracing_modes)):  # fmt: skip
        parser.error("--tracing needs a round and a second of load at least, a pace of 0 "
                     "events/s or more, and modes of "
                     f"{','.join(m for m, _ in tracing.MODES)}")  # fmt: skip
    if args.history:
        if args.history_days < 2 or args.history_rows < args.history_days:
            parser.error("--history needs 2 days or more and a delivery a day at least")
        if args.history_month_days and not (
            0 < args.history_month_retention < args.history_month_days
            and args.history_month_rows > 0
        ):
            parser.error("the month needs more days than its retention_days (1 or more) and "
                         "a delivery a day at least")  # fmt: skip
    for tool in ("wrk", "nginx"):
        if not (shutil.which(tool) or Path(f"/usr/sbin/{tool}").exists()):
            print(f"bench: {tool} is missing (apt-get install -y wrk nginx-light)", file=sys.stderr)
            return 2
    # a SIGTERM unwinds like Ctrl-C: the processes started here are killed and the scratch
    # database and vhost dropped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    tmp = Path(tempfile.mkdtemp(prefix="notifier-bench-"))
    bench = run.Bench(args, tmp)
    started = time.time()
    try:
        if args.soak:
            soak(bench, args.soak, trace=args.trace, trace_every=args.trace_every,
                 trace_frames=args.trace_frames)  # fmt: skip
        else:
            bench.run()
    finally:
        bench.close()
    elapsed = time.time() - started
    by = {s.key: s for s in bench.stages}
    compared = (("ingest", "ingest, POST /v1/events"), ("delivery", "delivery"))
    pairs = [(key, what, by.get(f"history_{key}_empty"), by.get(f"history_{key}_history"))
             for key, what in compared]  # fmt: skip
    if args.history:
        print(history.ratio_lines([(what, e, h) for _, what, e, h in pairs]), flush=True)
        if bench.history_result is not None:
            print(history.report(bench.history_result), flush=True)
    elif args.tracing:
        print(tracing.report(bench.stages, bench.span_costs or []), flush=True)
    elif not args.soak:
        print(report.ratios(bench.stages), flush=True)
        print(report.scaling(bench.stages), flush=True)
        print(report.memory(bench.stages), flush=True)
    print(f"\n{report.machine()}; run took {elapsed:.0f} s", flush=True)
    result = {
        "machine": report.machine_info(), "started": started, "seconds": elapsed,
        "argv": sys.argv[1:], "python": platform.python_version(),
        "stages": [s.as_dict() for s in bench.stages],
        "ratios": report.ratio_values(bench.stages), "scaling": report.scaling_values(bench.stages),
        "samples": bench.samples, "tracing": tracing.values(bench.stages),
        "span_cost": tracing.span_cost_values(bench.span_costs or [], bench.stages),
        "history": bench.history_result.as_dict() if bench.history_result is not None else None,
        "history_ratios": {key: history.stage_ratio(e, h) for key, _, e, h in pairs
                           if e is not None and h is not None},
    }  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.chart:
        (history.chart if args.history else report.chart)(result, args.chart)
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0
