"""``python -m tests.chaos.child --raise-for KEY --config FILE``: ``notifier run`` (every role)
with its webhook adapter wrapped so that delivering a payload that carries ``KEY`` raises — an
adapter bug, for the fault suite's panic-isolation scenario.

The wrapper goes in through ``service.run(adapters=...)``, the interface the service offers for
handing it other adapters; nothing in notifier is patched. Everything else is as ``notifier run``
does it: the config, logging and Sentry set up the same way.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from typing import Any

import trio

from notifier import service
from notifier.adapters.base import Adapter, Receipt
from notifier.adapters.registry import build_adapters
from notifier.config import Config, load_config
from notifier.logs import setup_logging
from notifier.messages import WorkerMessage
from notifier.observability import setup_sentry


class AdapterBug(RuntimeError):
    """What the wrapped adapter raises for a marked payload."""


class RaisesForMarker:
    """An adapter that delegates to ``inner``, except that it raises ``AdapterBug`` for a
    payload carrying ``marker`` (without calling ``inner``)."""

    def __init__(self, inner: Adapter, marker: str) -> None:
        self._inner = inner
        self._marker = marker

    def __getattr__(self, name: str) -> Any:  # channel_type, prepare_config, ...
        return getattr(self._inner, name)

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        if self._marker in message.payload:
            raise AdapterBug(f"injected bug: the payload carries {self._marker!r}")
        return await self._inner.deliver(message)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def run(config: Config, marker: str) -> None:
    inner = build_adapters(config)["webhook"]
    wrapped: Any = RaisesForMarker(inner, marker)
    await service.run(config, service.ROLES, adapters={"webhook": wrapped})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.child")
    parser.add_argument("--config", required=True)
    parser.add_argument("--raise-for", required=True, metavar="KEY")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    setup_logging(config.logging)
    setup_sentry(config.sentry)
    trio.run(functools.partial(run, config, args.raise_for))
    return 0


if __name__ == "__main__":
    sys.exit(main())
