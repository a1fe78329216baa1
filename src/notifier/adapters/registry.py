"""The deliverers of the enabled channel types, built from their specs where workers run."""

from __future__ import annotations

import os
from collections.abc import Mapping

from notifier.adapters.base import Adapter
from notifier.adapters.specs import SPECS
from notifier.config import Config


def build_adapters(config: Config, environ: Mapping[str, str] | None = None) -> dict[str, Adapter]:
    """One deliverer per channel type enabled in ``[workers.<type>]``. Secrets named in the
    config (the bot token, the SMTP password) are read from ``environ`` (default: the process
    environment); a missing one is a ``ConfigError`` naming the key and the variable."""
    env = os.environ if environ is None else environ
    return {t: SPECS[t].deliverer(s, env) for t, s in config.workers.enabled().items()}
