"""A measured stage of the benchmark and the arithmetic on its figures: what the stages
(bench/run.py), the report (bench/report.py) and the soak (bench/soak.py) share."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Window:
    """The measured part of a stage: its wall seconds, the CPU seconds the whole machine was busy
    in it (every process, also those of other users), the machine's cores, and the sampled busy
    fractions (``procs.BusyTracker.summary``)."""

    seconds: float
    machine_cpu: float
    cores: int
    busy: dict[str, Any] = field(default_factory=dict)


@dataclass
class Stage:
    key: str
    name: str
    unit: str
    items: int
    seconds: float
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per group
    extra: dict[str, Any] = field(default_factory=dict)
    window: Window | None = None

    def cores_busy(self, group: str) -> float | None:
        """A group's CPU seconds over the measured wall seconds: how many cores it kept busy
        (one single-threaded process cannot pass 1.0)."""
        if group not in self.cpu or self.window is None or self.window.seconds <= 0:
            return None
        return self.cpu[group] / self.window.seconds

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    def per_1000(self, group: str) -> float | None:
        if group not in self.cpu or not self.items:
            return None
        return self.cpu[group] / self.items * 1000

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rate"] = self.rate
        out["cpu_per_1000"] = {g: self.per_1000(g) for g in self.cpu}
        out["cores_busy"] = {g: self.cores_busy(g) for g in self.cpu} if self.window else {}
        return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (not empty), ``q`` in [0, 100]."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]
