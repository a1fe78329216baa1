"""Failure alerts of dead deliveries: their context (``context``), the background task that
reports them to Sentry and sends them to the operator webhook (``dispatch``), and that webhook
(``webhook``). docs/architecture.md §5, README "Failure alerts"."""

from __future__ import annotations

from notifier.alerts.buffer import DropOldest
from notifier.alerts.context import (
    SCRUBBED,
    AlertContext,
    build_context,
    destination_origin,
    is_secret_key,
    payload_excerpt,
    scrub,
)
from notifier.alerts.dispatch import (
    SENTRY_CONTEXT,
    AlertHistory,
    AlertObserver,
    Alerts,
    AlertSink,
    open_alerts,
)
from notifier.alerts.webhook import (
    ALERT_TYPE,
    AlertNotSent,
    WebhookAlertSink,
    alert_id,
    alert_request,
    send_with_tries,
)
from notifier.store.rows import AttemptRow, DeadHistory

__all__ = [
    "ALERT_TYPE",
    "SCRUBBED",
    "SENTRY_CONTEXT",
    "AlertContext",
    "AlertHistory",
    "AlertNotSent",
    "AlertObserver",
    "AlertSink",
    "Alerts",
    "AttemptRow",
    "DeadHistory",
    "DropOldest",
    "WebhookAlertSink",
    "alert_id",
    "alert_request",
    "build_context",
    "destination_origin",
    "is_secret_key",
    "open_alerts",
    "payload_excerpt",
    "scrub",
    "send_with_tries",
]
