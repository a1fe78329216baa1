"""``/v1/channels``: create, list, read, change and delete a tenant's channels. A channel's
config is validated by its type's validator (``adapters.specs``: no deliverer, no secret); its
secret fields are shown only in the answer to its creation, and kept across a PATCH that does
not replace them."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
from quart import Blueprint, Response, request

from notifier import filters
from notifier.adapters.base import (
    ChannelValidator,
    ChecksDestination,
    ChecksTenant,
    InvalidChannelConfig,
    UpdatesConfig,
    channel_destination,
    public_config,
)
from notifier.ingest.api.auth import current_tenant
from notifier.ingest.api.context import api_context
from notifier.ingest.api.http import ApiError, json_response, read_body
from notifier.ingest.api.pagination import cursor_arg, limit_arg, split_page
from notifier.ingest.models import CUSTOMER_RE, ChannelIn, ChannelPatch
from notifier.ingest.views import ChannelHealth, ChannelPage, ChannelView, CircuitHealth
from notifier.store.errors import ConfigChanged
from notifier.store.rows import Channel, ChannelChanges, DestinationCircuit

# Reads of a channel a PATCH of its config makes the new config from, at most: each further one
# follows a concurrent change of the config between the read and the write.
PATCH_CONFIG_TRIES = 5
CUSTOMER = re.compile(CUSTOMER_RE)

routes = Blueprint("channels", __name__)


CLOSED = DestinationCircuit(state="closed")


async def circuits_for(channels: Sequence[Channel]) -> dict[uuid.UUID, CircuitHealth]:
    """The circuit of each channel's destination, in one store call (docs/architecture.md §5)."""
    validators = api_context().validators
    keys = {
        c.id: (c.type, channel_destination(validators.get(c.type), c.id, c.config))
        for c in channels
    }
    found = await api_context().store.circuits_of(sorted(set(keys.values())))
    circuits: dict[uuid.UUID, CircuitHealth] = {}
    for channel_id, key in keys.items():
        c = found.get(key, CLOSED)
        circuits[channel_id] = CircuitHealth(
            destination=key[1], state=c.state, consecutive_failures=c.consecutive_failures,
            opened_at=c.opened_at, next_probe_at=c.next_probe_at,
        )  # fmt: skip
    return circuits


def channel_view(
    channel: Channel,
    validator: ChannelValidator | None,
    circuit: CircuitHealth,
    *,
    reveal: bool = False,
) -> ChannelView:
    return ChannelView(
        id=channel.id,
        type=channel.type,
        name=channel.name,
        config=channel.config if reveal else public_config(validator, channel.config),
        recipient=channel.recipient,
        event_types=channel.event_types,
        enabled=channel.enabled,
        disabled_reason=channel.disabled_reason,
        disabled_at=channel.disabled_at,
        health=ChannelHealth(
            consecutive_failures=channel.consecutive_failures,
            failing_since=channel.failing_since,
            last_success_at=channel.last_success_at,
            circuit=circuit,
        ),
        max_attempts=channel.max_attempts,
        rate_limit_per_second=channel.rate_limit_per_second,
        filter=channel.filter,
        customer=channel.customer,
        ordering=channel.ordering,
        created_at=channel.created_at,
        updated_at=channel.updated_at,
    )


def stored_view(channel: Channel, circuit: CircuitHealth) -> ChannelView:
    """``channel`` as every answer but its creation's shows it: its type's secrets hidden."""
    return channel_view(channel, api_context().validators.get(channel.type), circuit)


async def stored_views(channels: Sequence[Channel]) -> list[ChannelView]:
    """``stored_view`` of each channel, with the circuits of their destinations."""
    circuits = await circuits_for(channels)
    return [stored_view(c, circuits[c.id]) for c in channels]


def validator_for(channel_type: str) -> ChannelValidator:
    """The config validator of ``channel_type``; 422 if the type is not enabled."""
    validators = api_context().validators
    validator = validators.get(channel_type)
    if validator is None:
        enabled = ", ".join(sorted(validators)) or "none"
        raise ApiError(
            422, "validation_error",
            f"type: channel type {channel_type!r} is not enabled (enabled: {enabled})",
        )  # fmt: skip
    return validator


async def prepare(
    validator: ChannelValidator,
    cfg: dict[str, Any],
    tenant_id: uuid.UUID,
    stored: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate a channel config of ``tenant_id``'s; ``stored`` is the current one on PATCH
    (secret rotation)."""
    try:
        if stored is not None and isinstance(validator, UpdatesConfig):
            prepared = validator.prepare_config_update(cfg, stored)
        else:
            prepared = validator.prepare_config(cfg)
        if isinstance(validator, ChecksTenant):
            validator.check_tenant(prepared, tenant_id)
        if isinstance(validator, ChecksDestination):
            await validator.check_destination(prepared)
        return prepared
    except InvalidChannelConfig as exc:
        raise ApiError(422, "validation_error", str(exc)) from exc


def checked_filter(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """A body's ``filter`` checked by the filter language's rules and limits (README "Payload
    filters"); 422 naming the place inside the filter otherwise."""
    if raw is None:
        return None
    try:
        return filters.parse(raw)
    except filters.FilterError as exc:
        raise ApiError(422, "validation_error", exc.at("filter")) from exc


async def patched_config(channel: Channel, config: dict[str, Any]) -> dict[str, Any]:
    """The config a PATCH gives ``channel``: validated against its type, its stored
    secrets kept unless replaced."""
    validator = validator_for(channel.type)
    new_config = dict(config)
    for key in validator.secret_fields:  # secrets are kept unless replaced
        if key not in new_config and key in channel.config:
            new_config[key] = channel.config[key]
    return await prepare(validator, new_config, channel.tenant_id, channel.config)


@routes.post("/v1/channels")
async def create_channel() -> Response:
    tenant_id = await current_tenant()
    data = await read_body(ChannelIn)
    flt = checked_filter(data.filter)
    validator = validator_for(data.type)
    config = await prepare(validator, data.config, tenant_id)
    channel = await api_context().store.create_channel(
        tenant_id, type=data.type, name=data.name, config=config,
        recipient=data.recipient, event_types=data.event_types, enabled=data.enabled,
        max_attempts=data.max_attempts, rate_limit_per_second=data.rate_limit_per_second,
        filter=flt, customer=data.customer, ordering=data.ordering,
    )  # fmt: skip
    [circuit] = (await circuits_for([channel])).values()
    return json_response(channel_view(channel, validator, circuit, reveal=True), 201)


def customer_arg() -> str | None:
    """The request's ``customer`` filter: a customer label, or 422."""
    customer = request.args.get("customer")
    if customer is not None and (len(customer) > 200 or not CUSTOMER.search(customer)):
        raise ApiError(422, "invalid_parameter", "customer must be a customer label")
    return customer


@routes.get("/v1/channels")
async def list_channels() -> Response:
    tenant_id = await current_tenant()
    limit = limit_arg()
    rows = await api_context().store.list_channels(
        tenant_id, type=request.args.get("type"), recipient=request.args.get("recipient"),
        after=cursor_arg(), limit=limit + 1, customer=customer_arg(),
    )  # fmt: skip
    page, next_cursor = split_page(rows, limit, lambda c: (c.created_at, c.id))
    return json_response(ChannelPage(items=await stored_views(page), next_cursor=next_cursor))


@routes.get("/v1/channels/<uuid:channel_id>")
async def get_channel(channel_id: uuid.UUID) -> Response:
    channel = await api_context().store.get_channel(await current_tenant(), channel_id)
    if channel is None:
        raise ApiError(404, "not_found", "channel not found")
    [view] = await stored_views([channel])
    return json_response(view)


@routes.patch("/v1/channels/<uuid:channel_id>")
async def patch_channel(channel_id: uuid.UUID) -> Response:
    """Change only the fields the body names: a concurrent change of the others (another
    PATCH, the worker disabling the channel) stays. A new config is made from the stored
    one (its secrets carried over, a rotation started); if the stored one changes before
    the write, it is made again from the new one."""
    tenant_id = await current_tenant()
    patch = await read_body(ChannelPatch)
    named = {k: v for k, v in msgspec.structs.asdict(patch).items() if v is not msgspec.UNSET}
    if "filter" in named:
        named["filter"] = checked_filter(named["filter"])
    store = api_context().store
    for _ in range(PATCH_CONFIG_TRIES):
        channel = await store.get_channel(tenant_id, channel_id)
        if channel is None:
            raise ApiError(404, "not_found", "channel not found")
        changes = dict(named)
        if "config" in changes:
            changes["config"] = await patched_config(channel, changes["config"])
        try:
            updated = await store.update_channel(
                tenant_id, channel_id, ChannelChanges(**changes),
                config_read=channel.config if "config" in changes else None,
            )  # fmt: skip
        except ConfigChanged:
            continue
        if updated is None:
            raise ApiError(404, "not_found", "channel not found")
        [view] = await stored_views([updated])
        return json_response(view)
    raise ApiError(
        409, "conflict", "the channel's config kept changing while this PATCH was made; "
        "send it again",
    )  # fmt: skip


@routes.delete("/v1/channels/<uuid:channel_id>")
async def delete_channel(channel_id: uuid.UUID) -> Response:
    if not await api_context().store.delete_channel(await current_tenant(), channel_id):
        raise ApiError(404, "not_found", "channel not found")
    return Response(b"", status=204)
