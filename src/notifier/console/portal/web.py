"""What the portal's pages share: the blueprint (``/portal``; templates under the console's
``portal/``, the console's stylesheet), the session a portal link opened and its scope, the CSRF
check of every form, the security headers of every answer (the console's), and the HTML answers
of errors. The cookie and CSRF token are the console's ``Sessions`` (one secret), under a cookie
name and path of the portal's own; a session's row names its link, whose scope every page's
query applies (``notifier.store.portal``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, cast

from quart import Blueprint, Response, g, render_template, request
from werkzeug.exceptions import HTTPException

from notifier.console.session import session_id_hash
from notifier.console.web import SECURITY_HEADERS, ConsoleError, console_context, over_tls
from notifier.ingest.api.context import api_context
from notifier.store.portal import PortalScope, PortalSession, PortalStore

PREFIX = "/portal"
COOKIE_NAME = "notifier_portal"

routes = Blueprint("portal", __name__, url_prefix=PREFIX)


class SessionEnded(ConsoleError):
    """No portal session (none opened, or its link expired or was revoked): a 403 page."""

    def __init__(self) -> None:
        super().__init__(
            403, "This portal session has ended (its link expired or was revoked). "
            "Open a new link from the service that sent you here.",
        )  # fmt: skip


def portal_store() -> PortalStore:
    store = api_context().store
    if not isinstance(store, PortalStore):
        raise ConsoleError(503, "The portal is not available.")
    return store


def current_session() -> str | None:
    """The session id of the request's cookie (None without a valid one), or the one this
    request started."""
    if "portal_session" not in g:
        g.portal_session = console_context().sessions.load(request.cookies.get(COOKIE_NAME))
    return cast(str | None, g.portal_session)


def start_session(session_id: str, expires_at: datetime) -> None:
    """Make ``session_id`` the request's; the answer sets its cookie, living until
    ``expires_at``."""
    g.portal_session = session_id
    g.portal_session_expires_at = expires_at


async def session() -> PortalSession:
    """The request's session and its scope; ``SessionEnded`` when there is none (its row gone,
    its link expired or revoked, its tenant disabled)."""
    if "portal_scope" in g:
        return cast(PortalSession, g.portal_scope)
    session_id = current_session()
    if session_id is None:
        raise SessionEnded()
    found = await portal_store().portal_session(session_id_hash(session_id))
    if found is None:
        raise SessionEnded()
    g.portal_scope = found
    return found


async def scope() -> PortalScope:
    return (await session()).scope


def csrf_token() -> str:
    session_id = current_session()
    return "" if session_id is None else console_context().sessions.csrf(session_id)


@routes.before_request
async def check_csrf() -> None:
    """Every form posted to the portal carries its session's token, or is refused."""
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return
    form = await request.form
    if not console_context().sessions.csrf_ok(current_session(), form.get("csrf", "")):
        raise ConsoleError(403, "This form has expired or did not come from this portal. "
                                "Go back, reload the page and try again.")  # fmt: skip


@routes.after_app_request
async def finish(response: Response) -> Response:
    """The console's security headers on every answer under ``/portal``, and the session's
    cookie when the request opened one. Lax, not Strict: the link is opened from another site,
    and the first page after its redirect must carry the cookie; a form needs its token."""
    if request.path != PREFIX and not request.path.startswith(PREFIX + "/"):
        return response
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    expires_at = g.get("portal_session_expires_at")
    if expires_at is not None:
        ctx = console_context()
        max_age = max(0, int((expires_at - datetime.now(UTC)).total_seconds()))
        response.set_cookie(
            COOKIE_NAME, ctx.sessions.dump(g.portal_session), max_age=max_age, path=PREFIX,
            httponly=True, samesite="Lax", secure=secure_cookie(),
        )  # fmt: skip
    return response


def secure_cookie() -> bool:
    """The cookie is ``Secure`` over TLS, and whenever the portal's links are https
    (``[console] public_url``): customers reach it there, whether or not a proxy in front
    says so with ``X-Forwarded-Proto``."""
    public_url = api_context().config.console.public_url
    return over_tls() or public_url.lower().startswith("https://")


def end_cookie(response: Response) -> Response:
    response.delete_cookie(COOKIE_NAME, path=PREFIX, httponly=True, samesite="Lax",
                           secure=secure_cookie())  # fmt: skip
    return response


async def page(template: str, status: int = 200, **context: Any) -> Response:
    """``portal/<template>`` rendered (autoescaped) with the CSRF token and ``context``."""
    body = await render_template(f"portal/{template}", csrf=csrf_token(), **context)
    return Response(body, status=status, content_type="text/html; charset=utf-8")


@routes.errorhandler(ConsoleError)
async def on_error(exc: ConsoleError) -> Response:
    return await page("error.html", exc.status, message=exc.message, in_session=False)


@routes.errorhandler(HTTPException)
async def on_http_error(exc: HTTPException) -> Response:
    return await page(
        "error.html", exc.code or 500, message=exc.description or exc.name, in_session=False
    )


@routes.route("/<path:unknown>", methods=["GET", "POST"])
async def no_such_page(unknown: str) -> Response:
    raise ConsoleError(404, "There is no such page.")


def not_found(what: str) -> ConsoleError:
    return ConsoleError(404, f"There is no such {what}.")


def uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text) if text else None
    except ValueError as exc:
        raise ConsoleError(400, "channel: not a channel id") from exc
