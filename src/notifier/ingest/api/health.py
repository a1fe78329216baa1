"""The routes without an API key: liveness, readiness, Prometheus metrics and the OpenAPI
document. Keep the port internal."""

from __future__ import annotations

import functools

from quart import Blueprint, Response

from notifier.ingest.api.context import api_context
from notifier.ingest.api.http import json_response
from notifier.ingest.readiness import CHECK_SECONDS, Check, run_checks
from notifier.ingest.views import Health, Readiness
from notifier.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

routes = Blueprint("health", __name__)


@routes.get("/healthz")
async def healthz() -> Response:
    return json_response(Health(status="ok"))


@routes.get("/readyz")
async def readyz() -> Response:
    """Postgres and RabbitMQ checked at once; an answer within about a second whatever
    they do (a stalled dependency is unavailable, not a probe that never returns)."""
    ctx = api_context()
    probes: dict[str, Check] = {"database": functools.partial(ctx.store.ping, CHECK_SECONDS)}
    if ctx.check_broker is not None:
        probes["broker"] = ctx.check_broker
    checks = await run_checks(probes)
    ready = all(v == "ok" for v in checks.values())
    return json_response(Readiness(status="ready" if ready else "unavailable", checks=checks),
                         200 if ready else 503)  # fmt: skip


@routes.get("/openapi.json")
async def openapi_document() -> Response:
    return Response(api_context().openapi, content_type="application/json")


@routes.get("/metrics")
async def prometheus_metrics() -> Response:
    ctx = api_context()
    await ctx.scrape.refresh()
    return Response(ctx.metrics.render(), content_type=METRICS_CONTENT_TYPE)
