"""Which node of a RabbitMQ cluster a connection tries first (pure; no I/O).

``broker.url`` names one node or every node of one cluster. Each connection, named by the
component that opens it (``relay``, ``workers.webhook`` …), tries the nodes in turn from a
starting node: the first time a per-process random one, so that a fleet's connections spread
over the cluster; after that the node after the one it was last connected to, so that a
connection lost with its node goes to the next node first, and comes back round to the lost one
only when the others do not answer (docs/architecture.md §4).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from urllib.parse import urlsplit

BrokerUrls = str | Sequence[str]


def node_urls(url: BrokerUrls) -> tuple[str, ...]:
    """The nodes' URLs: one URL, or a list of them, as ``broker.url`` holds it."""
    return (url,) if isinstance(url, str) else tuple(url)


def node_address(url: str) -> str:
    """``host:port/vhost`` of a URL, for logs: never the user name or the password."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "(an unreadable URL)"
    if ":" in host:
        host = f"[{host}]"
    default = 5671 if parts.scheme == "amqps" else 5672
    return f"{host}:{port or default}{parts.path or '/'}"


class NodeChooser:
    """The order in which a named connection tries the nodes (indexes into the URL list).

    ``order(name, count)`` starts at a per-process random node the first time a name asks,
    then, once ``connected(name, index, count)`` reported where it went, at the node after it.
    ``rng`` is injected for tests.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._offset: int | None = None  # the process's random start, drawn on first use
        self._next: dict[str, int] = {}  # name -> the node it tries first next time

    def order(self, name: str, count: int) -> list[int]:
        if count < 1:
            raise ValueError("no broker node to connect to")
        if name not in self._next:
            if self._offset is None:
                self._offset = self._rng.randrange(1 << 30)
            # the names of one process start on different nodes too (they spread over the cluster)
            self._next[name] = self._offset + len(self._next)
        start = self._next[name]
        return [(start + i) % count for i in range(count)]

    def connected(self, name: str, index: int, count: int) -> None:
        """``name`` is connected to node ``index``: its next connection starts at the next."""
        self._next[name] = (index + 1) % count


# The process's chooser: every connection of this process draws from it.
CHOOSER = NodeChooser()
