"""The one exception hierarchy of notifier. Library errors are mapped to these at each boundary."""

from __future__ import annotations


class NotifierError(Exception):
    """Base of every error notifier raises on purpose."""


class ConfigError(NotifierError):
    """The configuration file or environment is invalid; the message names the key."""


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
    """A delivery failed in a way that may succeed later (timeouts, 5xx, 429 ...)."""

    def __init__(
        self, message: str, *, retry_after: float | None = None, status_code: int | None = None
    ) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after


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
