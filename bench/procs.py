"""Processes the benchmark starts and the figures it reads about them from /proc: CPU seconds
(utime + stime) and resident memory. Every process started here is remembered by PID and killed
by ``Processes.close``, also when a stage fails."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (0 when it has gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0
    # after "pid (comm)": state is fields[0], utime and stime are fields 14 and 15 of stat
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_kib(*pids: int) -> int:
    """VmRSS of the processes ``pids`` in KiB, summed (0 for one that has gone)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def pids_named(*names: str) -> list[int]:
    """PIDs of every process whose command name is one of ``names``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm in names:
            out.append(int(entry.name))
    return out


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (nginx's workers, the processes of a notifier launch)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == pid:
            out.append(int(entry.name))
    return out


class CpuGroups:
    """CPU seconds of named groups of processes; a group's PIDs are found again at each reading
    (Postgres backends come and go), so a process that exited between two readings is lost."""

    def __init__(self, groups: Mapping[str, Callable[[], list[int]]]) -> None:
        self._groups = groups

    def read(self) -> dict[str, dict[int, float]]:
        return {
            name: {pid: cpu_seconds(pid) for pid in find()} for name, find in self._groups.items()
        }

    @staticmethod
    def spent(
        before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]
    ) -> dict[str, float]:
        """CPU seconds per group between two readings, over the processes alive at the second
        (a process born in between counts from zero)."""
        return {
            name: sum(cpu - before[name].get(pid, 0.0) for pid, cpu in pids.items())
            for name, pids in after.items()
        }


class Processes:
    """Child processes of the benchmark, each killed by PID at the end."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = (self.dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
        )  # fmt: skip
        log.close()
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; the exit code."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc in self._procs:
            self._procs.remove(proc)
        return proc.returncode

    def close(self) -> None:
        for proc in list(self._procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._procs.clear()


def wait_for(check: Callable[[], bool], limit: float, what: str, every: float = 0.1) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {limit:g} s waiting for {what}")
        time.sleep(every)


def alive(pids: Iterable[int]) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists()]
