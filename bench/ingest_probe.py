"""A quick probe of the ingest path: notifier ``--role ingest`` against a bare quart-trio app
(the same framework doing nothing but read the body), both under ``wrk``, in one run.

For each target it prints the request rate, wrk's p50/p99 and the server's CPU-seconds per
1,000 requests (utime + stime from ``/proc/PID/stat``), and the ratio to the baseline. With
``--profile`` it records the notifier process with py-spy under the same load (a separate run,
so the sampling does not weigh on the figures) and prints where the samples fall.

    python bench/ingest_probe.py [--seconds 10] [--connections 16] [--rounds 1] [--keyed]
        [--only single|batch] [--profile single|batch] [--before DIR]

``--before DIR`` also runs the notifier of another source tree (``git archive`` of a commit,
unpacked in DIR) on the same database, measured in the same run: before and after side by side.

Everything runs on 127.0.0.1 against a scratch database and vhost, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from notifier.ingest.tenants import hash_api_key
from notifier.store.pg import SCHEMA_PATH

HERE = Path(__file__).parent
PG = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432")
AMQP = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
NAME = f"notifier_probe_{os.getpid()}"
TICKS = os.sysconf("SC_CLK_TCK")


def pg(sql: str, db: str = "postgres") -> list[Any]:
    async def run() -> list[Any]:
        conn = await asyncpg.connect(f"{PG}/{db}")
        try:
            if sql.lstrip().upper().startswith("SELECT"):
                return list(await conn.fetch(sql))
            await conn.execute(sql)
            return []
        finally:
            await conn.close()

    return asyncio.run(run())


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def transactions() -> int:
    """Transactions committed in the scratch database so far (pg_stat_database: a statement
    outside a transaction counts as one; the stats lag by up to a second, hence the pause)."""
    time.sleep(1)
    return int(pg(f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{NAME}'")[0][0])


def postgres_backends() -> list[int]:
    """The server processes of the connections to the scratch database (the service's pool)."""
    rows = pg(f"SELECT pid FROM pg_stat_activity WHERE datname = '{NAME}'")
    return [r[0] for r in rows]


def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # gone: its CPU is lost from the figure
            total += cpu_seconds(pid)
    return total


def wait_http(url: str, limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wrk(url: str, seconds: int, connections: int, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
         "-s", str(HERE / "ingest_post.lua"), url],
        capture_output=True, text=True, env={**os.environ, **env}, check=True,
        timeout=seconds + 60,
    )  # fmt: skip
    match = re.search(r"^RESULT (.*)$", out.stdout, re.M)
    if not match:
        raise SystemExit(f"wrk said:\n{out.stdout}\n{out.stderr}")
    found = {k: float(v) for k, v in (kv.split("=") for kv in match.group(1).split())}
    if "Non-2xx" in out.stdout:
        found["non2xx"] = float(re.search(r"Non-2xx or 3xx responses: (\d+)", out.stdout)[1])  # type: ignore[index]
    return found


def measure(
    label: str,
    pid: int,
    url: str,
    seconds: int,
    connections: int,
    env: dict[str, str],
    per_request: int = 1,
) -> dict[str, float]:
    wrk(url, 2, connections, env)  # warm-up
    backends = postgres_backends()
    before, commits, pg_before = cpu_seconds(pid), transactions(), cpu_of(backends)
    found = wrk(url, seconds, connections, env)
    cpu = cpu_seconds(pid) - before
    pg_cpu = cpu_of(backends) - pg_before
    items = found["requests"] * per_request
    commits = transactions() - commits
    found["rate"] = items / found["seconds"]
    found["cpu_per_1000"] = cpu / items * 1000
    print(
        f"{label:<36} {found['rate']:8.0f}/s  p50 {found['p50_ms']:7.1f} ms  "
        f"p99 {found['p99_ms']:7.1f} ms  CPU {found['cpu_per_1000']:5.2f} s/1,000"
        f" (Postgres {pg_cpu / items * 1000:5.2f})"
        + (f"  NON-2xx {found['non2xx']:.0f}" if found.get("non2xx") else "")
        + (f"  errors {found['errors']:.0f}" if found.get("errors") else "")
        + (f"  ({found['requests'] / commits:.1f} requests per transaction)" if commits else ""),
        flush=True,
    )
    return found


CATEGORIES = [
    ("trio-asyncio", ("trio_asyncio/",)),
    ("asyncio", ("asyncio/",)),
    ("asyncpg", ("asyncpg/",)),
    ("quart/werkzeug", ("quart/", "quart_trio/", "werkzeug/", "flask/", "blinker/")),
    ("hypercorn/h11", ("hypercorn/", "h11/", "h2/")),
    ("trio", ("trio/", "outcome/", "sniffio/")),
    ("notifier", ("notifier/",)),
    ("msgspec/json", ("msgspec", "json/")),
]


def category(frame: str) -> str:
    for name, marks in CATEGORIES:
        if any(m in frame for m in marks):
            return name
    return "other"


def summarize(raw: Path) -> None:
    """Where the samples are: by the package of the innermost Python frame (self), and the
    notifier functions on the stack (inclusive)."""
    leaf: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        leaf[category(frames[-1])] += count
        for name in {f.split(" (")[0] + " " + f.split("/")[-1].split(":")[0]
                     for f in frames if "notifier/" in f}:  # fmt: skip
            ours[name] += count
    print(f"\npy-spy: {total} samples; self time by package of the innermost frame")
    for name, n in leaf.most_common():
        print(f"  {name:<16} {100 * n / total:5.1f} %")
    print("notifier functions on the stack (inclusive), top 25")
    for name, n in ours.most_common(25):
        print(f"  {100 * n / total:5.1f} %  {name}")


def write_config(path: Path, port: int) -> None:
    path.write_text(f"""
[service]
shutdown_grace_seconds = 5
[database]
url = "{PG}/{NAME}"
pool_max_size = 20
[broker]
url = "{AMQP}/{NAME}"
[ingest]
bind = "127.0.0.1:{port}"
[workers.webhook]
allow_private_networks = true
""")


def start(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    with log.open("ab") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env={**base, **(env or {})}
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def probe(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="notifier-probe-"))
    port = 19080 + os.getpid() % 500
    bare_port = port + 500
    config, log = tmp / "notifier.toml", tmp / "notifier.log"
    write_config(config, port)
    key = f"nk_probe_{uuid.uuid4().hex}"
    tenant = uuid.uuid4()
    pg(f"INSERT INTO tenants (id, name, api_key_hash) VALUES "
       f"('{tenant}', 'probe', '{hash_api_key(key)}')", NAME)  # fmt: skip
    pg("INSERT INTO channels (id, tenant_id, type, config) VALUES "
       f"('{uuid.uuid4()}', '{tenant}', 'webhook', '{{\"url\": \"http://127.0.0.1:9/hook\"}}')",
       NAME)  # fmt: skip
    env = {"API_KEY": key}
    print(f"ingest probe: wrk -t1 -c{args.connections} -d{args.seconds}s, ~1 KB payloads; "
          f"logs in {tmp}", flush=True)  # fmt: skip

    bare = start([sys.executable, str(HERE / "bare_quart.py"), f"127.0.0.1:{bare_port}"],
                 tmp / "bare.log")  # fmt: skip
    run = [sys.executable, "-m", "notifier", "run", "--role", "ingest", "--config"]
    notifier = start([*run, str(config)], log, {"NOTIFIER_LOG_LEVEL": "WARNING"})
    # label, process, base URL of each notifier measured: another source tree's first.
    servers: list[tuple[str, subprocess.Popen[bytes], str]] = []
    if args.before:
        before_config = tmp / "before.toml"
        write_config(before_config, port + 1)
        before = start(
            [*run, str(before_config)], tmp / "before.log",
            {"NOTIFIER_LOG_LEVEL": "WARNING", "PYTHONPATH": str(Path(args.before) / "src")},
        )  # fmt: skip
        servers.append(("before", before, f"http://127.0.0.1:{port + 1}"))
    servers.append(("notifier", notifier, f"http://127.0.0.1:{port}"))
    try:
        wait_http(f"http://127.0.0.1:{bare_port}/")
        for _, _, url in servers:
            wait_http(f"{url}/healthz")
        for _ in range(args.rounds):
            if args.only != "batch":
                b = measure("bare quart-trio, POST body → 202", bare.pid,
                            f"http://127.0.0.1:{bare_port}", args.seconds, args.connections,
                            env)  # fmt: skip
                for label, proc, url in servers:
                    s = measure(f"{label} POST /v1/events", proc.pid, url, args.seconds,
                                args.connections, env)  # fmt: skip
                    if args.keyed:
                        measure(f"{label} POST /v1/events (keyed)", proc.pid, url,
                                args.seconds, args.connections, {**env, "KEYED": "1"})  # fmt: skip
                    print(
                        f"  ratio {label} single/bare: rate {s['rate'] / b['rate']:.2f}, "
                        f"CPU per request {s['cpu_per_1000'] / b['cpu_per_1000']:.2f}",
                        flush=True,
                    )
            if args.only != "single":
                for label, proc, url in servers:
                    measure(f"{label} POST /v1/events/batch (100)", proc.pid, url,
                            args.seconds, max(1, args.connections // 4),
                            {**env, "BATCH": "100"}, per_request=100)  # fmt: skip
            print(flush=True)
        base = f"http://127.0.0.1:{port}"
        if args.profile:
            raw = tmp / "ingest.raw"
            spy = subprocess.Popen(
                [str(Path(sys.executable).with_name("py-spy")), "record", "-r", "100",
                 "-d", str(args.seconds), "--format", "raw", "-o", str(raw),
                 "--pid", str(notifier.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1)
            if args.profile == "batch":
                wrk(base, args.seconds, max(1, args.connections // 4),
                    {**env, "BATCH": "100"})  # fmt: skip
            else:
                wrk(base, args.seconds, args.connections, env)
            spy.wait(60)
            summarize(raw)
            print(f"raw profile: {raw}")
    finally:
        for _, proc, _ in servers:
            stop(proc)
        stop(bare)
    print(f"events stored: {pg('SELECT count(*) FROM events', NAME)[0][0]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--keyed", action="store_true", help="also a run with idempotency keys")
    parser.add_argument(
        "--profile", choices=["single", "batch"], help="py-spy the notifier process under it"
    )
    parser.add_argument("--only", choices=["single", "batch"], help="measure only this route")
    parser.add_argument(
        "--before", metavar="DIR",
        help="also measure the notifier of this source tree (a checkout of another commit)",
    )  # fmt: skip
    args = parser.parse_args()
    pg(f'DROP DATABASE IF EXISTS "{NAME}"')
    pg(f'CREATE DATABASE "{NAME}"')
    rabbitmqctl("add_vhost", NAME)
    rabbitmqctl("set_permissions", "-p", NAME, "guest", ".*", ".*", ".*")
    try:
        pg(SCHEMA_PATH.read_text(), NAME)
        probe(args)
    finally:
        pg(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)')
        rabbitmqctl("delete_vhost", NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
