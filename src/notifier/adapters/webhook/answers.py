"""What an attempt's outcome means: an HTTP answer classified (a receipt, or a retriable or
permanent error), and an exception from sending turned into the error to raise, its text
scrubbed of the request's secrets."""

from __future__ import annotations

from collections.abc import Iterable
from email.utils import parsedate_to_datetime

from notifier.adapters.base import Receipt
from notifier.adapters.http import delivery_error
from notifier.errors import AdapterCrash, PermanentError, RetriableError
from notifier.secrets import scrub_known

RETRIABLE_STATUS = frozenset({408, 425, 429})


def parse_retry_after(value: str | None, now: float) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def classify(
    status_code: int,
    retry_after: str | None,
    excerpt: str,
    now: float,
    location: str | None = None,
) -> Receipt:
    """2xx → receipt; 408/425/429/5xx → ``RetriableError`` (with ``Retry-After``); 410 →
    ``PermanentError`` that disables the channel; 3xx (never followed) and anything else →
    ``PermanentError``."""
    if 200 <= status_code < 300:
        return Receipt(status_code=status_code, response_excerpt=excerpt or None)
    detail = f"HTTP {status_code}" + (f": {excerpt[:200]}" if excerpt else "")
    if status_code in RETRIABLE_STATUS or 500 <= status_code < 600:
        raise RetriableError(
            detail, retry_after=parse_retry_after(retry_after, now), status_code=status_code
        )
    if 300 <= status_code < 400:
        target = f" to {location[:200]}" if location else ""
        raise PermanentError(
            f"HTTP {status_code}: redirect{target} not followed (redirects are never "
            "followed; point the channel at the final URL)",
            status_code=status_code,
        )
    if status_code == 410:
        raise PermanentError(
            detail + " (the receiver is gone; channel disabled)",
            status_code=status_code,
            disable_channel=True,
        )
    raise PermanentError(detail, status_code=status_code)


class WebhookAdapterCrash(AdapterCrash):
    """An unexpected exception from the I/O layer, its text scrubbed of the request's header
    values and secrets (the worker's panic path logs and stores it)."""


def transport_error(exc: Exception, quoted: Iterable[str]) -> Exception:
    """What to raise in place of an exception from sending a request, its text scrubbed of
    ``quoted`` (``request_secrets``: an HTTP library's error may quote the request, h11 names
    an illegal header value) and of every registered secret. Timeouts and connection or
    protocol errors are retriable; anything else is an adapter crash (a bug). The caller raises
    it outside its ``except`` block, so it does not chain back to ``exc``."""
    forms = tuple(quoted)
    return delivery_error(exc, lambda text: scrub_known(text, forms), WebhookAdapterCrash)
