"""Signing in with a tenant's API key (a form, never a URL) and signing out. The key is hashed
at once and only its hash is kept, in the signed session cookie; it is never logged or shown."""

from __future__ import annotations

import logging
import math
from typing import cast

import trio
from quart import Response, redirect, request

from notifier.console.session import new_session
from notifier.console.web import (
    PREFIX,
    ConsoleError,
    console_context,
    page,
    routes,
    start_session,
)
from notifier.ingest.api.context import api_context
from notifier.ingest.tenants import hash_api_key

MAX_KEY_CHARS = 512

log = logging.getLogger("notifier.console")


@routes.get("/sign-in")
async def sign_in_form() -> Response:
    return await page("sign_in.html", signed_in=False)


@routes.post("/sign-in")
async def sign_in() -> Response:
    address = request.remote_addr or "unknown"
    throttle = console_context().throttle
    wait = throttle.wait_seconds(address, trio.current_time())
    if wait > 0:
        log.warning("console: sign-in from %s refused: too many failed sign-ins", address)
        raise ConsoleError(
            429, f"Too many failed sign-ins from your address: try again in {math.ceil(wait)} s."
        )
    key = (await request.form).get("api_key", "").strip()
    tenant_id = None
    if key and len(key) <= MAX_KEY_CHARS:
        key_hash = hash_api_key(key)
        tenant_id = await api_context().tenants.resolve_one(key_hash)
    if tenant_id is None:
        throttle.failed(address, trio.current_time())
        log.info("console: a sign-in from %s gave no valid API key", address)  # never the key
        return await page("sign_in.html", 401, signed_in=False, failed=True)
    throttle.succeeded(address)
    start_session(new_session(key_hash))  # a new token: none seen before signing in stays valid
    return cast(Response, redirect(f"{PREFIX}/", 303))


@routes.post("/sign-out")
async def sign_out() -> Response:
    start_session(new_session())
    return cast(Response, redirect(f"{PREFIX}/sign-in", 303))
