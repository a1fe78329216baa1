"""The operator webhook of failure alerts: one signed POST per try (Standard Webhooks headers,
signed as a webhook channel's deliveries are, ``adapters.webhook.signing``), and the tries."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import httpx
import msgspec
import trio

from notifier.adapters.webhook.signing import sign
from notifier.alerts.context import AlertContext
from notifier.errors import NotifierError

log = logging.getLogger("notifier.alerts")

ALERT_TYPE = "delivery.dead"


class AlertNotSent(NotifierError):
    """A try of an alert failed; ``retriable`` says whether another try may succeed (a
    refusal, 4xx but 408 and 429, will not)."""

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


def alert_id(context: AlertContext) -> str:
    """The ``webhook-id`` of an alert, the same for each of its tries (receivers deduplicate
    by it): the delivery and the attempt that ended it (a replayed delivery can die again)."""
    return f"dead_{context.delivery_id}_{context.attempt}"


def alert_body(context: AlertContext) -> bytes:
    """``{"type": "delivery.dead", "timestamp", "data": <the context>}``, as a webhook channel's
    envelope is shaped."""
    return msgspec.json.encode({"type": ALERT_TYPE, "timestamp": context.dead_at, "data": context})


def alert_request(
    context: AlertContext, secret: str | None, now: int
) -> tuple[dict[str, str], bytes]:
    """The headers and body of one try: ``webhook-id``, ``webhook-timestamp`` (this try's) and,
    with a secret, ``webhook-signature`` (``v1,<base64 HMAC-SHA256 of id.timestamp.body>``)."""
    body = alert_body(context)
    msg_id = alert_id(context)
    headers = {
        "content-type": "application/json",
        "user-agent": "notifier-alerts",
        "webhook-id": msg_id,
        "webhook-timestamp": str(now),
    }
    if secret:
        headers["webhook-signature"] = sign(secret, msg_id, now, body)
    return headers, body


class WebhookAlertSink:
    """POSTs alerts to ``url``. The client is its own (not the webhook channels' pool, whose
    SSRF rules are for tenants' receivers: this URL is the operator's) and follows no redirect.
    ``transport`` replaces the network (tests pass ``httpx.MockTransport``)."""

    name = "webhook"

    def __init__(
        self,
        url: str,
        secret: str | None,
        *,
        timeout_seconds: float,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._url = url
        self._secret = secret
        self._clock = clock
        self._client = httpx.AsyncClient(
            timeout=timeout_seconds, follow_redirects=False, transport=transport,
            trust_env=False,
        )  # fmt: skip

    async def send(self, context: AlertContext) -> None:
        """Trio-flavoured. One try; ``AlertNotSent`` unless the receiver answered 2xx."""
        headers, body = alert_request(context, self._secret, int(self._clock()))
        try:
            response = await self._client.post(self._url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            # The exception's text may quote the URL (the operator's token in its query): the
            # kind alone.
            raise AlertNotSent(f"POST failed: {type(exc).__name__}") from None
        if 200 <= response.status_code < 300:
            return
        retriable = response.status_code in (408, 429) or response.status_code >= 500
        raise AlertNotSent(f"HTTP {response.status_code}", retriable=retriable)

    async def aclose(self) -> None:
        await self._client.aclose()


async def send_with_tries(
    send: Callable[[], Awaitable[None]],
    *,
    max_tries: int,
    backoff_seconds: float,
    stopping: Callable[[], bool] = lambda: False,
) -> tuple[bool, str | None]:
    """Trio-flavoured. ``send()`` up to ``max_tries`` times, waiting ``backoff_seconds``
    before the second try and twice as long before each next one; no more tries once a refusal
    says none would help or ``stopping()`` is true. Returns whether it was sent and the last
    failure."""
    failure: str | None = None
    for attempt in range(1, max_tries + 1):
        if attempt > 1:
            if stopping():
                break
            await trio.sleep(backoff_seconds * 2 ** (attempt - 2))
        try:
            await send()
            return True, None
        except AlertNotSent as exc:
            failure = str(exc)
            if not exc.retriable:
                break
    return False, failure
