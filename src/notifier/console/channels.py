"""Channels: their health (with the circuit of their destination) and payload filters (shown,
changed through the API), enabling and disabling one, a new webhook secret (shown once, the old
one signing on through the rotation's grace period), and a test event sent to one channel,
followed on its delivery's page."""

from __future__ import annotations

import json
import uuid
from typing import cast

from quart import Response, redirect

from notifier import filters
from notifier.adapters.base import public_config
from notifier.adapters.webhook import generate_secret
from notifier.console.web import PREFIX, ConsoleError, page, routes, signed_in_tenant
from notifier.ingest.api.channels import PATCH_CONFIG_TRIES, circuits_for, patched_config
from notifier.ingest.api.context import api_context
from notifier.ingest.api.events import ingest
from notifier.ingest.api.http import ApiError
from notifier.ingest.events import new_event
from notifier.ingest.models import EventIn
from notifier.store.errors import ConfigChanged, UnknownChannels
from notifier.store.rows import Channel, ChannelChanges

MAX_CHANNELS = 500  # shown on the page
TEST_EVENT_TYPE = "notifier.test"


async def _channel(tenant_id: uuid.UUID, channel_id: uuid.UUID) -> Channel:
    found = await api_context().store.get_channel(tenant_id, channel_id)
    if found is None:
        raise ConsoleError(404, "There is no such channel.")
    return found


@routes.get("/channels")
async def channels() -> Response:
    tenant_id = await signed_in_tenant()
    ctx = api_context()
    found = await ctx.store.list_channels(
        tenant_id, type=None, recipient=None, after=None, limit=MAX_CHANNELS
    )
    circuits = await circuits_for(found)
    # FIFO channels' lines (README "Ordered delivery (FIFO)"): one statement, when there are any
    fifo = [c.id for c in found if c.ordering == "fifo"]
    lines = await ctx.store.fifo_lines(tenant_id, fifo) if fifo else {}
    shown = [
        (c, json.dumps(public_config(ctx.validators.get(c.type), c.config), ensure_ascii=False),
         circuits[c.id],
         # its payload filter, as the API shows it (changed through the API: PATCH)
         json.dumps(c.filter, ensure_ascii=False) if c.filter is not None else None)
        for c in found
    ]  # fmt: skip
    return await page("channels.html", signed_in=True, channels=shown, fifo_lines=lines)


@routes.post("/channels/<uuid:channel_id>/<any(enable, disable):action>")
async def enable(channel_id: uuid.UUID, action: str) -> Response:
    tenant_id = await signed_in_tenant()
    changes = ChannelChanges(enabled=action == "enable")
    if await api_context().store.update_channel(tenant_id, channel_id, changes) is None:
        raise ConsoleError(404, "There is no such channel.")
    return cast(Response, redirect(f"{PREFIX}/channels", 303))


@routes.post("/channels/<uuid:channel_id>/rotate-secret")
async def rotate_secret(channel_id: uuid.UUID) -> Response:
    """A new secret for a webhook channel, made as a PATCH of its config with a new secret
    makes it (``ingest.api.channels.patch_channel``); the page shows it once."""
    tenant_id = await signed_in_tenant()
    ctx = api_context()
    for _ in range(PATCH_CONFIG_TRIES):
        channel = await _channel(tenant_id, channel_id)
        validator = ctx.validators.get(channel.type)
        if validator is None or "secret" not in validator.secret_fields:
            raise ConsoleError(409, f"A {channel.type} channel has no signing secret to rotate.")
        secret = generate_secret()
        config = {k: v for k, v in channel.config.items() if k not in validator.secret_fields}
        try:
            new_config = await patched_config(channel, {**config, "secret": secret})
            updated = await ctx.store.update_channel(
                tenant_id, channel_id, ChannelChanges(config=new_config),
                config_read=channel.config,
            )  # fmt: skip
        except ApiError as exc:
            raise ConsoleError(exc.status, exc.message) from exc
        except ConfigChanged:
            continue
        if updated is None:
            raise ConsoleError(404, "There is no such channel.")
        return await page("secret.html", signed_in=True, channel=updated, secret=secret)
    raise ConsoleError(409, "The channel's config kept changing meanwhile: try again.")


# the test event's payload is {"test": true, "channel_id": ...}: most payload filters drop it
FILTERED_OUT = (
    "The channel's payload filter drops the test event (its payload is "
    '{"test": true, "channel_id": …}): remove the filter to send one, or send a matching '
    "event through the API."
)


@routes.post("/channels/<uuid:channel_id>/test")
async def send_test(channel_id: uuid.UUID) -> Response:
    """A test event for this channel only; its delivery's page follows it to its outcome."""
    tenant_id = await signed_in_tenant()
    channel = await _channel(tenant_id, channel_id)
    if not channel.enabled:
        raise ConsoleError(409, "The channel is disabled: enable it to send it a test event.")
    payload = {"test": True, "channel_id": str(channel_id)}
    if channel.filter is not None and not filters.matches(channel.filter, payload):
        raise ConsoleError(409, FILTERED_OUT)
    event = EventIn(type=TEST_EVENT_TYPE, payload=payload, channel_ids=[channel_id])
    try:
        [result] = await ingest(tenant_id, [new_event(event, None)])
    except ApiError as exc:  # over the key's ingest rate limit
        raise ConsoleError(exc.status, exc.message) from exc
    except UnknownChannels as exc:  # deleted or disabled meanwhile
        raise ConsoleError(409, f"The channel takes no event now: {exc}.") from exc
    found = [d for d in result.event.deliveries if d.channel_id == channel_id]
    if not found:  # a filter set meanwhile dropped it: the event is stored, with no delivery
        raise ConsoleError(409, FILTERED_OUT)
    [delivery] = found
    return cast(Response, redirect(f"{PREFIX}/deliveries/{delivery.id}?notice=test", 303))
