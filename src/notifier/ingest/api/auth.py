"""Authentication: a request's bearer API key → its tenant, through the app's tenant cache."""

from __future__ import annotations

import uuid

from quart import request

from notifier.ingest.api.context import api_context
from notifier.ingest.api.http import ApiError
from notifier.ingest.tenants import hash_api_key


async def current_tenant() -> uuid.UUID:
    """The tenant of the request's API key; 401 without a valid one, 400 with two."""
    given = request.headers.getlist("Authorization")
    if len(given) > 1:
        # Which one counts would be up to whatever reads the headers first (a proxy in
        # front may pick the other): refuse rather than guess.
        raise ApiError(400, "invalid_authorization", "more than one Authorization header")
    auth = given[0] if given else ""
    scheme, _, key = auth.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "unauthorized", "missing bearer API key")
    tenant_id = await api_context().tenants.resolve_one(hash_api_key(key.strip()))
    if tenant_id is None:
        raise ApiError(401, "unauthorized", "invalid API key")
    return tenant_id
