"""The routes without an API key: liveness, readiness and the OpenAPI document (``/metrics``:
``notifier.ingest.metrics_access``). Keep the port internal."""

from __future__ import annotations

import dataclasses
import functools

from quart import Blueprint, Response

from notifier.ingest.api.context import ApiContext, api_context
from notifier.ingest.api.http import json_response
from notifier.ingest.readiness import CHECK_SECONDS, Check, run_checks
from notifier.ingest.views import Health, Readiness, SchemaReport
from notifier.store.versions import SchemaNotCurrent, SchemaState

routes = Blueprint("health", __name__)


@routes.get("/healthz")
async def healthz() -> Response:
    return json_response(Health(status="ok"))


@dataclasses.dataclass(frozen=True)
class ReadinessResult:
    ready: bool
    checks: dict[str, str]
    schema: SchemaState | None


async def check_readiness(ctx: ApiContext) -> ReadinessResult:
    """Trio-flavoured. Postgres, its schema version and RabbitMQ checked at once, within
    about a second whatever they do (``/readyz``, and ``notifier_ready`` of ``/metrics``)."""
    found: list[SchemaState] = []

    async def check_schema() -> None:
        state = await ctx.store.schema_state(CHECK_SECONDS)
        found.append(state)
        if state.status in ("missing", "behind"):
            raise SchemaNotCurrent(state.describe())

    probes: dict[str, Check] = {
        "database": functools.partial(ctx.store.ping, CHECK_SECONDS),
        "schema": check_schema,
    }
    if ctx.check_broker is not None:
        probes["broker"] = ctx.check_broker
    checks = await run_checks(probes)
    ready = all(v == "ok" for v in checks.values())
    return ReadinessResult(ready, checks, found[0] if found else None)


@routes.get("/readyz")
async def readyz() -> Response:
    """Postgres, its schema version and RabbitMQ checked at once; an answer within about a
    second whatever they do (a stalled dependency is unavailable, not a probe that never
    returns). A schema missing or older than this code's is not ready; a newer one is (a
    newer release migrated it: migrations only add), and ``schema`` says so."""
    result = await check_readiness(api_context())
    found = result.schema
    schema = (
        SchemaReport(status=found.status, version=found.version, expected=found.latest)
        if found is not None
        else None
    )
    body = Readiness(
        status="ready" if result.ready else "unavailable", checks=result.checks, schema=schema
    )
    return json_response(body, 200 if result.ready else 503)


@routes.get("/openapi.json")
async def openapi_document() -> Response:
    return Response(api_context().openapi, content_type="application/json")
