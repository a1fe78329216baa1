"""The operations sections: ``[logging]``, ``[channel_health]``, ``[maintenance]`` and
``[sentry]``."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from notifier.config.base import (
    NonNegativeFloat,
    PositiveFloat,
    Section,
)


class LoggingConfig(Section, frozen=True):
    format: Literal["json", "console"] = "json"
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class ChannelHealthConfig(Section, frozen=True):
    # A channel whose deliveries have failed, without one success, for this long is disabled
    # automatically; 0 turns automatic disabling off (410 and 403 answers still disable).
    disable_after_failing_seconds: NonNegativeFloat = 5 * 86_400.0


class MaintenanceConfig(Section, frozen=True):
    interval_seconds: PositiveFloat = 30.0
    # A PENDING/RETRYING delivery this long past its due time, with no outbox row, is enqueued
    # again (the broker lost its message).
    stuck_after_seconds: PositiveFloat = 600.0
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 500
    # Events (with their deliveries and attempts) older than this are deleted; 0 keeps them all.
    retention_days: Annotated[int, msgspec.Meta(ge=0)] = 30


class SentryConfig(Section, frozen=True):
    dsn: str = ""
    environment: str = ""
