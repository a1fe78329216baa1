"""``python -m bench.filters``: what payload filters cost at fan-out (README "Payload filters").

notifier runs as ``--role ingest`` (a process of its own) on a scratch database whose tenant has
20 enabled webhook channels; wrk (another process) posts batches of events to
``POST /v1/events/batch``, every event fanning out to all 20 channels. Two setups of the same 20
channels take turns, a round of each at a time so that the machine's drift hits both alike:

- ``plain``: no channel has a filter;
- ``largest``: every channel has ``notifier.filters_spec.largest_filter()`` (the limits at once:
  20 conditions, 8 levels, 16-step paths, as many ``nin`` values as 4,096 bytes hold), which
  every event passes only after every condition was evaluated in full: both setups write the
  same 20 deliveries and outbox rows an event.

Every event carries the same payload of about 1 KB (the filter's path and a filler text).
Printed, per setup over all its rounds: events per second, and CPU seconds per 1,000 events of
notifier (``server``) and of the scratch database's Postgres backends (``pg own``, where the
filters are evaluated); then the ratios largest / plain.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path

from bench.harness import Harness
from bench.procs import wait_for
from bench.sink import free_port, listening
from notifier import filters, filters_spec
from notifier.adapters.webhook.signing import generate_secret

CHANNELS = 20
GROUPS = ("server", "pg_own")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=8.0, help="wrk's duration per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each setup")
    parser.add_argument("--batch", type=int, default=10, help="events per request")
    parser.add_argument("--connections", type=int, default=8, help="wrk's connections")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    tmp = Path(tempfile.mkdtemp(prefix="notifier-bench-filters-"))
    h = Harness(args, tmp)
    try:
        return run(h, args)
    finally:
        h.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def run(h: Harness, args: argparse.Namespace) -> int:
    s = h.scratch
    # nothing is delivered (the ingest role only writes), so the URL is never called
    sink_url = f"http://127.0.0.1:{free_port()}/hook"
    s.create(sink_url, broker=False)
    s.execute("DELETE FROM channels")
    config = json.dumps({"url": sink_url, "secret": generate_secret(), "headers": {}})
    for i in range(CHANNELS):
        s.execute(
            "INSERT INTO channels (id, tenant_id, type, name, config) "
            "VALUES ($1, $2, 'webhook', $3, $4::jsonb)",
            uuid.uuid4(), s.tenant, f"channel-{i}", config,
        )  # fmt: skip
    largest, passing = filters_spec.largest_filter()
    payload = {**passing, "note": "x" * 900}  # about 1 KB, as the other stages' payloads
    setups = {
        "plain": ("UPDATE channels SET filter = NULL, filter_path = NULL", ()),
        "largest": (
            "UPDATE channels SET filter = $1::jsonb, filter_path = $2::jsonpath",
            (json.dumps(largest), filters.to_jsonpath(largest)),
        ),
    }
    h.start_notifier("ingest", level="WARNING", wait=False)
    url = f"http://127.0.0.1:{h.port}"
    wait_for(lambda: listening(h.port), 60, "notifier's ingest to listen")
    totals = {name: {"events": 0, "seconds": 0.0, **dict.fromkeys(GROUPS, 0.0)} for name in setups}
    body = json.dumps(payload, separators=(",", ":"))
    h.say(f"{CHANNELS} channels; largest filter: {len(json.dumps(largest, separators=(',', ':')))}"
          f" bytes of JSON, {len(filters.to_jsonpath(largest))} characters of jsonpath; "
          f"payload {len(body)} bytes; {args.batch} events a request, "
          f"{args.connections} connections")  # fmt: skip
    for round_ in range(args.rounds + 1):  # round 0 warms both up and is not counted
        for name, (sql, params) in setups.items():
            s.execute(sql, *params)
            stop = h.measure()
            result = h.run_wrk(
                url, path="/v1/events/batch", batch=args.batch, event_type="bench.filters",
                seconds=args.seconds if round_ else 2, connections=args.connections,
                payload=body,
            )  # fmt: skip
            spent, window = stop()
            if result.failed:
                raise RuntimeError(f"{name}: {result.failed} requests failed: {result.errors}")
            if not round_:
                continue
            t = totals[name]
            t["events"] += result.requests * args.batch
            t["seconds"] += window.seconds
            for group in GROUPS:
                t[group] += spent[group]
            h.say(f"round {round_} {name:<8} {result.requests * args.batch / window.seconds:8.0f}"
                  " events/s")  # fmt: skip
    wrong = s.value(
        "SELECT count(*) FROM events e WHERE (SELECT count(*) FROM deliveries d "
        "WHERE d.event_id = e.id AND d.created_at = e.created_at) <> $1", CHANNELS,
    )  # fmt: skip
    if wrong:
        raise RuntimeError(f"{wrong} events did not fan out to all {CHANNELS} channels")
    h.say("")
    h.say(f"{'setup':<8} {'events/s':>9} {'server s/1k':>12} {'pg own s/1k':>12} {'both':>8}")
    figures: dict[str, tuple[float, float, float]] = {}
    for name, t in totals.items():
        rate = t["events"] / t["seconds"]
        server, pg = (t[g] / t["events"] * 1000 for g in GROUPS)
        figures[name] = (rate, server, pg)
        h.say(f"{name:<8} {rate:9.0f} {server:12.3f} {pg:12.3f} {server + pg:8.3f}")
    (rate_p, server_p, pg_p), (rate_l, server_l, pg_l) = figures["plain"], figures["largest"]
    cpu = (server_l + pg_l) / (server_p + pg_p)
    h.say(f"largest / plain: rate {rate_l / rate_p:.2f}x, CPU per event {cpu:.2f}x "
          f"(notifier {server_l / server_p:.2f}x, Postgres {pg_l / pg_p:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
