"""When a launch starts a child again (:class:`RestartPolicy`), and how it tells a child's exit."""

from __future__ import annotations

import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    """When to start a child again. Pure: the supervisor asks, this answers."""

    base_seconds: float = 0.5
    max_seconds: float = 30.0
    # A child that ran this long before it exited starts its backoff from the beginning.
    healthy_after_seconds: float = 60.0
    max_start_failures: int = 3

    def delay(self, failures_in_a_row: int) -> float:
        """Seconds to wait before the start after the ``failures_in_a_row``-th exit (≥ 1)."""
        return min(self.base_seconds * 2.0 ** (failures_in_a_row - 1), self.max_seconds)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"on signal {signal.Signals(-code).name}"
        except ValueError:  # a real-time signal has no name
            return f"on signal {-code}"
    return f"with code {code}"
