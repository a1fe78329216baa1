"""The webhook HTTP client on its own: CPU-seconds per 1,000 signed POSTs of a ~1 KB body under
trio, at a fixed concurrency, against an nginx sink in its own process that answers 200.

Every figure is measured in a child process (its own CPU time, read with ``time.process_time``
around the delivery loop only, after a warm-up) and printed as a ratio to the baseline measured
in the same invocation: ``WebhookAdapter.deliver`` of a git revision (``--baseline-rev``, main by
default), whose ``src`` is extracted to a temporary directory. The other rows:

- ``adapter``: ``WebhookAdapter.deliver`` of this checkout (signing, SSRF check, the POST);
- ``httpcore``: a bare ``httpcore.AsyncConnectionPool`` POST of the same signed request (the
  floor of "httpcore's pool used directly", before any SSRF pinning or bounded read);
- ``httpx``: one shared, lean ``httpx.AsyncClient`` (the floor of "httpx configured lean");
- ``h11``: a bare h11 request/response over one kept-alive ``trio.SocketStream`` per task (the
  floor of an h11 client of one's own).

    python bench/webhook_client.py [--deliveries 4000] [--concurrency 16] [--rounds 3]
        [--baseline-rev main] [--only adapter,h11] [--py-spy DIR]

``--py-spy DIR`` also records a profile of each adapter row (100 Hz, raw collapsed stacks) into
DIR. Needs ``nginx`` (``/usr/sbin/nginx``); nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
WARMUP = 200
ROWS = ("adapter", "httpcore", "httpx", "h11")

NGINX_CONF = """
daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_buffer_size 16k;
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 200 "ok\\n"; }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_nginx(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = directory / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=directory, port=port))
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(directory)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("nginx did not start")


def extract_revision(rev: str, directory: Path) -> Path:
    """``rev``'s ``src`` tree, to put first on a child's ``PYTHONPATH``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    directory.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
    return directory / "src"


# -- the child: one row, measured ----------------------------------------------------------------


def messages(url: str, n: int) -> list[Any]:
    from notifier.adapters.webhook import generate_secret
    from notifier.messages import WorkerMessage

    secret = generate_secret()
    payload = {"order": {"id": 42, "note": "x" * 900, "items": [1, 2, 3]}}  # ~1 KB envelope
    return [
        WorkerMessage(
            delivery_id=uuid.uuid4(),
            event_id=uuid.uuid4(),
            tenant_id=uuid.uuid4(),
            channel_id=uuid.uuid4(),
            channel_type="webhook",
            channel_config={"url": url, "secret": secret, "headers": {"X-Team": "billing"}},
            event_type="order.created",
            recipient=None,
            payload=payload,
            created_at=datetime.now(UTC),
            attempt=1,
            max_attempts=5,
        )
        for _ in range(n)
    ]


def signed(message: Any) -> tuple[dict[str, str], bytes]:
    from notifier.adapters.webhook import build_request, signing_secrets

    now = time.time()
    cfg = message.channel_config
    return build_request(message, signing_secrets(cfg, now), cfg["headers"], int(now))


async def run_child(row: str, url: str, total: int, concurrency: int) -> dict[str, float]:
    import trio

    deliver, close = await make_row(row, url)
    batch = messages(url, total + WARMUP)

    async def drain(queue: list[Any]) -> None:
        async def one() -> None:
            while queue:
                await deliver(queue.pop())

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(one)

    await drain(batch[:WARMUP])
    rest = batch[WARMUP:]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await drain(rest)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await close()
    return {"cpu_per_1000": cpu / total * 1000, "rate": total / wall}


async def make_row(
    row: str, url: str
) -> tuple[Callable[[Any], Awaitable[None]], Callable[[], Awaitable[None]]]:
    if row == "adapter":
        from notifier.adapters.webhook import WebhookAdapter

        adapter = WebhookAdapter(timeout_seconds=10, allow_private_networks=True)

        async def deliver(message: Any) -> None:
            receipt = await adapter.deliver(message)
            assert receipt is not None
            assert receipt.status_code == 200, receipt

        return deliver, adapter.aclose
    if row == "httpcore":
        import httpcore

        pool = httpcore.AsyncConnectionPool(max_connections=64, max_keepalive_connections=64)

        async def deliver_core(message: Any) -> None:
            headers, body = signed(message)
            resp = await pool.request("POST", url, headers=list(headers.items()), content=body)
            assert resp.status == 200

        return deliver_core, pool.aclose
    if row == "httpx":
        import httpx

        client = httpx.AsyncClient(
            trust_env=False, follow_redirects=False,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )  # fmt: skip

        async def deliver_x(message: Any) -> None:
            headers, body = signed(message)
            resp = await client.post(url, headers=headers, content=body)
            assert resp.status_code == 200

        return deliver_x, client.aclose
    if row == "h11":
        return bare_h11(url)
    raise SystemExit(f"unknown row {row}")


def bare_h11(url: str) -> tuple[Callable[[Any], Awaitable[None]], Callable[[], Awaitable[None]]]:
    import h11
    import httpx
    import trio

    from notifier.adapters.webhook.ssrf import default_port
    from notifier.adapters.webhook.ssrf import dial_host as host_of

    parsed = httpx.URL(url)
    host, port, target = host_of(parsed), default_port(parsed), parsed.raw_path
    idle: list[tuple[trio.SocketStream, h11.Connection]] = []

    async def deliver(message: Any) -> None:
        headers, body = signed(message)
        if idle:
            stream, conn = idle.pop()
        else:
            stream, conn = await trio.open_tcp_stream(host, port), h11.Connection(h11.CLIENT)
        fields = [("host", parsed.netloc), ("content-length", str(len(body))), *headers.items()]
        out = conn.send(h11.Request(method="POST", target=target, headers=fields))
        await stream.send_all(out + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
        status = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                break
        assert status == 200
        conn.start_next_cycle()
        idle.append((stream, conn))

    async def close() -> None:
        for stream, _ in idle:
            await stream.aclose()

    return deliver, close


# -- the parent: rows in turn, ratios ------------------------------------------------------------


def child_command(row: str, url: str, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable, __file__, "--child", row, "--url", url,
        "--deliveries", str(args.deliveries), "--concurrency", str(args.concurrency),
    ]  # fmt: skip


def run_row(
    row: str, url: str, args: argparse.Namespace, src: Path | None, profile: Path | None = None
) -> dict[str, float]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    command = child_command(row, url, args)
    if profile is not None:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        command = [py_spy, "record", "-r", "100", "-f", "raw", "-o", str(profile), "--", *command]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    line = next(x for x in reversed(out.splitlines()) if x.startswith("{"))  # py-spy talks too
    result: dict[str, float] = json.loads(line)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-rev", default="main")
    parser.add_argument("--only", default=",".join(ROWS))
    parser.add_argument("--py-spy", type=Path, default=None)
    parser.add_argument("--child", default=None)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    if args.child is not None:
        import trio

        result = trio.run(run_child, args.child, args.url, args.deliveries, args.concurrency)
        print(json.dumps(result))
        return

    rows = [r for r in args.only.split(",") if r]
    with tempfile.TemporaryDirectory(prefix="webhook-bench-") as tmp:
        directory = Path(tmp)
        base_src = extract_revision(args.baseline_rev, directory / "base")
        (directory / "nginx").mkdir()
        nginx, port = start_nginx(directory / "nginx")
        url = f"http://127.0.0.1:{port}/hook"
        baseline = f"adapter@{args.baseline_rev}"
        results: dict[str, list[dict[str, float]]] = {baseline: [], **{r: [] for r in rows}}
        try:
            for _ in range(args.rounds):  # interleaved, so drift hits every row alike
                results[baseline].append(run_row("adapter", url, args, base_src))
                for row in rows:
                    results[row].append(run_row(row, url, args, None))
            if args.py_spy is not None:
                args.py_spy.mkdir(parents=True, exist_ok=True)
                run_row("adapter", url, args, base_src, args.py_spy / "adapter-baseline.txt")
                run_row("adapter", url, args, None, args.py_spy / "adapter.txt")
        finally:
            nginx.terminate()
            nginx.wait(timeout=10)
    base_cpu = statistics.median(r["cpu_per_1000"] for r in results[baseline])
    print(
        f"{args.deliveries} signed POSTs of ~1 KB, concurrency {args.concurrency}, trio, "
        f"nginx sink; medians of {args.rounds} rounds"
    )
    print(f"{'row':<22}{'CPU s / 1,000':>15}{'ratio':>9}{'POST/s':>10}")
    for row, runs in results.items():
        cpu = statistics.median(r["cpu_per_1000"] for r in runs)
        rate = statistics.median(r["rate"] for r in runs)
        print(f"{row:<22}{cpu:>15.3f}{cpu / base_cpu:>9.2f}{rate:>10.0f}")


if __name__ == "__main__":
    main()
