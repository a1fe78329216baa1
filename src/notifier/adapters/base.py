"""The channel contracts (docs/architecture.md §9): a ``ChannelValidator`` checks a channel's config
at create and PATCH (no secrets, built in every role that serves the API); an ``Adapter`` delivers
one message (the deliverer: it holds the secrets and the connections, built only for workers)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from notifier.errors import InvalidInput
from notifier.messages import WorkerMessage
from notifier.ratelimit import Bucket


class InvalidChannelConfig(InvalidInput):
    """A channel's config is unusable; ``field`` names the offending key (e.g. ``config.url``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Receipt(msgspec.Struct, frozen=True):
    """What a successful delivery tells the attempt log."""

    status_code: int | None = None
    response_excerpt: str | None = None


@runtime_checkable
class ChannelValidator(Protocol):
    secret_fields: frozenset[str]  # config keys never shown after creation, kept across PATCH

    def prepare_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """Validate a channel config at create/patch and fill in defaults (e.g. a generated
        secret). Raise ``InvalidChannelConfig`` naming the field."""
        ...


class Adapter(Protocol):
    """A deliverer: the I/O of one channel type."""

    channel_type: str

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        """Deliver once. Raise ``RetriableError`` or ``PermanentError`` on failure."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class KeepsDeadline(Protocol):
    """Optional: an adapter whose every attempt ends at the worker group's ``timeout_seconds``
    by itself, its error naming the phase that ran out (the webhook's: resolution, connect, TLS,
    request, answer, body). The worker's own limit on the call is then a backstop, a little
    later, so that the adapter's error is the one recorded."""

    keeps_deadline: bool


@runtime_checkable
class UpdatesConfig(Protocol):
    """Optional: a validator whose PATCH needs the stored config (e.g. a webhook secret rotation
    keeps the replaced secret). Without it, a PATCH calls ``prepare_config`` alone."""

    def prepare_config_update(
        self, config: dict[str, Any], previous: dict[str, Any]
    ) -> dict[str, Any]:
        """``prepare_config`` for a PATCH; ``previous`` is the stored config. The API has
        already carried the stored ``secret_fields`` over into ``config`` where absent."""
        ...


@runtime_checkable
class ChecksDestination(Protocol):
    """Optional: checks of a prepared config that need I/O (e.g. resolving a webhook host),
    run at channel create/patch after ``prepare_config``."""

    async def check_destination(self, config: dict[str, Any]) -> None:
        """Raise ``InvalidChannelConfig`` naming the field."""
        ...


@runtime_checkable
class ChecksTenant(Protocol):
    """Optional: checks of a prepared config that depend on the tenant that owns the channel
    (e.g. a webhook's client certificate, which the operator may keep for some tenants), run
    at channel create/patch after ``prepare_config``."""

    def check_tenant(self, config: dict[str, Any], tenant_id: uuid.UUID) -> None:
        """Raise ``InvalidChannelConfig`` naming the field."""
        ...


@runtime_checkable
class RateLimiter(Protocol):
    """Optional: an adapter whose destination limits the rate (Telegram: per chat, per bot)."""

    def rate_buckets(self, message: WorkerMessage) -> Sequence[Bucket]:
        """The shared buckets (``notifier.ratelimit``) a delivery of this message needs a token
        of; empty: none. The worker takes them, with the channel's own, in one statement, all
        or none, before it calls ``deliver``; when one is empty the message waits in a delay
        tier, its attempt unused."""
        ...


@runtime_checkable
class HasDestinations(Protocol):
    """Optional: an adapter that knows which receiver a delivery goes to. Deliveries to one
    destination share its fair share of a worker group's tasks and its circuit breaker
    (docs/architecture.md §5); an adapter without it has one destination per channel."""

    def destination(self, message: WorkerMessage) -> str:
        """A short, stable key naming the receiver (the webhook's origin, ``scheme://host:port``);
        never a secret, since it appears in metrics, logs and the API."""
        ...


@runtime_checkable
class NamesDestinations(Protocol):
    """Optional, of a channel validator: the destination a stored channel config delivers to,
    the same key its adapter's ``HasDestinations.destination`` names (None: the channel's own).
    What the API and the console find a channel's circuit by (docs/architecture.md §5)."""

    def config_destination(self, config: dict[str, Any]) -> str | None: ...


def channel_destination(validator: object, channel_id: uuid.UUID, config: dict[str, Any]) -> str:
    """The destination key of a stored channel, as ``destination_of`` names its messages'."""
    if isinstance(validator, NamesDestinations) and (named := validator.config_destination(config)):
        return named
    return f"channel:{channel_id}"


def destination_of(adapter: object, message: WorkerMessage) -> str:
    """The destination key of ``message``: the adapter's, or its channel's when the adapter
    names none."""
    return destination_namer(adapter)(message)


def channel_of(message: WorkerMessage) -> str:
    """The destination of a message whose adapter names none: its channel."""
    return f"channel:{message.channel_id}"


def destination_namer(adapter: object) -> Callable[[WorkerMessage], str]:
    """``destination_of`` for one adapter, with the check of what it can name made once (an
    ``isinstance`` of a runtime-checkable protocol walks the protocol's members every time:
    a worker names two destinations per message)."""
    if isinstance(adapter, HasDestinations):
        return adapter.destination
    return channel_of


def public_config(validator: ChannelValidator | None, config: dict[str, Any]) -> dict[str, Any]:
    """The config as the API shows it after creation: secret fields left out."""
    hidden = validator.secret_fields if validator else frozenset({"secret"})
    return {k: v for k, v in config.items() if k not in hidden}
