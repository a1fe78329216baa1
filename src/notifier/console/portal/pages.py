"""The portal's pages, for one customer of a tenant, within its link's scope: opening a link,
the endpoints (webhook channels: list, create, edit URL, event types and enabled; a new signing
secret; a test event), the delivery log with each delivery's attempts, and replay. Every channel
or delivery is looked up through the scope's SQL (``notifier.store.portal``): one outside the
scope answers 404, as one that does not exist."""

from __future__ import annotations

import json
import re
import urllib.parse
import uuid
from typing import Any, cast

from quart import Response, redirect, request

from notifier import filters
from notifier.adapters.webhook import generate_secret
from notifier.console.portal.links import token_hash, well_formed
from notifier.console.portal.web import (
    PREFIX,
    end_cookie,
    not_found,
    page,
    portal_store,
    routes,
    scope,
    start_session,
    uuid_or_none,
)
from notifier.console.portal.web import current_session as current_portal_session
from notifier.console.session import new_session_id, session_id_hash
from notifier.console.web import ConsoleError, console_context
from notifier.ingest.api.channels import (
    PATCH_CONFIG_TRIES,
    patched_config,
    prepare,
    validator_for,
)
from notifier.ingest.api.context import api_context
from notifier.ingest.api.events import ingest
from notifier.ingest.api.http import ApiError
from notifier.ingest.api.pagination import decode_cursor, encode_cursor
from notifier.ingest.events import new_event
from notifier.ingest.models import PATTERN_RE, EventIn
from notifier.store.errors import ConfigChanged, NotFound, NotReplayable, UnknownChannels
from notifier.store.portal import PortalScope
from notifier.store.rows import DELIVERY_STATUSES, TERMINAL_STATUSES, Channel, ChannelChanges

ENDPOINT_TYPE = "webhook"  # the portal makes and edits webhook endpoints
MAX_ENDPOINTS = 500
# The endpoints a customer-scoped portal may hold: beyond, it makes none (the tenant's API may).
MAX_CUSTOMER_ENDPOINTS = 50
PAGE_SIZE = 50
MAX_NAME_CHARS = 200
MAX_URL_CHARS = 2048
MAX_EVENT_TYPES = 100
TEST_EVENT_TYPE = "notifier.test"
# Config fields of a webhook that carry credentials the tenant set: they go wherever the URL
# points, so the portal never changes the URL of an endpoint that has any of them.
TENANT_CREDENTIALS = ("headers", "oauth2", "tls_client_certificate")
FILTERED_OUT = (
    "The endpoint's payload filter drops the test event (its payload is "
    '{"test": true, "channel_id": …}): ask the service that sent you here to send a real one.'
)
PATTERN = re.compile(PATTERN_RE)
NOTICES = {
    "replayed": "The delivery was queued again.",
    "test": "A test event was sent to the endpoint: this is its delivery.",
    "saved": "The endpoint was saved.",
}


# -- entering -----------------------------------------------------------------------------------


@routes.get("/enter/<token>")
async def enter(token: str) -> Response:
    """Open a session from a link: its token's hash found, the link neither expired nor revoked,
    its tenant enabled; then off to the portal, so the token leaves the address bar."""
    store = portal_store()
    entries = api_context().metrics.portal_entries
    link = await store.portal_link_by_token(token_hash(token)) if well_formed(token) else None
    if link is None:
        entries.labels("invalid").inc()
        raise ConsoleError(403, "This link is not valid.")
    if link.state != "active":
        entries.labels(link.state).inc()
        ended = "has expired" if link.state == "expired" else "was revoked"
        raise ConsoleError(410, f"This link {ended}: ask for a new one.")
    if (previous := current_portal_session()) is not None:
        await store.end_portal_session(session_id_hash(previous))
    session_id = new_session_id()
    expires_at = await store.create_portal_session(
        session_id_hash(session_id), link.id,
        max_age_seconds=console_context().sessions.max_age_seconds,
    )  # fmt: skip
    if expires_at is None:  # expired or revoked meanwhile
        entries.labels("expired").inc()
        raise ConsoleError(410, "This link has ended: ask for a new one.")
    entries.labels("opened").inc()
    start_session(session_id, expires_at)
    return cast(Response, redirect(f"{PREFIX}/", 303))


@routes.post("/leave")
async def leave() -> Response:
    """End the session at once (its row deleted)."""
    session_id = current_portal_session()
    if session_id is not None:
        await portal_store().end_portal_session(session_id_hash(session_id))
    response = await page("error.html", 200, message="You have left the portal.",
                          in_session=False)  # fmt: skip
    return end_cookie(response)


# -- endpoints ----------------------------------------------------------------------------------


async def _channel(within: PortalScope, channel_id: uuid.UUID) -> Channel:
    found = await portal_store().portal_channel(within, channel_id)
    if found is None:
        raise not_found("endpoint")
    return found


def _url(channel: Channel) -> str:
    url = channel.config.get("url")
    return url if isinstance(url, str) else ""


def audience(within: PortalScope, channel: Channel) -> str | None:
    """The customer whose events ``channel`` may receive, when the portal may choose its event
    types: fan-out sends a channel the events whose ``recipient`` equals the channel's, so only a
    channel addressed to the customer in scope (its ``recipient`` is that label: the session's
    customer, or for a link of channel ids the channel's own ``customer``) can widen its types
    without receiving events meant for the tenant or another customer. None: read-only."""
    customer = within.customer if within.customer is not None else channel.customer
    if customer is not None and channel.recipient == customer:
        return customer
    return None


def tenant_credentials(channel: Channel) -> list[str]:
    """The credential fields the tenant set in the endpoint's config (custom headers, OAuth2,
    a TLS client certificate)."""
    return [k for k in TENANT_CREDENTIALS if channel.config.get(k)]


async def _catalog(tenant_id: uuid.UUID) -> list[str]:
    """The tenant's registered event types (empty: it has no catalog)."""
    return [t.name for t in await api_context().store.list_event_types(tenant_id)]


def read_event_types(form: Any, catalog: list[str]) -> list[str]:
    """The event types a form chose: among ``catalog`` (checkboxes) when the tenant has one,
    else patterns (exact, ``prefix.*`` or ``*``) separated by commas or spaces."""
    if catalog:
        chosen = [t for t in form.getlist("event_type") if t]
        if unknown := sorted(set(chosen) - set(catalog)):
            raise ConsoleError(400, f"Event types: not offered here: {', '.join(unknown)}")
    else:
        text = str(form.get("event_types", "")).replace(",", " ")
        chosen = text.split()
        if bad := [p for p in chosen if len(p) > 200 or not PATTERN.fullmatch(p)]:
            raise ConsoleError(400, f"Event types: not a type or pattern: {bad[0][:200]}")
    chosen = list(dict.fromkeys(chosen))
    if not chosen:
        raise ConsoleError(400, "Event types: choose at least one.")
    if len(chosen) > MAX_EVENT_TYPES:
        raise ConsoleError(400, f"Event types: at most {MAX_EVENT_TYPES}.")
    return chosen


def posted_event_types(form: Any, catalog: list[str]) -> set[str] | None:
    """The event types a form carries, as posted (None: it has none, as a read-only form)."""
    if catalog:
        chosen = [t for t in form.getlist("event_type") if t]
        return set(chosen) if chosen else None
    if "event_types" not in form:
        return None
    return set(str(form.get("event_types", "")).replace(",", " ").split())


def _name(form: Any) -> str:
    name = str(form.get("name", "")).strip()
    if len(name) > MAX_NAME_CHARS or "\x00" in name:
        raise ConsoleError(400, f"Name: at most {MAX_NAME_CHARS} characters.")
    return name


def _url_field(form: Any) -> str:
    url = str(form.get("url", "")).strip()
    if not url or len(url) > MAX_URL_CHARS:
        raise ConsoleError(400, f"URL: required, at most {MAX_URL_CHARS} characters.")
    return url


@routes.get("/")
async def endpoints() -> Response:
    within = await scope()
    found = await portal_store().portal_channels(within, limit=MAX_ENDPOINTS)
    return await page(
        "endpoints.html", in_session=True, endpoints=[(c, _url(c)) for c in found],
        can_create=within.customer is not None, customer=within.customer,
    )  # fmt: skip


@routes.get("/endpoints/new")
async def new_endpoint() -> Response:
    within = await scope()
    if within.customer is None:
        raise ConsoleError(409, "This link covers fixed endpoints: no new one can be made here.")
    catalog = await _catalog(within.tenant_id)
    return await page("endpoint.html", in_session=True, endpoint=None, url="", catalog=catalog,
                      chosen=[], patterns="*")  # fmt: skip


@routes.post("/endpoints")
async def create_endpoint() -> Response:
    """A webhook endpoint labelled with the session's customer; its secret shown once."""
    within = await scope()
    if within.customer is None:
        raise ConsoleError(409, "This link covers fixed endpoints: no new one can be made here.")
    form = await request.form
    catalog = await _catalog(within.tenant_id)
    name, url = _name(form), _url_field(form)
    event_types = read_event_types(form, catalog)
    held = await portal_store().portal_channels(within, limit=MAX_CUSTOMER_ENDPOINTS)
    if len(held) >= MAX_CUSTOMER_ENDPOINTS:
        raise ConsoleError(
            409,
            f"At most {MAX_CUSTOMER_ENDPOINTS} endpoints can be made here: "
            "reuse one, or ask the service that sent you here.",
        )
    try:
        config = await prepare(validator_for(ENDPOINT_TYPE), {"url": url}, within.tenant_id)
    except ApiError as exc:
        raise ConsoleError(400, exc.message) from exc
    channel = await api_context().store.create_channel(
        within.tenant_id, type=ENDPOINT_TYPE, name=name, config=config, recipient=within.customer,
        event_types=event_types, enabled=True, max_attempts=None, customer=within.customer,
    )  # fmt: skip
    return await page("secret.html", in_session=True, channel=channel,
                      secret=channel.config.get("secret", ""), created=True)  # fmt: skip


@routes.get("/endpoints/<uuid:channel_id>")
async def edit_endpoint(channel_id: uuid.UUID) -> Response:
    within = await scope()
    channel = await _channel(within, channel_id)
    catalog = await _catalog(within.tenant_id)
    return await page(
        "endpoint.html", in_session=True, endpoint=channel, url=_url(channel), catalog=catalog,
        chosen=channel.event_types, patterns=" ".join(channel.event_types),
        types_editable=audience(within, channel) is not None,
        url_editable=not tenant_credentials(channel),
        notice=NOTICES.get(request.args.get("notice", "")),
    )  # fmt: skip


@routes.post("/endpoints/<uuid:channel_id>")
async def save_endpoint(channel_id: uuid.UUID) -> Response:
    """A new name, URL, event types and enabled, as one change of the channel (its URL as a
    PATCH of its config makes it: checked, its secret kept). Its event types change only on a
    channel addressed to the customer (``audience``); its URL only while the tenant set no
    credentials in its config, which would follow the URL (``tenant_credentials``)."""
    within = await scope()
    form = await request.form
    catalog = await _catalog(within.tenant_id)
    name, url = _name(form), _url_field(form)
    # Checked as posted (400) before the channel is read; a read-only form posts none.
    posted = posted_event_types(form, catalog)
    chosen = read_event_types(form, catalog) if posted is not None else None
    enabled = form.get("enabled") == "on"
    store = api_context().store
    for _ in range(PATCH_CONFIG_TRIES):
        channel = await _channel(within, channel_id)
        if channel.type != ENDPOINT_TYPE:
            raise ConsoleError(409, f"A {channel.type} channel is not edited here.")
        changes: dict[str, Any] = {"name": name, "enabled": enabled}
        if audience(within, channel) is not None:
            changes["event_types"] = chosen or read_event_types(form, catalog)
        elif chosen is not None and set(chosen) != set(channel.event_types):
            raise ConsoleError(409, "This endpoint's event types are set by the service that "
                               "sent you here: ask them to change them.")  # fmt: skip
        config_read = None
        if url != _url(channel):
            if tenant_credentials(channel):
                raise ConsoleError(409, "This endpoint carries credentials set by the service "
                                   "that sent you here: ask them to change its URL.")  # fmt: skip
            validator = validator_for(channel.type)
            kept = {k: v for k, v in channel.config.items() if k not in validator.secret_fields}
            try:
                changes["config"] = await patched_config(channel, {**kept, "url": url})
            except ApiError as exc:
                raise ConsoleError(400, exc.message) from exc
            config_read = channel.config
        try:
            updated = await store.update_channel(
                within.tenant_id, channel_id, ChannelChanges(**changes), config_read=config_read
            )
        except ConfigChanged:
            continue
        if updated is None:
            raise not_found("endpoint")
        return cast(Response, redirect(f"{PREFIX}/endpoints/{channel_id}?notice=saved", 303))
    raise ConsoleError(409, "The endpoint kept changing meanwhile: try again.")


@routes.post("/endpoints/<uuid:channel_id>/rotate-secret")
async def rotate_secret(channel_id: uuid.UUID) -> Response:
    """A new signing secret, shown once; the previous one signs on through the rotation's
    grace period (as the console's)."""
    within = await scope()
    store = api_context().store
    for _ in range(PATCH_CONFIG_TRIES):
        channel = await _channel(within, channel_id)
        validator = api_context().validators.get(channel.type)
        if validator is None or "secret" not in validator.secret_fields:
            raise ConsoleError(409, f"A {channel.type} channel has no signing secret to rotate.")
        secret = generate_secret()
        kept = {k: v for k, v in channel.config.items() if k not in validator.secret_fields}
        try:
            new_config = await patched_config(channel, {**kept, "secret": secret})
            updated = await store.update_channel(
                within.tenant_id, channel_id, ChannelChanges(config=new_config),
                config_read=channel.config,
            )  # fmt: skip
        except ApiError as exc:
            raise ConsoleError(exc.status, exc.message) from exc
        except ConfigChanged:
            continue
        if updated is None:
            raise not_found("endpoint")
        return await page("secret.html", in_session=True, channel=updated, secret=secret,
                          created=False)  # fmt: skip
    raise ConsoleError(409, "The endpoint's config kept changing meanwhile: try again.")


@routes.post("/endpoints/<uuid:channel_id>/test")
async def send_test(channel_id: uuid.UUID) -> Response:
    """A test event for this endpoint only; its delivery's page follows it."""
    within = await scope()
    channel = await _channel(within, channel_id)
    if not channel.enabled:
        raise ConsoleError(409, "The endpoint is disabled: enable it to send it a test event.")
    payload = {"test": True, "channel_id": str(channel_id)}
    if channel.filter is not None and not filters.matches(channel.filter, payload):
        raise ConsoleError(409, FILTERED_OUT)
    event = EventIn(type=TEST_EVENT_TYPE, payload=payload, channel_ids=[channel_id])
    try:
        [result] = await ingest(within.tenant_id, [new_event(event, None)])
    except ApiError as exc:
        raise ConsoleError(exc.status, exc.message) from exc
    except UnknownChannels as exc:
        raise ConsoleError(409, "The endpoint takes no event now.") from exc
    found = [d for d in result.event.deliveries if d.channel_id == channel_id]
    if not found:  # a filter set meanwhile dropped it: the event is stored, with no delivery
        raise ConsoleError(409, FILTERED_OUT)
    [delivery] = found
    return cast(Response, redirect(f"{PREFIX}/deliveries/{delivery.id}?notice=test", 303))


# -- deliveries ---------------------------------------------------------------------------------


@routes.get("/deliveries")
async def deliveries() -> Response:
    within = await scope()
    status = request.args.get("status", "").strip() or None
    if status is not None and status not in DELIVERY_STATUSES:
        raise ConsoleError(400, f"status: one of {', '.join(DELIVERY_STATUSES)}")
    channel_id = uuid_or_none(request.args.get("channel", "").strip())
    before = None
    if cursor := request.args.get("before"):
        try:
            before = decode_cursor(cursor)
        except ApiError as exc:
            raise ConsoleError(400, "before: not a position of this list") from exc
    store = portal_store()
    rows = await store.portal_deliveries(
        within, status=status, channel_id=channel_id, before=before, limit=PAGE_SIZE + 1
    )
    items = rows[:PAGE_SIZE]
    fields = {k: v for k, v in (("status", status or ""), ("channel", str(channel_id or "")))
              if v}  # fmt: skip
    next_url = None
    if len(rows) > PAGE_SIZE:
        last = items[-1].delivery
        query = {**fields, "before": encode_cursor(last.created_at, last.id)}
        next_url = f"{PREFIX}/deliveries?{urllib.parse.urlencode(query)}"
    channels = await store.portal_channels(within, limit=MAX_ENDPOINTS)
    return await page(
        "deliveries.html", in_session=True, items=items, fields=fields,
        statuses=DELIVERY_STATUSES, channels=channels, names={c.id: c.name for c in channels},
        next_url=next_url,
    )  # fmt: skip


async def _delivery_in_scope(within: PortalScope, delivery_id: uuid.UUID) -> None:
    if not await portal_store().portal_delivery_in_scope(within, delivery_id):
        raise not_found("delivery")


@routes.get("/deliveries/<uuid:delivery_id>")
async def delivery(delivery_id: uuid.UUID) -> Response:
    within = await scope()
    await _delivery_in_scope(within, delivery_id)
    store = api_context().store
    found = await store.get_delivery(within.tenant_id, delivery_id)
    if found is None:
        raise not_found("delivery")
    event = await store.get_event(within.tenant_id, found.event_id)
    channel = await portal_store().portal_channel(within, found.channel_id)
    return await page(
        "delivery.html", in_session=True, delivery=found, event=event, channel=channel,
        payload=json.dumps(event.payload, indent=2, ensure_ascii=False)
        if event and event.payload is not None else None,
        terminal=found.status in TERMINAL_STATUSES,
        notice=NOTICES.get(request.args.get("notice", "")),
    )  # fmt: skip


@routes.post("/deliveries/<uuid:delivery_id>/replay")
async def replay(delivery_id: uuid.UUID) -> Response:
    within = await scope()
    await _delivery_in_scope(within, delivery_id)
    try:
        await api_context().store.replay_delivery(within.tenant_id, delivery_id)
    except NotFound as exc:
        raise not_found("delivery") from exc
    except NotReplayable as exc:
        raise ConsoleError(409, f"This delivery cannot be replayed: {exc}.") from exc
    return cast(Response, redirect(f"{PREFIX}/deliveries/{delivery_id}?notice=replayed", 303))
