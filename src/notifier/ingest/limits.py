"""How many connections the ingest server holds: the bookkeeping (pure) and the descriptor limit.

Every open connection holds a file descriptor and a task. Over ``ingest.max_connections`` in
all, or ``ingest.max_connections_per_address`` from one client address, a new connection is
closed at once, before anything of it is read: one client cannot take the descriptors the
others need, and the process keeps the descriptors its database and broker connections need.
"""

from __future__ import annotations

import logging
import resource
from collections import Counter
from typing import Literal

log = logging.getLogger("notifier.ingest")

# The share of the process's descriptors that ingest connections may take when
# `ingest.max_connections` is "auto"; the rest is for Postgres, RabbitMQ, logs and listeners.
AUTO_SHARE = 0.75

Refusal = Literal["total", "per_address"]


class ConnectionLimits:
    """The connections open now, in all and per client address, against two limits.

    ``max_per_address`` 0 is no limit per address. :meth:`admit` and :meth:`release` are paired
    by the caller: one release for every admitted connection."""

    def __init__(self, max_total: int, max_per_address: int) -> None:
        if max_total < 1 or max_per_address < 0:
            raise ValueError(f"limits {max_total}/{max_per_address}: total ≥ 1, per address ≥ 0")
        self.max_total = max_total
        self.max_per_address = max_per_address
        self._open = 0
        self._by_address: Counter[str] = Counter()

    @property
    def open(self) -> int:
        return self._open

    def open_from(self, address: str) -> int:
        return self._by_address[address]

    def admit(self, address: str) -> Refusal | None:
        """Count a new connection from ``address`` and return ``None``; or, when it is over a
        limit, count nothing and say which ("total" is checked first)."""
        if self._open >= self.max_total:
            return "total"
        if self.max_per_address and self._by_address[address] >= self.max_per_address:
            return "per_address"
        self._open += 1
        self._by_address[address] += 1
        return None

    def release(self, address: str) -> None:
        """Forget an admitted connection from ``address``."""
        if self._by_address[address] <= 0:
            raise ValueError(f"no connection from {address!r} to release")
        self._open -= 1
        self._by_address[address] -= 1
        if not self._by_address[address]:
            del self._by_address[address]


def auto_max_connections(soft_limit: int) -> int:
    """The connection limit for a process that may open ``soft_limit`` descriptors."""
    return max(1, int(soft_limit * AUTO_SHARE))


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit of open descriptors to its hard limit where it is lower
    (logged), and return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else soft
    if soft != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("ingest: could not raise the open-file limit from %d to %d (%s)",
                        soft, target, type(exc).__name__)  # fmt: skip
            return soft
        log.info("ingest: raised the open-file limit from %d to %d (the hard limit)", soft, target)
        return target
    return soft


def max_connections(configured: int | Literal["auto"]) -> int:
    """``ingest.max_connections`` as a number: "auto" raises the descriptor limit and takes
    :data:`AUTO_SHARE` of it (both logged)."""
    if configured != "auto":
        return configured
    soft = raise_descriptor_limit()
    if soft == resource.RLIM_INFINITY:
        soft = 1_048_576
    limit = auto_max_connections(soft)
    log.info("ingest: at most %d connections (¾ of the open-file limit %d)", limit, soft)
    return limit
