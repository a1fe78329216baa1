"""``[service]``: the launch: its processes (sized from the cores and the cgroup's CPU quota),
the grace of a stop and the bound on a process's start."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from notifier.config.base import (
    NonNegativeFloat,
    Positive,
    PositiveFloat,
    Section,
)


class ServiceConfig(Section, frozen=True):
    shutdown_grace_seconds: NonNegativeFloat = 10.0
    # In a launch (`--processes N`), a process not ready this long after its start is killed
    # and counted as a failed start.
    start_timeout_seconds: PositiveFloat = 60.0
    # Processes of one launch (`notifier run --processes`): a number, or "auto" for one per
    # core; 1 runs the roles in this process, with no supervising parent.
    processes: Positive | Literal["auto"] = 1

    def process_count(self) -> int:
        """``processes`` as a number: ``auto`` is the number of cores this process may use."""
        return process_count(self.processes)


def process_count(processes: int | Literal["auto"]) -> int:
    """A number of processes as ``service.processes`` or ``--processes`` gives it, as a number:
    ``auto`` is the number of cores this process may use."""
    return available_cores() if processes == "auto" else processes


CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_cores(cpu_limits: Iterable[str] | None = None) -> int:
    """The cores this process may use, at least 1: its CPU affinity, lowered to the CPU quota
    of its cgroup (``docker --cpus``, systemd's ``CPUQuota=``), rounded up. ``cpu_limits``:
    the ``cpu.max`` of its cgroup and of each one above it (cgroup v2); by default read from
    ``/sys/fs/cgroup``."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        cores = max(1, os.cpu_count() or 1)
    for cpu_max in _cgroup_cpu_limits() if cpu_limits is None else cpu_limits:
        if (quota := cpu_quota_cores(cpu_max)) is not None:
            cores = min(cores, quota)
    return cores


def cpu_quota_cores(cpu_max: str) -> int | None:
    """The cores a cgroup v2 ``cpu.max`` (``"max 100000"``, ``"200000 100000"``: quota and
    period in µs) allows, rounded up, at least 1; ``None`` without a quota (or unreadable)."""
    fields = cpu_max.split()
    if len(fields) != 2 or not all(f.isascii() and f.isdigit() for f in fields):
        return None
    quota, period = int(fields[0]), int(fields[1])
    if quota == 0 or period == 0:
        return None
    return max(1, math.ceil(quota / period))


def _cgroup_cpu_limits() -> Iterator[str]:
    """The ``cpu.max`` of this process's cgroup v2 and of each cgroup above it, as found."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:  # no cgroup v2 (v1 quotas are not read)
        return
    group = CGROUP_ROOT / path.strip().lstrip("/")
    for directory in (group, *group.parents):
        with contextlib.suppress(OSError):
            yield (directory / "cpu.max").read_text()
        if directory == CGROUP_ROOT:
            return
