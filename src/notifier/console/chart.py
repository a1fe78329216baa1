"""The overview's chart, drawn on the server as SVG: deliveries delivered and failed per hour.
Pure: numbers in, an SVG's parts out (the template writes them; no script, no inline style)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

WIDTH, HEIGHT = 720, 200
LEFT, RIGHT, TOP, BOTTOM = 40, 10, 10, 24  # margins for the labels


@dataclasses.dataclass(frozen=True)
class Chart:
    width: int
    height: int
    delivered: str  # the polyline's points
    failed: str
    y_max: int
    y_labels: list[tuple[float, str]]  # (y, text)
    x_labels: list[tuple[float, str]]  # (x, text)
    baseline: float


def nice_max(value: int) -> int:
    """The axis' top: ``value`` rounded up to 1, 2 or 5 times a power of ten (at least 1)."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if value <= m * step:
                return m * step
        step *= 10


def line_chart(delivered: Sequence[int], failed: Sequence[int], x_labels: Sequence[str]) -> Chart:
    """Two series of as many points as ``x_labels`` (one label every few points is drawn)."""
    n = len(x_labels)
    top = nice_max(max([*delivered, *failed, 0]))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    def points(values: Sequence[int]) -> str:
        return " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))

    every = max(1, n // 6)
    return Chart(
        width=WIDTH, height=HEIGHT, delivered=points(delivered), failed=points(failed),
        y_max=top, y_labels=[(y(v), str(v)) for v in (0, top // 2, top) if v or top],
        x_labels=[(x(i), label) for i, label in enumerate(x_labels) if i % every == 0],
        baseline=y(0),
    )  # fmt: skip
