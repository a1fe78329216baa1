"""The one exception hierarchy of notifier: every error it raises on purpose derives from
``NotifierError``. Library errors are mapped to these at each boundary.

    NotifierError
    ├── ConfigError              the configuration file or environment (the CLI exits 2)
    ├── InvalidInput             what a caller sent is refused (also a ValueError)
    │   ├── adapters.base.InvalidChannelConfig
    │   ├── ingest.jsonguard.JsonRefused
    │   └── ingest.jsonguard.BodyRefused
    ├── StoreError               Postgres
    │   ├── StoreUnavailable
    │   │   └── store.base.StoreConflict
    │   ├── UnstorableText
    │   └── store.errors: TenantExists, IdempotencyConflict, UnknownChannels, ConfigChanged,
    │       NotFound, NotReplayable (what a caller asked of the store)
    ├── BrokerError              RabbitMQ
    ├── DeliveryError            one delivery attempt's outcome
    │   ├── RetriableError
    │   └── PermanentError
    ├── AdapterCrash             an adapter's I/O layer raised the unexpected (a bug)
    │   ├── adapters.webhook.WebhookAdapterCrash
    │   └── adapters.telegram.TelegramAdapterCrash
    ├── alerts.webhook.AlertNotSent  one try of an operator alert failed (the alert task retries)
    ├── adapters.webhook.resolver.ResolutionError   a host name did not resolve (an OSError too)
    └── ingest.api.http.ApiError an HTTP answer other than success, raised in a route only
"""

from __future__ import annotations


class NotifierError(Exception):
    """Base of every error notifier raises on purpose."""


class ConfigError(NotifierError):
    """The configuration file or environment is invalid; the message names the key."""


class InvalidInput(NotifierError, ValueError):
    """What a caller sent (a request body, a channel config) is refused: bad input, answered
    with a 4xx, never a server fault. Also a ``ValueError``, so that a struct's
    ``__post_init__`` may raise it and msgspec reports it as a validation error."""


class StoreError(NotifierError):
    """Postgres failed or is unreachable."""


class StoreUnavailable(StoreError):
    """Postgres cannot be reached right now; the caller may try again later."""


class UnstorableText(StoreError):
    """Postgres refused a string it cannot hold: ``text`` and ``jsonb`` have no U+0000 (NUL).
    Bad input, not a server fault: the API answers 422."""


class BrokerError(NotifierError):
    """RabbitMQ failed or is unreachable (connection or channel lost, publish timed out)."""


class DeliveryError(NotifierError):
    """An adapter could not deliver a message."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class RetriableError(DeliveryError):
    """A delivery failed in a way that may succeed later (timeouts, 5xx, 429 ...).

    ``unreachable`` says the receiver could not be reached or did not answer (a refused or
    timed-out connection, a read that timed out): what counts towards opening the
    destination's circuit (``worker.circuit``). An answer, even a 5xx, is not."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        status_code: int | None = None,
        unreachable: bool = False,
    ) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after
        self.unreachable = unreachable


class PermanentError(DeliveryError):
    """A delivery failed in a way that will not change by trying again (most 4xx, bad config).

    ``disable_channel`` says the destination is gone for good (HTTP 410, a blocked bot): the
    channel is disabled along with this delivery ending ``DEAD``.
    """

    def __init__(
        self, message: str, *, status_code: int | None = None, disable_channel: bool = False
    ) -> None:
        super().__init__(message, status_code=status_code)
        self.disable_channel = disable_channel


class AdapterCrash(NotifierError):
    """An adapter's I/O layer raised something unexpected (a bug), re-raised with its text
    scrubbed of secrets: the worker's panic path logs and stores it, and the delivery ends
    ``DEAD``."""
