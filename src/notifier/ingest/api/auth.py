"""Authentication: a request's bearer API key → its tenant, through the app's tenant cache, with
the limit of 401s per client address (``notifier.ingest.unauthorized``).

``authenticate`` works from the request's ``Authorization`` headers and address alone, so that
the quart routes (``current_tenant``) and the lean ingest routes (``api.hot``) share it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from quart import request

from notifier.ingest.api.context import ApiContext, api_context
from notifier.ingest.api.http import ApiError
from notifier.ingest.tenants import hash_api_key
from notifier.ingest.unauthorized import retry_after_header


async def current_tenant() -> uuid.UUID:
    """The tenant of the current quart request's API key (see ``authenticate``)."""
    return await authenticate(
        api_context(), request.headers.getlist("Authorization"), request.remote_addr
    )


async def authenticate(ctx: ApiContext, given: Sequence[str], address: str | None) -> uuid.UUID:
    """The tenant of the API key in ``given`` (the request's ``Authorization`` headers) of a
    request from ``address``; 401 without a valid one, 400 with two, 429 when its address had
    too many 401s (its key is then not looked up)."""
    if len(given) > 1:
        # Which one counts would be up to whatever reads the headers first (a proxy in
        # front may pick the other): refuse rather than guess.
        raise ApiError(400, "invalid_authorization", "more than one Authorization header")
    auth = given[0] if given else ""
    scheme, _, key = auth.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        _take_a_token(ctx, address)
        _refused(ctx, "missing_key")
        raise ApiError(401, "unauthorized", "missing bearer API key")
    digest = hash_api_key(key.strip())
    tenant_id = ctx.tenants.cached(digest)
    if tenant_id is not None:  # valid a moment ago: no token, no lookup
        return tenant_id
    # A key that was valid at its latest lookup is looked up again without a token, so that a
    # tenant sharing an address with a flood of made-up keys is not refused with it.
    token = not ctx.tenants.was_valid(digest)
    if token:
        _take_a_token(ctx, address)
    answered = False
    try:
        tenant_id = await ctx.tenants.resolve_one(digest)
        answered = True
    finally:
        if token and not answered:  # the lookup failed (503) or was cancelled: nothing known
            _give_back(ctx, address)
    if tenant_id is None:
        _refused(ctx, "unknown_key")
        raise ApiError(401, "unauthorized", "invalid API key")
    if token:
        _give_back(ctx, address)
    return tenant_id


def _take_a_token(ctx: ApiContext, address: str | None) -> None:
    """Spend one of the address's 401s; 429 when none is left."""
    if ctx.unauthorized is None:
        return
    wait = ctx.unauthorized.take(address)
    if wait is not None:
        _refused(ctx, "limited")
        raise ApiError(
            429, "too_many_unauthorized",
            "too many requests with a missing or unknown API key from this address; "
            "try again later",
            {"Retry-After": retry_after_header(wait)},
        )  # fmt: skip


def _give_back(ctx: ApiContext, address: str | None) -> None:
    if ctx.unauthorized is not None:
        ctx.unauthorized.give_back(address)


def _refused(ctx: ApiContext, reason: str) -> None:
    ctx.metrics.ingest_unauthorized.labels(reason=reason).inc()
