"""The customer portal (``/portal``): the console's pages for one of a tenant's own customers,
reached through a short-lived link the tenant makes (``POST /v1/portal-links``) and limited to
that link's scope. Server-rendered with the console's templates, stylesheet, session signing,
CSRF tokens and security headers (README "Customer portal")."""

from __future__ import annotations

from quart import Quart

from notifier.console.portal import pages  # noqa: F401  (its routes join the blueprint)
from notifier.console.portal.web import routes


def install_portal(app: Quart) -> None:
    """Mount the portal on ``app``; the console (``install_console``) must be mounted too."""
    app.register_blueprint(routes)
