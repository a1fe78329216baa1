"""The webhook sink (nginx answering 200, its access log the record of arrivals) and the load
generator (wrk with bench/post.lua). Both run as processes of their own, so notifier never
shares its core with the harness's Python."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procs import Processes, children, wait_for

HERE = Path(__file__).resolve().parent
WRK = shutil.which("wrk") or "/usr/bin/wrk"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Arrival:
    at: float  # epoch seconds, from nginx's $msec
    webhook_id: str
    signed: bool


class Sink:
    """nginx on a spare loopback port; ``count()`` reads only the new part of its access log."""

    def __init__(self, procs: Processes, directory: Path) -> None:
        self.dir = directory / "nginx"
        self.dir.mkdir()
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.dir / sub).mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.log = self.dir / "sink.log"
        conf = self.dir / "nginx.conf"
        conf.write_text((HERE / "nginx.conf").read_text().format(dir=self.dir, port=self.port))
        self.proc = procs.start("nginx", [NGINX, "-e", str(self.dir / "nginx-error.log"),
                                          "-p", str(self.dir), "-c", str(conf)])  # fmt: skip
        wait_for(lambda: listening(self.port), 10, "nginx to listen")
        self._lines = 0
        self._offset = 0
        self._partial = b""

    def pids(self) -> list[int]:
        return [self.proc.pid, *children(self.proc.pid)]

    def count(self) -> int:
        """Arrivals logged so far (reads what was appended since the last call)."""
        try:
            with self.log.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return 0
        self._offset += len(data)
        self._lines += data.count(b"\n")
        return self._lines

    def arrivals(self, start: int = 0, stop: int | None = None) -> list[Arrival]:
        """Parsed log lines ``start:stop`` (0-based arrival numbers)."""
        return read_arrivals(self.log, start, stop)


def read_arrivals(path: Path, start: int = 0, stop: int | None = None) -> list[Arrival]:
    """Lines ``start:stop`` of the sink's access log (format ``sink`` in bench/nginx.conf)."""
    out = []
    with path.open() as f:
        for i, line in enumerate(f):
            if i < start:
                continue
            if stop is not None and i >= stop:
                break
            parts = line.split()
            out.append(Arrival(float(parts[0]), parts[1], len(parts) > 3 and parts[3] != "-"))
    return out


@dataclass
class WrkResult:
    requests: int
    seconds: float
    errors: dict[str, int]
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def failed(self) -> int:
        return sum(self.errors.values())


def start_wrk(
    procs: Processes, directory: Path, url: str, *, key: str, path: str, batch: int,
    event_type: str, seconds: float, connections: int, delay_ms: float = 0.0,
    name: str = "wrk", payload: str = "",
) -> tuple[subprocess.Popen[bytes], Path]:  # fmt: skip
    out = directory / f"{name}.json"
    out.unlink(missing_ok=True)
    env = {
        **os.environ,
        "BENCH_KEY": key, "BENCH_PATH": path, "BENCH_BATCH": str(batch),
        "BENCH_TYPE": event_type, "BENCH_OUT": str(out),
        "BENCH_DELAY_MS": f"{delay_ms:.3f}", "BENCH_PAYLOAD": payload,
    }  # fmt: skip
    argv = [WRK, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
            "-s", str(HERE / "post.lua"), url]  # fmt: skip
    return procs.start(name, argv, env), out


def wrk_result(proc: subprocess.Popen[bytes], out: Path, limit: float) -> WrkResult:
    proc.wait(limit)
    if not out.exists():
        raise RuntimeError(f"wrk exited {proc.returncode} without figures")
    data: dict[str, Any] = json.loads(out.read_text())
    lat = data["latency_us"]
    return WrkResult(
        requests=data["requests"], seconds=data["duration_us"] / 1e6, errors=data["errors"],
        p50_ms=lat["p50"] / 1e3, p90_ms=lat["p90"] / 1e3, p99_ms=lat["p99"] / 1e3,
        max_ms=lat["max"] / 1e3,
    )  # fmt: skip
