"""Processes the benchmark starts and the figures it reads about them from /proc: CPU seconds
(utime + stime) and resident memory, the machine's busy time (/proc/stat), and a sampler of each
process's (and thread's) busy fraction of a core while a stage runs. Every process started here
is remembered by PID and killed by ``Processes.close``, also when a stage fails."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

TICKS = os.sysconf("SC_CLK_TCK")


def stat_cpu(path: str) -> float | None:
    """utime + stime from a stat file (a process's or a thread's); None when it has gone."""
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    # after "pid (comm)": state is fields[0], utime and stime are fields 14 and 15 of stat
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (0 when it has gone)."""
    return stat_cpu(f"/proc/{pid}/stat") or 0.0


def run_delay(path: str) -> float | None:
    """Seconds a task (a thread) spent runnable but waiting for a core, from its schedstat;
    None when it has gone or the kernel keeps no schedstat."""
    try:
        return int(Path(path).read_text().split()[1]) / 1e9
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def usage(pid: int) -> Usage | None:
    """A process's CPU seconds (every thread's) and seconds its threads waited for a core
    together; None when it has gone."""
    if (cpu := stat_cpu(f"/proc/{pid}/stat")) is None:
        return None
    waited: float | None = None
    try:
        for tid in Path(f"/proc/{pid}/task").iterdir():
            if (delay := run_delay(f"{tid}/schedstat")) is not None:
                waited = (waited or 0.0) + delay
    except (FileNotFoundError, ProcessLookupError):
        return None
    return Usage(cpu, waited)


def thread_usage(pid: int) -> dict[str, Usage]:
    """CPU seconds and seconds waited for a core of each thread of ``pid``, by "name/tid"
    (empty when it has gone)."""
    out = {}
    try:
        tids = [t.name for t in Path(f"/proc/{pid}/task").iterdir()]
    except (FileNotFoundError, ProcessLookupError):
        return {}
    for tid in tids:
        task = f"/proc/{pid}/task/{tid}"
        try:
            name = Path(f"{task}/comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if (cpu := stat_cpu(f"{task}/stat")) is not None:
            out[f"{name}/{tid}"] = Usage(cpu, run_delay(f"{task}/schedstat"))
    return out


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy, all cores together (/proc/stat: every state
    but idle and iowait; guest time is already in user)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / TICKS


def cores() -> int:
    return os.cpu_count() or 1


def cmdline(pid: int) -> str:
    """The process's command line (its title, for postgres and nginx); "" when it has gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


# a postgres process's title: "postgres: [CLUSTER: ]USER DATABASE HOST(PORT) STATE" for a client
# backend, "postgres: [CLUSTER: ]autovacuum worker DATABASE", "postgres: [CLUSTER: ]walwriter"…
_BACKEND = re.compile(r"^postgres: (?:\S+: )?\S+ (\S+) (?:\S+\(\d+\)|\[local\])")
_AUTOVACUUM = re.compile(r"^postgres: (?:\S+: )?autovacuum worker (\S+)")
_AUXILIARY = re.compile(r"^postgres: (?:\S+: )?(.+?)\s*$")


def postgres_role(title: str, database: str) -> tuple[str, str]:
    """("own" | "other" | "server", what the process is) from a postgres process's title:
    a backend (or autovacuum worker) of ``database``, one of another database, or the server's
    own processes (the postmaster, checkpointer, walwriter…), which work for every database."""
    if m := _BACKEND.match(title) or _AUTOVACUUM.match(title):
        own = m.group(1) == database
        return ("own", "backend") if own else ("other", "backend of another database")
    if m := _AUXILIARY.match(title):
        return "server", m.group(1)
    return "server", "postmaster"


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


@dataclass(frozen=True)
class Unit:
    """A process or one of its threads, as the sampler names it."""

    group: str
    name: str  # "notifier process 1234", "beam.smp thread 1_scheduler/2990"…
    thread: bool = False


class Usage(NamedTuple):
    """A unit's counters at one reading: CPU seconds, and seconds it was runnable but waited for
    a core (None without schedstat)."""

    cpu: float
    waited: float | None = None


@dataclass
class Busy:
    """One unit's busy fraction of a core over the intervals it was seen in, and the fraction it
    was runnable but waiting for a core: the two together are what it asked of one core."""

    cpu: float = 0.0
    waited: float = 0.0
    wall: float = 0.0
    peak: float = 0.0

    @property
    def mean(self) -> float:
        return self.cpu / self.wall if self.wall > 0 else 0.0

    @property
    def wait(self) -> float:
        return self.waited / self.wall if self.wall > 0 else 0.0


@dataclass
class BusyTracker:
    """Readings of counters per unit (and of the machine's busy seconds) taken one after the
    other; each interval between two readings gives each unit seen in both its busy fraction
    (CPU seconds / wall seconds) and its waiting fraction. Keeps per unit the means and the peak
    busy fraction, and the peak of each group's processes together and of the machine, in
    cores."""

    units: dict[Unit, Busy] = field(default_factory=dict)
    group_peak: dict[str, float] = field(default_factory=dict)
    machine_peak: float = 0.0
    intervals: int = 0
    _last: tuple[float, dict[Unit, Usage], float | None] | None = None

    def add(self, at: float, readings: dict[Unit, Usage], machine: float | None = None) -> None:
        last, self._last = self._last, (at, readings, machine)
        if last is None or at <= last[0]:
            return
        wall = at - last[0]
        self.intervals += 1
        groups: dict[str, float] = {}
        for unit, now in readings.items():
            if (before := last[1].get(unit)) is None:
                continue  # first seen: busy from the next interval on
            spent = max(0.0, now.cpu - before.cpu)
            busy = self.units.setdefault(unit, Busy())
            busy.cpu += spent
            busy.wall += wall
            busy.peak = max(busy.peak, spent / wall)
            if now.waited is not None and before.waited is not None:
                busy.waited += max(0.0, now.waited - before.waited)
            if not unit.thread:
                groups[unit.group] = groups.get(unit.group, 0.0) + spent
        for group, spent in groups.items():
            self.group_peak[group] = max(self.group_peak.get(group, 0.0), spent / wall)
        if machine is not None and last[2] is not None:
            self.machine_peak = max(self.machine_peak, (machine - last[2]) / wall)

    def busiest(self, group: str, thread: bool = False) -> tuple[Unit, Busy] | None:
        """The unit of ``group`` (a process, or with ``thread`` a thread) that asked most of a
        core: the highest busy and waiting fractions together."""
        found = [(u, b) for u, b in self.units.items() if u.group == group and u.thread == thread]
        return max(found, key=lambda ub: (ub[1].mean + ub[1].wait, ub[1].peak)) if found else None

    def summary(self, every_process_of: Collection[str] = ()) -> dict[str, Any]:
        """What a stage keeps: per group its busiest process (and busiest thread, where threads
        were read), every process of the groups ``every_process_of``, and the peaks of the
        groups and of the machine, in cores."""

        def figures(unit: Unit, busy: Busy) -> dict[str, Any]:
            return {"group": unit.group, "name": unit.name, "thread": unit.thread,
                    "mean": busy.mean, "peak": busy.peak, "wait": busy.wait}  # fmt: skip

        busiest = []
        for group in dict.fromkeys(u.group for u in self.units):
            for thread in (False, True):
                if found := self.busiest(group, thread):
                    busiest.append(figures(*found))
        processes = [
            figures(u, b) for u, b in self.units.items()
            if u.group in every_process_of and not u.thread
        ]  # fmt: skip
        return {"intervals": self.intervals, "busiest": busiest, "processes": processes,
                "group_peak": dict(self.group_peak), "machine_peak": self.machine_peak}  # fmt: skip


class Sampler:
    """Reads, every ``every`` seconds on a thread of its own, the counters of each unit that
    ``read`` returns and the machine's busy seconds, into a ``BusyTracker``; ``stop`` ends it and
    returns the tracker. Reading /proc for some hundred processes takes about 7 ms of CPU: the
    sampler's cost shows in the benchmark's own process."""

    def __init__(self, read: Callable[[], dict[Unit, Usage]], every: float = 0.5) -> None:
        self._read = read
        self._every = every
        self.tracker = BusyTracker()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._error: Exception | None = None

    def _sample(self) -> None:
        self.tracker.add(time.monotonic(), self._read(), machine_busy())

    def _run(self) -> None:
        try:
            while True:
                self._sample()
                if self._stop.wait(self._every):
                    break
        except Exception as exc:  # raised again by stop(), in the stage that measured
            self._error = exc

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> BusyTracker:
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise RuntimeError("the CPU sampler failed") from self._error
        self._sample()  # the last, partial interval
        return self.tracker


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
