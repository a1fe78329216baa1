"""Logging and Sentry set-up."""

from __future__ import annotations

import logging
import os
import sys

from notifier.config import SentryConfig


def setup_logging() -> None:
    level = os.environ.get("NOTIFIER_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpcore", "aiormq", "hypercorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def setup_sentry(config: SentryConfig) -> None:
    """Report errors to Sentry when ``[sentry] dsn`` is set; never send request bodies."""
    if not config.dsn:
        return
    import sentry_sdk

    sentry_sdk.init(
        dsn=config.dsn,
        environment=config.environment or None,
        send_default_pii=False,
        max_request_body_size="never",
        traces_sample_rate=0.0,
    )
