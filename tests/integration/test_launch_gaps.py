"""The launch's gaps closed, as real processes: the metrics directory of a launch killed with
SIGKILL, a process never ready, a process whose launch is gone, and ``ingest.metrics_bind``
shared by the processes of a launch."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.chaos.harness import free_port, write_config
from tests.chaos.services import ROOT
from tests.integration.conftest import poll
from tests.integration.test_processes import (
    GRACE_SECONDS,
    START_SECONDS,
    Launch,
    alive,
    get,
    ingest_config,
    kill_leftovers,
    launched,
    process_series,
)

pytestmark = pytest.mark.slow


def metrics_dir_of(pid: int) -> Path:
    """The metrics directory a process of a launch was given (from its environment)."""
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name == b"PROMETHEUS_MULTIPROC_DIR":
            return Path(value.decode())
    raise AssertionError(f"process {pid} has no metrics directory")


async def test_the_metrics_dir_of_a_killed_launch_is_removed_by_the_next_one(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    config = ingest_config(database_url, broker_url)
    first = Launch(tmp_path, config, "--role", "ingest", "--processes", "2")
    first.process.start()
    kids: set[int] = set()
    try:
        kids = await first.wait_children(2)
        stale = metrics_dir_of(min(kids))
        assert stale.is_dir()
        first.process.process.kill()  # type: ignore[union-attr]  # SIGKILL: no clean-up
        assert await first.process.wait_exit(10) == -signal.SIGKILL

        async def children_gone() -> bool:
            return not alive(kids)

        with trio.fail_after(GRACE_SECONDS + 10):  # the children end with their parent
            await poll(children_gone, interval_seconds=0.05)
    finally:
        kill_leftovers(kids, first.process.config_path)
    assert stale.is_dir()  # left behind
    async with launched(tmp_path, config, "--role", "ingest", "--processes", "2") as second:
        now = await second.wait_children(2)
        assert not stale.exists()
        assert metrics_dir_of(min(now)).is_dir()
        assert metrics_dir_of(min(now)) != stale
    assert "removed the metrics directory of a launch that is gone" in second.process.log()


async def test_a_process_not_ready_within_the_start_timeout_is_killed_as_a_failed_start(
    tmp_path: Path, broker_url: str
) -> None:
    """Postgres that accepts connections and never answers: the processes hang at their start
    (a connect timeout of a minute), and the launch kills each after the start timeout."""
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(64)  # never accepted: a connection waits for an answer that never comes
        port = blackhole.getsockname()[1]
        config = ingest_config(f"postgresql://postgres@127.0.0.1:{port}/nowhere", broker_url)
        config["database"]["connect_timeout_seconds"] = 60
        config["service"]["start_timeout_seconds"] = 2
        launch = Launch(tmp_path, config, "--role", "ingest", "--processes", "2")
        launch.process.start()
        code = await launch.process.wait_exit(START_SECONDS)
        if code is None:
            await launch.process.stop()
    log = launch.process.log()
    assert code == 1, log
    given_up = re.findall(r"process (\d) failed to start 3 times in a row", log)
    assert len(given_up) == 1, log
    # that process: three starts, each killed after the bound, none of them ready
    killed = re.findall(rf"process {given_up[0]} \(pid \d+\) not ready within 2.0 s: killing it",
                        log)  # fmt: skip
    assert len(killed) == 3, log
    assert "ready (pid" not in log


def test_a_process_whose_launch_is_already_gone_exits_at_once(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    """A process of a launch started as the parent died (before PR_SET_PDEATHSIG): its parent
    is not the launch's; it exits instead of running on unsupervised."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone_pid = int(gone.stdout)
    path = write_config(tmp_path / "notifier.toml", ingest_config(database_url, broker_url))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    env["NOTIFIER_LAUNCH_PID"] = str(gone_pid)
    # Bounded: on timeout, subprocess.run kills the process and raises.
    done = subprocess.run(
        [sys.executable, "-m", "notifier", "run", "--role", "ingest", "--processes", "1",
         "--config", str(path)],
        env=env, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"the launch (pid {gone_pid}) is gone" in output
    assert "notifier running" not in output


async def test_a_metrics_bind_is_shared_by_the_processes_of_a_launch(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    config = ingest_config(database_url, broker_url)
    metrics_port = free_port()
    config["ingest"]["metrics_bind"] = f"127.0.0.1:{metrics_port}"
    async with launched(tmp_path, config, "--role", "ingest", "--processes", "2") as launch:
        kids = await launch.wait_children(2)
        status, body = await get(launch.port, "/metrics")
        assert status == 404
        assert json.loads(body)["error"]["code"] == "not_found"
        # The parent bound the address once: the processes accept on its socket, and each
        # process's answer reports the whole launch.
        for _ in range(6):
            status, metrics = await get(metrics_port, "/metrics")
            assert status == 200
            assert set(process_series(metrics, "process_resident_memory_bytes")) == kids
        assert f"127.0.0.1:{metrics_port}" in launch.process.log()
