"""The pieces of ``notifier run --processes N`` that need no services: the config key, the
option, the restart policy, the inherited listeners, and the parent's supervision of small
stand-in children."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from notifier import cli
from notifier.config import available_cores, cpu_quota_cores, parse_config
from notifier.errors import ConfigError
from notifier.ingest.serve import LISTEN_FDS_ENV, adopt_listeners, open_listeners
from notifier.launch import Launch, RestartPolicy, child_argv
from notifier.launch_child import READY_FD_ENV, notify_ready


@pytest.mark.parametrize("value", [0, -1, "x", 1.5, True, ""])
def test_processes_refuses_what_is_not_a_count_or_auto(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^service\.processes: "):
        parse_config({"service": {"processes": value}}, env={})


def test_processes_takes_a_count_or_auto() -> None:
    assert parse_config({}, env={}).service.process_count() == 1  # the default: no parent
    assert parse_config({"service": {"processes": 3}}, env={}).service.process_count() == 3
    auto = parse_config({"service": {"processes": "auto"}}, env={}).service
    assert auto.processes == "auto"
    assert auto.process_count() == available_cores()
    assert 1 <= available_cores() <= len(os.sched_getaffinity(0))  # a cgroup quota may lower it


@pytest.mark.parametrize(
    ("cpu_max", "cores"),
    [
        ("max 100000", None),  # no quota
        ("200000 100000\n", 2),  # docker --cpus 2
        ("150000 100000", 2),  # 1.5 cores: rounded up
        ("50000 100000", 1),  # half a core: still one process
        ("", None),
        ("max", None),
        ("x 100000", None),
        ("0 100000", None),
    ],
)
def test_a_cgroup_cpu_quota_is_read_as_cores(cpu_max: str, cores: int | None) -> None:
    assert cpu_quota_cores(cpu_max) == cores


def test_auto_is_the_affinity_lowered_to_the_tightest_cgroup_quota() -> None:
    affinity = len(os.sched_getaffinity(0))
    assert available_cores([]) == affinity
    assert available_cores(["max 100000", "max 100000"]) == affinity
    assert available_cores([f"{(affinity + 4) * 100000} 100000"]) == affinity  # above: no effect
    assert available_cores(["max 100000", "100000 100000", "300000 100000"]) == 1


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", ""])
def test_the_processes_option_refuses_what_is_not_a_count_or_auto(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--processes", value])
    assert exit_.value.code == 2
    assert "--processes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("exits", "delay"),
    [
        (1, 0.5),  # the first exit: the base
        (2, 1.0),  # doubling
        (4, 4.0),
        (7, 30.0),  # 32 s capped
        (50, 30.0),  # still capped, no overflow
    ],
)
def test_restart_backoff_doubles_up_to_its_cap(exits: int, delay: float) -> None:
    assert RestartPolicy().delay(exits) == delay


def test_child_argv_runs_one_process_of_the_same_roles_and_config() -> None:
    assert child_argv("/etc/n.toml", ["ingest", "relay"]) == [
        sys.executable, "-m", "notifier", "run", "--role", "ingest,relay", "--processes", "1",
        "--config", "/etc/n.toml",
    ]  # fmt: skip
    assert "--config" not in child_argv(None, ["ingest"])


def test_listeners_are_adopted_from_inherited_descriptors() -> None:
    with open_listeners("127.0.0.1:0", {}) as parent:
        fds = ",".join(str(os.dup(fd)) for fd in parent.filenos())
        with open_listeners("ignored:1", {LISTEN_FDS_ENV: fds}) as child:
            assert child.binds == parent.binds
            port = int(parent.binds[0].rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # the shared socket accepts


def test_adopting_a_socket_that_does_not_listen_is_refused() -> None:
    with socket.socket() as sock:
        with pytest.raises(OSError, match="not a listening socket"):
            adopt_listeners(str(sock.fileno()))
        assert sock.fileno() != -1  # left to its owner
    with pytest.raises(OSError, match="not a list of file descriptors"):
        adopt_listeners("3,x")


def test_notify_ready_writes_one_byte_to_the_parent() -> None:
    read_fd, write_fd = os.pipe()
    notify_ready({READY_FD_ENV: str(write_fd)})
    assert os.read(read_fd, 16) == b"1"
    assert os.read(read_fd, 16) == b""  # and closes its end
    os.close(read_fd)
    notify_ready({})  # not a child of a launch: nothing


FAST = RestartPolicy(base_seconds=0.01, max_seconds=0.05, max_start_failures=3)


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_children_that_fail_at_start_end_the_launch(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "notifier.launch")
    launch = Launch(_child("raise SystemExit(3)"), 2, listeners=None, grace_seconds=1,
                    policy=FAST)  # fmt: skip
    assert launch.run() == 1
    text = caplog.text
    # The first slot to fail three times in a row ends the launch: two restarts, then the end.
    given_up = int(re.findall(r"process (\d) failed to start 3 times in a row", text)[0])
    assert text.count(f"process {given_up} started") == 3
    assert len(re.findall(r"process \d started", text)) <= 6


def test_a_child_that_was_ready_is_restarted_without_counting_as_a_start_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each child is ready and then exits, twice; from its third start on it fails at start:
    the launch gives up only after three failed starts in a row, i.e. after five starts."""
    caplog.set_level(logging.INFO, "notifier.launch")
    counter = tmp_path / "starts"
    code = f"""
import os, pathlib
p = pathlib.Path({str(counter)!r})
n = len(p.read_text()) if p.exists() else 0
p.write_text("x" * (n + 1))
if n >= 2:
    raise SystemExit(4)
os.write(int(os.environ[{READY_FD_ENV!r}]), b"1")
raise SystemExit(0)
"""
    launch = Launch(_child(code), 1, listeners=None, grace_seconds=1, policy=FAST)
    assert launch.run() == 1
    assert len(counter.read_text()) == 5
    assert caplog.text.count("exited with code 0 after") == 2
    assert caplog.text.count("exited with code 4 before it was ready") == 3


class _SigtermOnce:
    """SIGTERM to this process (where the launch runs) once ``ready`` has been logged; never
    after the launch has returned (the default handler would end the test run)."""

    def __init__(self, caplog: pytest.LogCaptureFixture, ready: str) -> None:
        self._caplog, self._ready = caplog, ready
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._send)
        self._thread.start()

    def _send(self) -> None:
        deadline = time.monotonic() + 60
        while self._ready not in self._caplog.text:
            if self._done.wait(0.02) or time.monotonic() > deadline:
                return
        os.kill(os.getpid(), signal.SIGTERM)

    def close(self) -> None:
        self._done.set()
        self._thread.join()


def _pids(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [int(p) for p in re.findall(r"started \(pid (\d+)\)", caplog.text)]


READY_THEN_SLEEP = f"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, {{handler}})
os.write(int(os.environ[{READY_FD_ENV!r}]), b"1")
while True:
    time.sleep(1)
"""


def test_sigterm_stops_every_child_and_exits_0(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "notifier.launch")
    code = READY_THEN_SLEEP.format(handler="lambda *_: sys.exit(0)")
    launch = Launch(_child(code), 2, listeners=None, grace_seconds=5, policy=FAST)
    sigterm = _SigtermOnce(caplog, "launch running: 2 processes")
    try:
        assert launch.run() == 0
    finally:
        sigterm.close()
    assert "SIGTERM: stopping 2 processes" in caplog.text
    assert len(_pids(caplog)) == 2
    assert not [pid for pid in _pids(caplog) if os.path.exists(f"/proc/{pid}")]


def test_children_still_running_after_the_grace_period_are_killed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "notifier.launch")
    code = READY_THEN_SLEEP.format(handler="signal.SIG_IGN")
    launch = Launch(_child(code), 1, listeners=None, grace_seconds=0.2, policy=FAST,
                    shutdown_margin_seconds=0.2)  # fmt: skip
    sigterm = _SigtermOnce(caplog, "launch running: 1 processes")
    started = time.monotonic()
    try:
        assert launch.run() == 1
    finally:
        sigterm.close()
    assert time.monotonic() - started < 30
    assert "still running after the grace period: killing them" in caplog.text
    assert not os.path.exists(f"/proc/{_pids(caplog)[0]}")


def test_a_child_that_refuses_the_config_ends_the_launch_at_once_with_2(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "notifier.launch")
    launch = Launch(_child("raise SystemExit(2)"), 2, listeners=None, grace_seconds=1,
                    policy=FAST)  # fmt: skip
    assert launch.run() == 2
    assert "refused the config: stopping the launch" in caplog.text
    assert "starting it again" not in caplog.text


def test_a_child_ended_by_a_real_time_signal_is_described_by_its_number(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Real-time signals have no name in `signal.Signals`; the parent must not crash on one.
    rt_signal = signal.SIGRTMIN + 6
    code = f"import os; os.kill(os.getpid(), {rt_signal})"
    launch = Launch(_child(code), 1, listeners=None, grace_seconds=1, policy=FAST)
    assert launch.run() == 1
    assert f"exited on signal {rt_signal} before it was ready" in caplog.text


COUNT_SIGTERMS = f"""
import os, pathlib, signal, sys, time
seen = []
def on_term(*_):
    seen.append(1)
    pathlib.Path({{marker!r}}).write_text(str(len(seen)))
    if len(seen) == 2:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
os.write(int(os.environ[{READY_FD_ENV!r}]), b"1")
while True:
    time.sleep(1)
"""


def test_two_signals_at_once_stop_the_children_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two signals noted together: the first SIGTERM, then at once the second, which stops a
    child at once (this one exits on its second SIGTERM only)."""
    caplog.set_level(logging.INFO, "notifier.launch")
    marker = tmp_path / "sigterms"
    launch = Launch(_child(COUNT_SIGTERMS.format(marker=str(marker))), 1, listeners=None,
                    grace_seconds=10, policy=FAST, shutdown_margin_seconds=0.5)  # fmt: skip
    done = threading.Event()

    def send_two() -> None:
        deadline = time.monotonic() + 60
        while "launch running: 1 processes" not in caplog.text:
            if done.wait(0.02) or time.monotonic() > deadline:
                return
        # One after the other in this thread, holding the interpreter: the launch notes both
        # before it looks at its signals.
        os.kill(os.getpid(), signal.SIGTERM), os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=send_two)
    sender.start()
    try:
        assert launch.run() == 0  # not killed after the grace period
    finally:
        done.set()
        sender.join()
    assert marker.read_text() == "2"
    assert "second signal: stopping the processes now" in caplog.text


FIRST_TO_START_BREAKS_THE_INTERPRETER = f"""
import os, pathlib, signal, sys, time
work = pathlib.Path({{work!r}})
(work / f"started-{{{{os.getpid()}}}}").touch()
try:
    os.close(os.open(work / "broken", os.O_CREAT | os.O_EXCL))
    first = True
except FileExistsError:
    first = False
if not first:
    signal.signal(signal.SIGTERM, lambda *_: (work / "stopped").touch() or sys.exit(0))
os.write(int(os.environ[{READY_FD_ENV!r}]), b"1")
if first:
    while len(list(work.glob("started-*"))) < 2:
        time.sleep(0.02)
    os.unlink({{interpreter!r}})  # no child can start again
    sys.exit(1)
while True:
    time.sleep(1)
"""


def test_a_child_that_cannot_be_started_again_stops_the_others_gracefully(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Starting a child again fails in the parent (the interpreter is gone): each failure
    counts as a failed start, with its backoff, and when the launch gives up, the other child
    gets SIGTERM and its grace period, not SIGKILL."""
    caplog.set_level(logging.INFO, "notifier.launch")
    work, interpreter = tmp_path / "work", tmp_path / "python"
    work.mkdir()
    interpreter.symlink_to(sys.executable)
    code = FIRST_TO_START_BREAKS_THE_INTERPRETER.format(
        work=str(work), interpreter=str(interpreter)
    )
    launch = Launch([str(interpreter), "-c", code], 2, listeners=None, grace_seconds=10,
                    policy=FAST, shutdown_margin_seconds=0.5)  # fmt: skip
    assert launch.run() == 1
    assert (work / "stopped").exists()
    assert len(re.findall(r"process \d could not be started: .*No such file", caplog.text)) == 3
    assert re.search(r"process \d failed to start 3 times in a row", caplog.text)
