"""A measured stage of the benchmark and the arithmetic on its figures: what the stages
(bench/run.py), the report (bench/report.py) and the soak (bench/soak.py) share."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


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
        return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (not empty), ``q`` in [0, 100]."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]
