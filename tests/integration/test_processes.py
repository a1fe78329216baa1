"""``notifier run --processes N``: a parent supervising N processes, as real processes against
the test's own database and vhost (the launch only ever signalled or killed by PID)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from notifier.launch import RestartPolicy
from tests.chaos.harness import ServiceProcess, base_config, free_port, wait_ready, write_config
from tests.chaos.services import ROOT
from tests.integration.conftest import create_tenant, poll

pytestmark = pytest.mark.slow

# Every process of a launch starts a Python interpreter of its own; the machine is shared.
START_SECONDS = 60.0
GRACE_SECONDS = 3


def children_of(pid: int) -> set[int]:
    """The PIDs whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.add(int(entry.name))
    return found


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


def kill_leftovers(pids: set[int], config_path: Path) -> None:
    """SIGKILL those of ``pids`` that are still processes of this test's launch."""
    for pid in alive(pids):
        try:
            if str(config_path).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


def owner_of_connection(server_port: int, client_port: int, pids: set[int]) -> int | None:
    """Which of ``pids`` holds the server side of the loopback connection from
    ``client_port`` to ``server_port`` (read from /proc/net/tcp and the processes' fds)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if local.endswith(f":{server_port:04X}") and remote.endswith(f":{client_port:04X}"):
            inode = fields[9]
    if inode is None:
        return None
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
        except OSError:
            continue
    return None


async def http(stream: trio.SocketStream, method: str, path: str, body: bytes = b"",
               headers: dict[str, str] | None = None) -> tuple[int, bytes]:  # fmt: skip
    """One HTTP/1.1 request on a kept-alive connection; the status and the body."""
    status, _, answer = await http_exchange(stream, method, path, body, headers)
    return status, answer


async def http_exchange(stream: trio.SocketStream, method: str, path: str, body: bytes = b"",
                        headers: dict[str, str] | None = None,
                        ) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """One HTTP/1.1 request on a kept-alive connection; the status, the headers (lower-case
    names) and the body."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        assert chunk, "the server closed the connection"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    answer_headers = {}
    for line in header_lines:
        name, value = line.split(":", 1)
        answer_headers[name.strip().lower()] = value.strip()
    while len(rest) < int(answer_headers.get("content-length", "0")):
        chunk = await stream.receive_some()
        assert chunk, "the server closed the connection"
        rest += chunk
    return int(status_line.split()[1]), answer_headers, rest


async def get(port: int, path: str) -> tuple[int, bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        return await http(stream, "GET", path)


def ingested(metrics: bytes) -> float:
    match = re.search(rb'^notifier_events_ingested_total\{source="http"\} (\S+)$', metrics, re.M)
    assert match, metrics.decode()
    return float(match.group(1))


def process_series(metrics: bytes, name: str) -> dict[int, float]:
    """The series of the process metric ``name``: pid → value."""
    pattern = rb"^" + name.encode() + rb'\{pid="(\d+)"\} (\S+)$'
    return {int(pid): float(v) for pid, v in re.findall(pattern, metrics, re.M)}


class Launch:
    def __init__(self, tmp_path: Path, config: dict[str, dict[str, Any]], *args: str) -> None:
        path = write_config(tmp_path / "notifier.toml", config)
        self.process = ServiceProcess(path, tmp_path / "notifier.log", args=("run", *args))
        self.port = int(config["ingest"]["bind"].rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid

    def children(self) -> set[int]:
        return children_of(self.pid)

    async def wait_children(self, count: int, other_than: set[int] = frozenset()) -> set[int]:  # type: ignore[assignment]
        """Until the launch has ``count`` processes (none of ``other_than``) and answers."""

        async def started() -> bool:
            kids = self.children()
            return len(kids) == count and not kids & other_than

        async def ready() -> bool:  # every role of each of them has started
            log = self.process.log()
            return all(f"ready (pid {pid})" in log for pid in self.children())

        with trio.fail_after(START_SECONDS):
            await poll(started, interval_seconds=0.1)
            await poll(ready, interval_seconds=0.1)
        await wait_ready(f"http://127.0.0.1:{self.port}", START_SECONDS)
        return self.children()


@asynccontextmanager
async def launched(
    tmp_path: Path, config: dict[str, dict[str, Any]], *args: str
) -> AsyncIterator[Launch]:
    launch = Launch(tmp_path, config, *args)
    launch.process.start()
    try:
        yield launch
    finally:
        kids = launch.children() if launch.process.process is not None else set()
        await launch.process.stop(grace_seconds=GRACE_SECONDS + 10)
        kill_leftovers(kids, launch.process.config_path)  # only if the test failed half-way


def ingest_config(database_url: str, broker_url: str) -> dict[str, dict[str, Any]]:
    config = base_config(database_url, broker_url, free_port())
    config["service"] = {"shutdown_grace_seconds": GRACE_SECONDS}
    return config


async def test_processes_share_one_port_and_metrics_report_the_whole_launch(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    key = await create_tenant(database_url)
    config = ingest_config(database_url, broker_url)
    async with launched(tmp_path, config, "--role", "ingest", "--processes", "2") as launch:
        kids = await launch.wait_children(2)
        streams = []
        owners = {}
        try:
            # Both processes accept on the one port. Which one takes a connection is the
            # kernel's pick among the processes waiting in accept, so a process that is busy a
            # moment can miss a run of them: open connections (kept open) until both have
            # taken some, at least 24 and at most 200 (below ingest.max_connections_per_address).
            with trio.fail_after(60):
                while len(streams) < 24 or set(owners.values()) != kids:
                    if len(streams) == 200:
                        break
                    stream = await trio.open_tcp_stream("127.0.0.1", launch.port)
                    streams.append(stream)
                    status, _ = await http(stream, "GET", "/healthz")
                    assert status == 200
                    client_port = stream.socket.getsockname()[1]
                    owners[stream] = owner_of_connection(launch.port, client_port, kids)
            assert set(owners.values()) == kids, launch.process.log()
            body = json.dumps({"type": "order.created", "payload": {"n": 1}}).encode()
            for stream in streams:
                status, _ = await http(stream, "POST", "/v1/events", body,
                                       {"Authorization": f"Bearer {key}",
                                        "Content-Type": "application/json"})  # fmt: skip
                assert status == 202
        finally:
            for stream in streams:
                await stream.aclose()
        # Whichever process answers /metrics counts the events both of them accepted, and
        # tells the process metrics of each process, by pid.
        for _ in range(6):
            status, metrics = await get(launch.port, "/metrics")
            assert status == 200
            assert ingested(metrics) == len(streams)
            resident = process_series(metrics, "process_resident_memory_bytes")
            assert set(resident) == kids, metrics.decode()
            assert all(value > 0 for value in resident.values())
            assert set(process_series(metrics, "process_open_fds")) == kids
        with_pid = {line.split(b"{")[0] for line in metrics.splitlines() if b'pid="' in line}
        assert with_pid == {  # only the process metrics: the others are the launch's
            b"process_virtual_memory_bytes", b"process_resident_memory_bytes",
            b"process_start_time_seconds", b"process_cpu_seconds_total", b"process_open_fds",
            b"process_max_fds",
        }  # fmt: skip


async def test_sigterm_drains_every_process_and_exits_0(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    config = ingest_config(database_url, broker_url)
    async with launched(tmp_path, config, "--processes", "2") as launch:
        kids = await launch.wait_children(2)
        launch.process.signal(signal.SIGTERM)
        assert await launch.process.wait_exit(GRACE_SECONDS + 10) == 0, launch.process.log()
        assert not alive(kids)
        assert launch.process.log().count("notifier stopped") == 2


async def test_a_killed_process_is_started_again_and_the_launch_keeps_serving(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    config = ingest_config(database_url, broker_url)
    async with launched(tmp_path, config, "--role", "ingest", "--processes", "2") as launch:
        kids = await launch.wait_children(2)
        victim = min(kids)
        killed_at = trio.current_time()
        os.kill(victim, signal.SIGKILL)
        now = await launch.wait_children(2, other_than={victim})
        # started again after the backoff of a first failure, and not before
        assert trio.current_time() - killed_at >= RestartPolicy().delay(1)
        assert len(now - kids) == 1
        assert (await get(launch.port, "/healthz"))[0] == 200
        found = re.search(
            r"exited on signal SIGKILL .*starting it again in ([\d.]+) s", launch.process.log()
        )
        assert found is not None
        assert float(found[1]) == RestartPolicy().delay(1)
        # the process metrics of the killed process left with it
        status, metrics = await get(launch.port, "/metrics")
        assert status == 200
        assert set(process_series(metrics, "process_resident_memory_bytes")) == now


def test_a_bad_config_fails_the_launch_once(tmp_path: Path) -> None:
    path = write_config(tmp_path / "bad.toml", {"service": {"processes": 2}, "relay": {"x": 1}})
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    done = subprocess.run(
        [sys.executable, "-m", "notifier", "run", "--config", str(path)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("config error") == 1, done.stderr
    assert "relay.x: unknown key" in done.stderr


async def test_processes_that_keep_failing_at_start_end_the_launch(
    tmp_path: Path, broker_url: str
) -> None:
    closed = free_port()
    config = ingest_config(f"postgresql://postgres@127.0.0.1:{closed}/nowhere", broker_url)
    config["database"]["connect_timeout_seconds"] = 1
    launch = Launch(tmp_path, config, "--processes", "2")
    launch.process.start()
    code = await launch.process.wait_exit(START_SECONDS)
    if code is None:
        await launch.process.stop()
    log = launch.process.log()
    assert code == 1, log
    assert "failed to start 3 times in a row" in log
    # Bounded: at most three starts of each of the two processes.
    assert len(re.findall(r"process \d started", log)) <= 6


async def test_a_config_only_the_processes_check_ends_the_launch_with_2(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    """The workers' secrets are read by the processes that run them: a missing bot token makes
    them exit 2, and the launch ends at once with 2 instead of starting them again."""
    config = ingest_config(database_url, broker_url)
    config["workers.telegram"] = {"bot_token_env": "NOTIFIER_TEST_NO_SUCH_TOKEN"}
    launch = Launch(tmp_path, config, "--role", "workers", "--processes", "2")
    launch.process.start()
    code = await launch.process.wait_exit(START_SECONDS)
    if code is None:
        await launch.process.stop()
    log = launch.process.log()
    assert code == 2, log
    assert "refused the config: stopping the launch" in log
    assert "NOTIFIER_TEST_NO_SUCH_TOKEN" in log
    assert "starting it again" not in log
