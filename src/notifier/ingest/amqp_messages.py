"""What one AMQP ingest message means, decided without I/O: the event it carries and whose, or
why it cannot be stored (the reason its dead-letter copy carries), and that copy itself.

The body is what ``POST /v1/events`` takes; a message that the HTTP API would refuse is refused
with the same error code (``invalid_json``, ``validation_error`` ...), plus two codes of its own:
``unknown_app_id`` (no ``app_id``, or one ``[amqp_ingest] tenants`` does not map) and
``unknown_tenant`` (mapped to a tenant name that does not exist).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from notifier.broker.base import Incoming, Outgoing
from notifier.ingest import jsonguard
from notifier.ingest.events import new_event
from notifier.ingest.models import EventIn
from notifier.store.rows import NewEvent

ERROR_HEADER = "x-notifier-error"  # the reason, for people
ERROR_CODE_HEADER = "x-notifier-error-code"  # the reason's code, for programs
MAX_REASON_CHARS = 1000
NUL_MESSAGE = jsonguard.NUL_MESSAGE


class Rejected(NamedTuple):
    """Why a message cannot be stored; it goes to the dead-letter queue with this."""

    code: str
    message: str


class Parsed(NamedTuple):
    tenant: str  # the tenant's name, from the message's app_id
    event: NewEvent


def parse_message(
    body: bytes,
    *,
    app_id: str | None,
    message_id: str | None,
    content_type: str | None,
    tenants: Mapping[str, str],
    max_body_bytes: int,
    traceparent: str | None = None,
) -> Parsed | Rejected:
    """Decide what a message is. The idempotency key is the body's ``idempotency_key`` or, if
    it has none, the message's AMQP ``message_id`` (so a message delivered twice is a replay).
    ``traceparent``: the message's header of that name, checked; the event keeps it."""
    if len(body) > max_body_bytes:
        return Rejected(
            "request_entity_too_large",
            f"body is {len(body)} bytes, over ingest.max_body_bytes ({max_body_bytes})",
        )
    if not app_id:
        return Rejected("unknown_app_id", "the message has no app_id, so no tenant")
    tenant = tenants.get(app_id)
    if tenant is None:
        return Rejected("unknown_app_id", f"app_id {app_id!r} is not mapped to a tenant")
    if content_type and content_type.split(";")[0].strip().lower() != "application/json":
        return Rejected(
            "unsupported_media_type", f"content_type must be application/json, not {content_type!r}"
        )
    data = decode_event(body)
    if isinstance(data, Rejected):
        return data
    key = data.idempotency_key or message_id or None
    if key is not None and not 1 <= len(key) <= 255:
        return Rejected("validation_error", "message_id: as idempotency key, 1 to 255 characters")
    if key is not None and "\x00" in key:  # the body's texts were checked by jsonguard
        return Rejected("validation_error", NUL_MESSAGE)
    return Parsed(tenant, new_event(data, key, traceparent=traceparent))


def decode_event(body: bytes) -> EventIn | Rejected:
    """The body as ``EventIn``, or why not (``invalid_json`` or ``validation_error``), by the
    same rules as the HTTP API's (``jsonguard``)."""
    try:
        return jsonguard.decode(body, EventIn)
    except jsonguard.BodyRefused as exc:
        return Rejected(exc.code, exc.message)


def dead_letter_copy(
    message: Incoming, reason: Rejected, *, exchange: str, routing_key: str
) -> Outgoing:
    """The message as it came (body, ``message_id``, ``app_id``, headers and the other
    properties), with the reason in two more headers."""
    headers = {
        **message.headers,
        ERROR_HEADER: reason.message[:MAX_REASON_CHARS],
        ERROR_CODE_HEADER: reason.code,
    }
    # Unset properties stay unset (no default content_type on a body that may not be JSON).
    properties = {"content_type": None, **message.properties, "app_id": message.app_id}
    return Outgoing(exchange, routing_key, message.body, message.message_id or "", headers,
                    properties)  # fmt: skip
