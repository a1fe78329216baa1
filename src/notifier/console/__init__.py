"""The operator console (``/console``): server-rendered pages over the API's store, for a
tenant signed in with its API key. ``install_console`` mounts it on the ingest app."""

from __future__ import annotations

import os
from collections.abc import Mapping

from quart import Quart

from notifier.config import Config
from notifier.console import (  # noqa: F401  (their routes join the blueprint)
    auth,
    catalog,
    channels,
    deliveries,
    overview,
    portal_links,
)
from notifier.console.portal import install_portal
from notifier.console.session import (
    Sessions,
    SignInThrottle,
    session_secret,
    trusted_networks,
)
from notifier.console.web import ConsoleContext, install_context, routes
from notifier.store.console_sessions import ConsoleStore


def install_console(
    app: Quart, config: Config, store: object, environ: Mapping[str, str] | None = None
) -> None:
    """Mount the console on ``app`` (built by ``ingest.app.create_app``, whose context it
    reads); its session secret is in the variable ``console.session_secret_env`` names. Its
    sessions and failed sign-ins are kept in ``store`` (Postgres's ``Store``); a store without
    them (the in-memory API store of unit tests) gets ``MemoryConsoleStore``."""
    console = config.console
    secret = session_secret(console.session_secret_env, os.environ if environ is None else environ)
    if not isinstance(store, ConsoleStore):
        from notifier.testing.console import MemoryConsoleStore

        store = MemoryConsoleStore()
    install_context(app, ConsoleContext(
        sessions=Sessions(secret, console.session_max_age_seconds), store=store,
        throttle=SignInThrottle(store), trusted_proxies=trusted_networks(console.trusted_proxies),
    ))  # fmt: skip
    app.register_blueprint(routes)
    install_portal(app)  # the customer portal, on the console's sessions and templates
