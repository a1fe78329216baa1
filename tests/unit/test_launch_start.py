"""The launch's gaps closed: a child not ready in time, a child whose parent is already gone,
and metrics directories left behind by a launch killed with SIGKILL."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from notifier.launch import Launch, RestartPolicy
from notifier.launch_child import (
    EXIT_ORPHANED,
    LAUNCH_PID_ENV,
    READY_FD_ENV,
    die_with_parent,
    orphaned,
)
from notifier.metrics_dirs import metrics_directory, process_start_time, sweep_stale_metrics_dirs

FAST = RestartPolicy(base_seconds=0.01, max_seconds=0.05, max_start_failures=3)


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_child_not_ready_within_the_start_timeout_is_killed_as_a_failed_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "notifier.launch")
    never_ready = _child("import time\nwhile True:\n    time.sleep(1)")
    launch = Launch(never_ready, 1, listeners=None, grace_seconds=1, policy=FAST,
                    start_timeout_seconds=0.3)  # fmt: skip
    began = time.monotonic()
    assert launch.run() == 1
    # three starts, each killed after the bound (plus a short backoff), and not later
    assert 0.9 <= time.monotonic() - began < 15
    text = caplog.text
    assert text.count("not ready within 0.3 s: killing it") == 3
    assert text.count("exited on signal SIGKILL before it was ready") == 3
    assert "process 0 failed to start 3 times in a row" in text


def test_a_ready_child_is_not_held_to_the_start_timeout(caplog: pytest.LogCaptureFixture) -> None:
    """Ready at once, it runs past the start timeout, then asks its launch to stop (SIGTERM to
    the parent: this process, where the launch runs): nothing was killed, the exit is 0."""
    caplog.set_level(logging.INFO, "notifier.launch")
    code = f"""
import os, signal, time
os.write(int(os.environ[{READY_FD_ENV!r}]), b"1")
time.sleep(1.0)
os.kill(os.getppid(), signal.SIGTERM)
while True:
    time.sleep(1)
"""
    launch = Launch(_child(code), 1, listeners=None, grace_seconds=5, policy=FAST,
                    start_timeout_seconds=0.3)  # fmt: skip
    assert launch.run() == 0
    assert "killing it" not in caplog.text
    assert "process 0 ready" in caplog.text


def test_a_child_knows_when_its_launch_is_gone() -> None:
    assert orphaned({LAUNCH_PID_ENV: str(os.getppid())}) is None  # its parent is the launch
    assert orphaned({}) is None  # not in a launch
    assert orphaned({LAUNCH_PID_ENV: "x"}) is None
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert orphaned({LAUNCH_PID_ENV: dead.stdout.strip()}) == int(dead.stdout)


def test_a_child_whose_parent_is_not_the_launch_ends_before_it_runs() -> None:
    """What the child does right after PR_SET_PDEATHSIG when its parent is already gone: its
    parent's pid is then another process's than the launch's."""
    ran = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True,
                         preexec_fn=die_with_parent(os.getpid() + 1_000_000))  # fmt: skip
    assert (ran.returncode, ran.stdout) == (EXIT_ORPHANED, b"")
    ran = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True,
                         preexec_fn=die_with_parent(os.getpid()))  # fmt: skip
    assert (ran.returncode, ran.stdout) == (0, b"ran\n")


def test_metrics_dirs_of_launches_that_are_gone_are_swept(tmp_path: Path) -> None:
    me, started = os.getpid(), process_start_time(os.getpid())
    assert started is not None
    dead_child = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_child.wait()
    dead_start = 12345
    names = {
        "live": f"notifier-metrics-{me}-{started}-abc_12",
        "dead": f"notifier-metrics-{dead_child.pid}-{dead_start}-x1y2z3",
        # the pid of a live process, but another start time: that pid was given again
        "reused": f"notifier-metrics-{me}-{started + 1}-q9",
        "old_style": "notifier-metrics-k2j4h5g6",  # not ours to tell: kept
        "other": f"other-metrics-{dead_child.pid}-{dead_start}-aa",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "counter_1.db").write_bytes(b"x")
    (tmp_path / f"notifier-metrics-{dead_child.pid}-1-file").write_text("a file, not a dir")
    removed = sweep_stale_metrics_dirs(str(tmp_path))
    assert sorted(removed) == sorted(str(tmp_path / names[k]) for k in ("dead", "reused"))
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {names["live"], names["old_style"], names["other"],
                    f"notifier-metrics-{dead_child.pid}-1-file"}  # fmt: skip


def test_a_launchs_metrics_dir_names_its_owner_and_goes_at_the_end(tmp_path: Path) -> None:
    with metrics_directory(str(tmp_path)) as path:
        assert re.fullmatch(
            rf"notifier-metrics-{os.getpid()}-{process_start_time(os.getpid())}-\w+",
            Path(path).name,
        )
        assert sweep_stale_metrics_dirs(str(tmp_path)) == []  # its owner runs: kept
    assert not Path(path).exists()
