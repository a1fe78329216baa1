"""``[relay]``, ``[retry]`` and ``[workers.<type>]``: what every worker group has, and the email
and Telegram groups (the webhook group is in ``notifier.config.webhook``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from notifier.config.base import (
    CONSUMER_TIMEOUT_BUDGET_SECONDS,
    Positive,
    PositiveFloat,
    Section,
)
from notifier.validation import key_error


class RelayConfig(Section, frozen=True):
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 500
    poll_interval_seconds: PositiveFloat = 1.0


class RetryConfig(Section, frozen=True):
    """The retry policy: exponential backoff from ``base_seconds`` capped at ``max_seconds``,
    rounded up to a delay tier. The worker's decisions take this section as it is."""

    base_seconds: PositiveFloat = 30.0
    max_seconds: PositiveFloat = 1800.0
    tiers_seconds: tuple[Positive, ...] = (1, 5, 15, 30, 60, 120, 240, 480, 960, 1800)

    def __post_init__(self) -> None:
        if not self.tiers_seconds:
            raise key_error("tiers_seconds", "must not be empty")
        if list(self.tiers_seconds) != sorted(set(self.tiers_seconds)):
            raise key_error("tiers_seconds", "must be strictly increasing")


class WorkerGroupConfig(Section, frozen=True):
    """What every ``[workers.<type>]`` table has."""

    concurrency: Positive = 16
    prefetch: Positive = 64
    max_attempts: Positive = 5
    timeout_seconds: PositiveFloat = 10.0
    # The most worker tasks one destination (a webhook's origin; another type's channel) may
    # hold; unset: a quarter of concurrency (at least 1). docs/architecture.md §5.
    max_in_flight_per_destination: Positive | None = None
    # The circuit breaker of each destination (docs/architecture.md §5): this many consecutive
    # unreachable failures open it (0: no breaker); a half-open probe is tried after the base
    # interval, doubling after each failed probe up to the max.
    circuit_failure_threshold: Annotated[int, msgspec.Meta(ge=0)] = 5
    circuit_probe_base_seconds: PositiveFloat = 5.0
    circuit_probe_max_seconds: PositiveFloat = 300.0

    def __post_init__(self) -> None:
        if self.prefetch < self.concurrency:
            raise key_error("prefetch", f"must be at least concurrency ({self.concurrency})")
        cap = self.max_in_flight_per_destination
        if cap is not None and cap > self.concurrency:
            raise key_error(
                "max_in_flight_per_destination",
                f"must be at most concurrency ({self.concurrency})",
            )
        if self.circuit_probe_max_seconds < self.circuit_probe_base_seconds:
            base = self.circuit_probe_base_seconds
            raise key_error(
                "circuit_probe_max_seconds",
                f"must be at least circuit_probe_base_seconds ({base:g})",
            )
        # A prefetched message may wait for ceil(prefetch / concurrency) deliveries before its
        # own, and then, in its destination's waiting list, for one more; all of it must stay
        # far below RabbitMQ's consumer_timeout (30 min by default), or the broker closes the
        # channel and every unacked message is delivered again.
        worst = self.timeout_seconds * (-(-self.prefetch // self.concurrency) + 1)
        if worst > CONSUMER_TIMEOUT_BUDGET_SECONDS:
            raise key_error(
                "timeout_seconds",
                f"timeout_seconds * (ceil(prefetch / concurrency) + 1) = {worst:g} s; it must "
                f"stay under {CONSUMER_TIMEOUT_BUDGET_SECONDS} s (half of RabbitMQ's "
                "consumer_timeout)",
            )

    @property
    def in_flight_per_destination(self) -> int:
        """``max_in_flight_per_destination``, or its default: a quarter of ``concurrency``."""
        if self.max_in_flight_per_destination is not None:
            return self.max_in_flight_per_destination
        return max(1, self.concurrency // 4)


class EmailWorkersConfig(WorkerGroupConfig, frozen=True):
    concurrency: Positive = 4
    prefetch: Positive = 16
    smtp_host: str = "127.0.0.1"
    smtp_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 25
    smtp_security: Literal["none", "starttls", "tls"] = "none"
    smtp_username: str = ""
    # The password is read from this environment variable, never from the file.
    smtp_password_env: str = "NOTIFIER_SMTP_PASSWORD"
    from_address: str = msgspec.field(name="from", default="notifier@localhost")


class TelegramWorkersConfig(WorkerGroupConfig, frozen=True):
    concurrency: Positive = 8
    prefetch: Positive = 32
    # The bot token is read from this environment variable, never from the file.
    bot_token_env: str = "NOTIFIER_TELEGRAM_TOKEN"
    api_base_url: str = "https://api.telegram.org"
    per_chat_per_second: PositiveFloat = 1.0
    per_bot_per_second: PositiveFloat = 30.0
    # One tenant's share of the bot: unset, a quarter of per_bot_per_second.
    per_tenant_per_second: PositiveFloat | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        tenant = self.per_tenant_per_second
        if tenant is not None and tenant > self.per_bot_per_second:
            raise key_error(
                "per_tenant_per_second",
                f"must be at most per_bot_per_second ({self.per_bot_per_second:g}), got {tenant:g}",
            )

    @property
    def tenant_rate_per_second(self) -> float:
        """``per_tenant_per_second``, or a quarter of ``per_bot_per_second`` when unset."""
        tenant = self.per_tenant_per_second
        return self.per_bot_per_second / 4 if tenant is None else tenant
