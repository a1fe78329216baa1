"""``GET /metrics``, and who may read it.

With ``ingest.metrics_token_env`` set, a scrape needs ``Authorization: Bearer <token>``, the
token compared in constant time: without it, or with another one, the answer is ``401`` with
``WWW-Authenticate: Bearer``; with two ``Authorization`` headers, ``400`` (which one counts would
be up to whatever reads them first). With ``ingest.metrics_bind`` set, ``/metrics`` is served by a
small server of its own on that address (in the same process, beside the ingest server, with
the same connection handling), and the ingest port answers ``404`` for it. In a launch the parent
binds that address once and its processes inherit the socket (``$NOTIFIER_METRICS_LISTEN_FDS``),
as they inherit the ingest port's.
"""

from __future__ import annotations

import dataclasses
import hmac
import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence

import trio
from quart import Blueprint, Quart, Response, current_app, request
from quart_trio import QuartTrio
from werkzeug.exceptions import NotFound

from notifier.ingest.api.errors import install_error_handlers
from notifier.ingest.api.http import ApiError
from notifier.ingest.serve import Listeners, adopt_listeners, open_listeners
from notifier.metrics import CONTENT_TYPE, Metrics
from notifier.metrics_scrape import ScrapeReader

# The listening sockets of ``ingest.metrics_bind`` a process of a launch inherits.
METRICS_LISTEN_FDS_ENV = "NOTIFIER_METRICS_LISTEN_FDS"
# A scrape is a GET: the metrics server reads no body worth the name.
METRICS_MAX_BODY_BYTES = 4096
_EXTENSION = "notifier.metrics"

# ``notifier_ready`` is read again at most this often: ``/readyz``'s checks ping Postgres and
# open a RabbitMQ connection, which a scrape every few seconds should not repeat each time.
READINESS_MAX_AGE_SECONDS = 5.0

routes = Blueprint("metrics", __name__)


class CachedReadiness:
    """``check`` (``/readyz``'s checks as a bool), run again only when its last answer is older
    than ``max_age`` seconds of trio's clock; concurrent scrapes share one run."""

    def __init__(
        self, check: Callable[[], Awaitable[bool]], max_age: float = READINESS_MAX_AGE_SECONDS
    ) -> None:
        self._check, self._max_age = check, max_age
        self._answer: bool | None = None
        self._at = -math.inf
        self._lock = trio.Lock()

    async def __call__(self) -> bool:
        async with self._lock:
            if self._answer is None or trio.current_time() - self._at >= self._max_age:
                self._answer = await self._check()
                self._at = trio.current_time()
            return self._answer


@dataclasses.dataclass(frozen=True, kw_only=True)
class MetricsEndpoint:
    """What ``/metrics`` of an app serves, and to whom."""

    metrics: Metrics
    scrape: ScrapeReader
    token: str | None  # the bearer token a scrape must present; None: none asked for
    served_here: bool = True  # False: the ingest app of a process with ``ingest.metrics_bind``
    # this process's readiness (``/readyz``'s checks), for ``notifier_ready``; None: not reported
    readiness: Callable[[], Awaitable[bool]] | None = None


def install_metrics(app: Quart, endpoint: MetricsEndpoint) -> None:
    app.extensions[_EXTENSION] = endpoint
    app.register_blueprint(routes)


def metrics_endpoint(app: Quart) -> MetricsEndpoint:
    endpoint = app.extensions[_EXTENSION]
    assert isinstance(endpoint, MetricsEndpoint)
    return endpoint


def create_metrics_app(endpoint: MetricsEndpoint) -> QuartTrio:
    """The app of ``ingest.metrics_bind``: ``/metrics`` only (anything else is ``404``)."""
    app = QuartTrio("notifier.metrics")
    app.config["MAX_CONTENT_LENGTH"] = METRICS_MAX_BODY_BYTES
    install_error_handlers(app)
    install_metrics(app, dataclasses.replace(endpoint, served_here=True))
    return app


def check_bearer(given: Sequence[str], token: str) -> None:
    """Raise the refusal of a scrape whose ``Authorization`` headers are ``given``, unless they
    are one bearer ``token``."""
    if len(given) > 1:
        raise ApiError(400, "invalid_authorization", "more than one Authorization header")
    scheme, _, presented = (given[0] if given else "").partition(" ")
    # Compared whatever the scheme, so that a wrong one takes as long as a wrong token.
    same = hmac.compare_digest(presented.strip().encode(), token.encode())
    if not (same and scheme.lower() == "bearer"):
        raise ApiError(
            401, "unauthorized", "/metrics needs its bearer token",
            {"WWW-Authenticate": 'Bearer realm="metrics"'},
        )  # fmt: skip


@routes.get("/metrics")
async def prometheus_metrics() -> Response:
    endpoint = metrics_endpoint(current_app)
    if not endpoint.served_here:
        raise NotFound()  # as any path the app does not serve
    if endpoint.token is not None:
        check_bearer(request.headers.getlist("Authorization"), endpoint.token)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(endpoint.scrape.refresh)
        if endpoint.readiness is not None:
            nursery.start_soon(_refresh_readiness, endpoint)
    return Response(endpoint.metrics.render(), content_type=CONTENT_TYPE)


async def _refresh_readiness(endpoint: MetricsEndpoint) -> None:
    assert endpoint.readiness is not None
    endpoint.metrics.scrape_time.ready = await endpoint.readiness()


def open_metrics_listeners(bind: str, environ: Mapping[str, str] = os.environ) -> Listeners:
    """Bind ``ingest.metrics_bind``; in a process of a launch, adopt the parent's sockets."""
    if fds := environ.get(METRICS_LISTEN_FDS_ENV):
        return adopt_listeners(fds)
    return open_listeners(bind, {})
