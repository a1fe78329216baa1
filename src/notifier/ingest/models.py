"""Request bodies of the HTTP API; msgspec validates them (400 for bad JSON, 422 otherwise)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from notifier import filters_spec
from notifier.config import MIN_RATE_PER_SECOND
from notifier.validation import whole

# An event type: dot-separated words of letters, digits, '_', '-' and ':'.
EVENT_TYPE_RE = whole(r"[A-Za-z0-9_:-]+(\.[A-Za-z0-9_:-]+)*")
# A channel's subscription: an exact event type, 'prefix.*' or '*'.
PATTERN_RE = whole(r"\*|[A-Za-z0-9_:-]+(\.[A-Za-z0-9_:-]+)*(\.\*)?")

EventType = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=EVENT_TYPE_RE)]
Pattern = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=PATTERN_RE)]
# Text Postgres can store: no NUL (the JSON guard refuses it first, naming the path; the
# pattern says so in the OpenAPI document).
NO_NUL = whole(r"[^\x00]*")
Recipient = Annotated[str, msgspec.Meta(min_length=1, max_length=500, pattern=NO_NUL)]
IdempotencyKey = Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=NO_NUL)]
# The Idempotency-Key header: visible ASCII, spaces only inside (HTTP trims a value's ends).
IDEMPOTENCY_HEADER_PATTERN = whole(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
Name = Annotated[str, msgspec.Meta(max_length=200, pattern=NO_NUL)]
MaxAttempts = Annotated[int, msgspec.Meta(ge=1, le=100)]
# Deliveries per second to one channel, across every worker process: one an hour at least.
RatePerSecond = Annotated[
    float,
    msgspec.Meta(
        ge=MIN_RATE_PER_SECOND, le=10_000,
        description="At most this many deliveries per second to this channel, across every "
        "worker process (e.g. 0.5 = one every 2 s), at least 1/3600 (one an hour); null = no "
        "limit. A message over it waits in a delay tier without using up an attempt.",
    ),
]  # fmt: skip
# A payload: an object of any JSON values, as the JSON guard takes them (the nesting depth aside,
# which JSON Schema cannot bound): no NUL in a string or key, integers of 64 bits. The OpenAPI
# document defines the value schema once, as a component.
JSON_VALUE = "JsonValue"
_VALUE_REF = {"$ref": f"#/components/schemas/{JSON_VALUE}"}
JSON_VALUE_SCHEMA: dict[str, Any] = {
    "description": "Any JSON value: no NUL in a string or key, an integer within 64 bits.",
    "anyOf": [
        {"type": "null"}, {"type": "boolean"},
        {"type": "number", "minimum": -(2**63), "maximum": 2**63 - 1},
        {"type": "string", "pattern": NO_NUL},
        {"type": "array", "items": _VALUE_REF},
        {"type": "object", "propertyNames": {"pattern": NO_NUL},
         "additionalProperties": _VALUE_REF},
    ],
}  # fmt: skip
Payload = Annotated[
    dict[str, Any],
    msgspec.Meta(
        extra_json_schema={"propertyNames": {"pattern": NO_NUL}, "additionalProperties": _VALUE_REF}
    ),
]
# A channel's payload filter: checked by notifier.filters.parse (the route names the place of a
# problem); its grammar is the OpenAPI document's component FILTER.
FILTER = "ChannelFilter"
FILTER_SCHEMA = filters_spec.json_schema(f"#/components/schemas/{FILTER}", NO_NUL)
ChannelFilter = Annotated[
    dict[str, Any], msgspec.Meta(extra_json_schema={"$ref": f"#/components/schemas/{FILTER}"})
]
ChannelIds = Annotated[list[uuid.UUID], msgspec.Meta(min_length=1, max_length=100)]
# A channel's customer label: the tenant's own customer it belongs to (a portal link's scope).
CUSTOMER_RE = whole(r"[A-Za-z0-9_.:@-]+")
Customer = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=200, pattern=CUSTOMER_RE,
        description="The tenant's own customer this channel belongs to: letters, digits and "
        "`_.:@-`. A portal link scoped to it reaches the channels so labelled.",
    ),
]  # fmt: skip
ChannelType = Annotated[str, msgspec.Meta(min_length=1, max_length=50, pattern=NO_NUL)]


class _Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


Ordering = Literal["none", "fifo"]


class ChannelIn(_Body):
    type: ChannelType
    config: dict[str, Any]
    name: Name = ""
    recipient: Recipient | None = None
    event_types: Annotated[list[Pattern], msgspec.Meta(min_length=1, max_length=100)] = (
        msgspec.field(default_factory=lambda: ["*"])
    )
    enabled: bool = True
    max_attempts: MaxAttempts | None = None
    rate_limit_per_second: RatePerSecond | None = None
    filter: ChannelFilter | None = None
    customer: Customer | None = None
    # "fifo": attempted one at a time in acceptance order (README "Ordered delivery (FIFO)")
    ordering: Ordering = "none"


class ChannelPatch(_Body):
    config: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    name: Name | msgspec.UnsetType = msgspec.UNSET
    recipient: Recipient | msgspec.UnsetType | None = msgspec.UNSET
    event_types: (
        Annotated[list[Pattern], msgspec.Meta(min_length=1, max_length=100)] | msgspec.UnsetType
    ) = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET
    max_attempts: MaxAttempts | msgspec.UnsetType | None = msgspec.UNSET
    rate_limit_per_second: RatePerSecond | msgspec.UnsetType | None = msgspec.UNSET
    filter: ChannelFilter | msgspec.UnsetType | None = msgspec.UNSET  # null: no filter
    customer: Customer | msgspec.UnsetType | None = msgspec.UNSET  # null: no customer label
    ordering: Ordering | msgspec.UnsetType = msgspec.UNSET


class EventIn(_Body):
    type: EventType
    payload: Payload
    recipient: Recipient | None = None
    channel_ids: ChannelIds | None = None
    idempotency_key: IdempotencyKey | None = None


class BatchIn(_Body):
    events: Annotated[list[EventIn], msgspec.Meta(min_length=1)]


ReplayStatus = Annotated[str, msgspec.Meta(pattern=whole("DEAD|DELIVERED"))]
ReplayLimit = Annotated[int, msgspec.Meta(ge=1, le=1000)]
Cursor = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=NO_NUL)]
# RFC 3339, with its offset: a time without one would depend on how Postgres reads it.
Timestamp = Annotated[datetime, msgspec.Meta(tz=True)]


class NoFields(_Body):
    """A body that may only be ``{}`` (``POST /v1/deliveries/{id}/retry``)."""


class ReplayIn(_Body):
    """``POST /v1/deliveries/retry``: which finished deliveries to enqueue again."""

    status: ReplayStatus = "DEAD"
    channel_id: uuid.UUID | None = None
    event_type: Pattern | None = None  # an exact type, 'prefix.*' or '*'
    created_after: Timestamp | None = None
    created_before: Timestamp | None = None
    limit: ReplayLimit = 100
    # `next_cursor` of the previous answer: go on after the deliveries it replayed.
    cursor: Cursor | None = None


Description = Annotated[str, msgspec.Meta(max_length=2000, pattern=NO_NUL)]


class EventTypeIn(_Body):
    """``PUT /v1/event-types/{name}``: the type's description and JSON Schema (draft 2020-12),
    which the payloads of events of that type must match."""

    schema: Annotated[
        dict[str, Any],
        msgspec.Meta(
            description="A JSON Schema (draft 2020-12), at most 64 KiB as JSON; `$ref`s only "
            "inside it; `format` is not checked.",
            # Any JSON, as a payload: no NUL in a string or key, integers of 64 bits.
            extra_json_schema={"propertyNames": {"pattern": NO_NUL},
                               "additionalProperties": _VALUE_REF},
        ),
    ]  # fmt: skip
    description: Description = ""


class TenantPatch(_Body):
    """``PATCH /v1/tenant``: the tenant's settings."""

    strict_event_types: bool | msgspec.UnsetType = msgspec.UNSET


# A portal link lives at least a minute and at most a week; an hour unless said.
PORTAL_LINK_MIN_SECONDS = 60
PORTAL_LINK_MAX_SECONDS = 7 * 86_400
PORTAL_LINK_DEFAULT_SECONDS = 3600


class PortalLinkIn(_Body):
    """``POST /v1/portal-links``: a link scoped to the channels labelled `customer`, or to
    `channel_ids` (exactly one of them), living `expires_in_seconds`."""

    customer: Customer | None = None
    channel_ids: ChannelIds | None = None
    expires_in_seconds: Annotated[
        int, msgspec.Meta(ge=PORTAL_LINK_MIN_SECONDS, le=PORTAL_LINK_MAX_SECONDS)
    ] = PORTAL_LINK_DEFAULT_SECONDS
