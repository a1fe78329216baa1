"""Sentry set-up and error reporting (logging is set up in ``notifier.logs``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import sentry_sdk
from sentry_sdk.integrations.httpx import HttpxIntegration
from sentry_sdk.integrations.logging import LoggingIntegration

from notifier.config import SentryConfig


def setup_sentry(config: SentryConfig, **options: Any) -> bool:
    """Report errors to Sentry when ``[sentry] dsn`` is set; return whether it is on.

    Nothing that may hold a secret leaves the process: no request bodies, no PII and no local
    variables in stack traces (a frame's locals include channel configs). ``options`` go to
    ``sentry_sdk.init`` (tests pass a ``transport`` that records events).

    Events are sent only where notifier reports one on purpose (``SentryReporter``), each
    once and with its ids as tags; log lines travel along as breadcrumbs.
    """
    if not config.dsn:
        return False
    sentry_sdk.init(
        dsn=config.dsn,
        environment=config.environment or None,
        data_collection={
            "user_info": False,
            "cookies": {"mode": "off"},
            "http_bodies": [],
            "url_query_params": {"mode": "off"},
            "stack_frame_variables": False,
        },
        traces_sample_rate=0.0,
        integrations=[LoggingIntegration(level=logging.INFO, event_level=None)],
        # httpx breadcrumbs would carry request URLs, and a Bot API URL holds the bot token.
        disabled_integrations=[HttpxIntegration()],
        **options,
    )
    return True


class Reporter(Protocol):
    """Where errors worth a human's attention go (Sentry in production). ``contexts``: named
    structured contexts the event carries (the ``dead_delivery`` of a failure alert,
    ``notifier.alerts``), already free of secrets."""

    def report(
        self,
        summary: str,
        *,
        tags: Mapping[str, str],
        exc: BaseException | None = None,
        contexts: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None: ...


class SentryReporter:
    """Report to Sentry with the given tags; a no-op while Sentry is not set up.

    Tags are ids, types, the attempt number and a destination's origin: never a channel's
    config (it holds secrets). The only payload that travels is a failure alert's excerpt in
    its context, scrubbed of secret-looking keys (``notifier.alerts.context``); the SDK's own
    scrubbing stays on over all of it.
    """

    def report(
        self,
        summary: str,
        *,
        tags: Mapping[str, str],
        exc: BaseException | None = None,
        contexts: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        try:
            with sentry_sdk.new_scope() as scope:
                for key, value in tags.items():
                    scope.set_tag(key, value)
                for name, context in (contexts or {}).items():
                    scope.set_context(name, dict(context))
                scope.set_extra("summary", summary)
                if exc is not None:
                    scope.capture_exception(exc)
                else:
                    scope.capture_message(summary, level="error")
        except Exception:  # reporting must never take a worker down
            logging.getLogger("notifier").warning("reporting to Sentry failed", exc_info=True)
