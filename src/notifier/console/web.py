"""What the console's pages share: the blueprint (templates, static files), the console's
context in the app, the signed-in tenant, the CSRF check of every form, the security headers of
every answer, and the HTML answers of errors."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, cast

from quart import Blueprint, Response, current_app, g, redirect, render_template, request
from werkzeug.exceptions import HTTPException

from notifier.console.session import (
    COOKIE_NAME,
    Network,
    Sessions,
    SignInThrottle,
    client_address,
    new_session_id,
    session_id_hash,
)
from notifier.errors import NotifierError
from notifier.ingest.api.context import api_context
from notifier.store.console_sessions import ConsoleStore

_EXTENSION = "notifier.console"
PREFIX = "/console"

routes = Blueprint(
    "console", __name__, url_prefix=PREFIX, template_folder="templates",
    static_folder="static", static_url_path="/static",
)  # fmt: skip

# No script at all, styles and images from the console itself, forms posted only to it, never
# framed; nothing of the page's address leaves with a link.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


@dataclasses.dataclass(frozen=True)
class ConsoleContext:
    sessions: Sessions
    store: ConsoleStore
    throttle: SignInThrottle
    trusted_proxies: tuple[Network, ...] = ()


class ConsoleError(NotifierError):
    """Answered with an HTML page saying ``message``, with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class NotSignedIn(NotifierError):
    """Answered with a redirect to the sign-in page."""


def console_context() -> ConsoleContext:
    return cast(ConsoleContext, current_app.extensions[_EXTENSION])


def install_context(app: Any, context: ConsoleContext) -> None:
    app.extensions[_EXTENSION] = context


def current_session() -> str | None:
    """The request's session id (None without a valid cookie), or the one this request
    started."""
    if "console_session" not in g:
        g.console_session = console_context().sessions.load(request.cookies.get(COOKIE_NAME))
    return cast(str | None, g.console_session)


def start_session(session_id: str) -> None:
    """Make ``session_id`` the request's; the answer sets its cookie."""
    g.console_session = session_id
    g.console_session_changed = True


async def signed_in_tenant() -> uuid.UUID:
    """The tenant of the session: its row in the store (gone once signed out, expired, or its
    tenant's key replaced or the tenant disabled), whose key hash is still the tenant's as the
    API looks a key up; ``NotSignedIn`` otherwise."""
    if "console_tenant" in g:
        return cast(uuid.UUID, g.console_tenant)
    session_id = current_session()
    if session_id is None:
        raise NotSignedIn()
    signed_in = await console_context().store.console_session(session_id_hash(session_id))
    if signed_in is None:
        raise NotSignedIn()
    if await api_context().tenants.resolve_one(signed_in.key_hash) != signed_in.tenant_id:
        raise NotSignedIn()
    g.console_tenant = signed_in.tenant_id
    return signed_in.tenant_id


def csrf_token() -> str:
    """The token the page's forms carry; starts an anonymous session if there is none."""
    session_id = current_session()
    if session_id is None:
        session_id = new_session_id()
        start_session(session_id)
    return console_context().sessions.csrf(session_id)


def signin_address() -> str:
    """The client address the sign-in slow-down counts (``session.client_address``)."""
    return client_address(
        request.remote_addr, request.headers.getlist("X-Forwarded-For"),
        console_context().trusted_proxies,
    )  # fmt: skip


@routes.before_request
async def check_csrf() -> None:
    """Every form posted to the console carries the session's token, or is refused."""
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return
    form = await request.form
    if not console_context().sessions.csrf_ok(current_session(), form.get("csrf", "")):
        raise ConsoleError(403, "This form has expired or did not come from this console. "
                                "Go back, reload the page and try again.")  # fmt: skip


@routes.after_app_request
async def finish(response: Response) -> Response:
    """The security headers on every answer under ``/console`` (an unknown page's too), and
    the session's cookie when the request changed it."""
    if not request.path.startswith(PREFIX):
        return response
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if g.get("console_session_changed"):
        ctx = console_context()
        response.set_cookie(
            COOKIE_NAME, ctx.sessions.dump(g.console_session), max_age=ctx.sessions.max_age_seconds,
            path=PREFIX, httponly=True, samesite="Strict", secure=over_tls(),
        )  # fmt: skip
    return response


def over_tls() -> bool:
    """Whether the browser reached the console over TLS: directly, or through a proxy that
    terminates it and says so (``X-Forwarded-Proto``; it can only make the cookie stricter)."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.scheme == "https" or forwarded == "https"


async def page(template: str, status: int = 200, **context: Any) -> Response:
    """``template`` rendered (autoescaped) with the CSRF token and ``context``."""
    body = await render_template(template, csrf=csrf_token(), **context)
    return Response(body, status=status, content_type="text/html; charset=utf-8")


@routes.errorhandler(NotSignedIn)
async def on_not_signed_in(exc: NotSignedIn) -> Response:
    return cast(Response, redirect(f"{PREFIX}/sign-in", 303))


@routes.errorhandler(ConsoleError)
async def on_console_error(exc: ConsoleError) -> Response:
    return await page("error.html", exc.status, message=exc.message, signed_in=False)


@routes.errorhandler(HTTPException)
async def on_http_error(exc: HTTPException) -> Response:
    return await page(
        "error.html", exc.code or 500, message=exc.description or exc.name, signed_in=False
    )


@routes.route("/<path:unknown>", methods=["GET", "POST"])
async def no_such_page(unknown: str) -> Response:
    raise ConsoleError(404, "There is no such page.")
