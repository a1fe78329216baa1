"""Signing in with a tenant's API key (a form, never a URL) and signing out. The key is hashed
at once and only its hash is kept, in the session's row in the store (the cookie holds a random
session id only); it is never logged or shown."""

from __future__ import annotations

import logging
import math
from typing import cast

from quart import Response, redirect, request

from notifier.console.session import new_session_id, session_id_hash
from notifier.console.web import (
    PREFIX,
    ConsoleError,
    console_context,
    current_session,
    page,
    routes,
    signin_address,
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
    ctx = console_context()
    address = signin_address()
    wait = await ctx.throttle.wait_seconds(address)
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
        await ctx.throttle.failed(address)
        log.info("console: a sign-in from %s gave no valid API key", address)  # never the key
        return await page("sign_in.html", 401, signed_in=False, failed=True)
    await ctx.throttle.succeeded(address)
    # A new id: none seen before signing in (nor its CSRF token) stays valid.
    session_id = new_session_id()
    await ctx.store.create_console_session(
        session_id_hash(session_id), tenant_id, key_hash,
        max_age_seconds=ctx.sessions.max_age_seconds,
    )  # fmt: skip
    start_session(session_id)
    return cast(Response, redirect(f"{PREFIX}/", 303))


@routes.post("/sign-out")
async def sign_out() -> Response:
    """Ends the session at once: its row is deleted, so its cookie opens nothing any more."""
    session_id = current_session()
    if session_id is not None:
        await console_context().store.end_console_session(session_id_hash(session_id))
    start_session(new_session_id())
    return cast(Response, redirect(f"{PREFIX}/sign-in", 303))
