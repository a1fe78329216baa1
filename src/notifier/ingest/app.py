"""The HTTP API (docs/architecture.md §8) as a quart-trio app: ``create_app`` builds the app's
context and mounts the route groups of ``notifier.ingest.api``, one per resource. Handlers validate,
call the store, answer.

Nothing here starts background work: a request writes its rows and returns.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Mapping

import msgspec
from quart_trio import QuartTrio

from notifier.adapters.base import ChannelValidator
from notifier.catalog import Catalogs
from notifier.config import Config, metrics_token
from notifier.console import install_console
from notifier.ingest.api import (
    catalog,
    channels,
    deliveries,
    docs,
    events,
    health,
    operations,
    portal_links,
)
from notifier.ingest.api.context import (
    ApiContext,
    install,
    rate_limiter,
    tenants_by_key_hash,
    unauthorized_limit,
)
from notifier.ingest.api.errors import install_error_handlers
from notifier.ingest.api.pagination import DEFAULT_PAGE, MAX_PAGE
from notifier.ingest.events import max_attempts_by_type, store_each
from notifier.ingest.groupcommit import GroupCommit
from notifier.ingest.metrics_access import CachedReadiness, MetricsEndpoint, install_metrics
from notifier.ingest.openapi import build_openapi
from notifier.ingest.tenants import TenantCaches
from notifier.metrics import Metrics
from notifier.metrics_scrape import ReadQueueDepths, ScrapeReader, broker_queues
from notifier.store.api import ApiStore
from notifier.store.rows import MetricsSnapshot
from notifier.tracing import NO_TRACING, Tracing

ROUTE_GROUPS = (
    health, docs, channels, events, catalog, deliveries, operations, portal_links,
)  # fmt: skip

# A batch of single events takes a few milliseconds; a request queued behind one that has run
# this long (Postgres stalls) stores its event in a batch of its own beside it, so that it waits
# for at most one slow batch (each bounded by the store's timeouts) before its own.
GROUP_COMMIT_PATIENCE_SECONDS = 0.1


def create_app(
    store: ApiStore,
    config: Config,
    validators: Mapping[str, ChannelValidator],
    *,
    check_broker: Callable[[], Awaitable[None]] | None = None,
    metrics: Metrics | None = None,
    read_queue_depths: ReadQueueDepths | None = None,
    tenant_caches: TenantCaches | None = None,
    environ: Mapping[str, str] | None = None,
    tracing: Tracing = NO_TRACING,
) -> QuartTrio:
    """Build the app. ``validators`` check channel configs, by channel type (the enabled types:
    ``specs.build_validators``). ``check_broker`` raises when RabbitMQ is unreachable (for
    ``/readyz``). ``/metrics`` serves ``metrics`` (the process's; a fresh one by default) and
    the broker's queue depths read with ``read_queue_depths`` (left out without it). The app's
    cache of tenants by API key is one of ``tenant_caches`` (the process's, which
    ``tenants.keep_tenant_caches_fresh`` empties on a tenant change; without it, a set of its
    own: its entries then live their TTL); the event-type catalogs are forgotten with them, and
    alone on a change of a tenant's event types.
    ``environ`` holds the variable that ``ingest.metrics_token_env`` names (default: this
    process's environment). ``tracing``
    makes the ingest spans (README, Tracing; off by default)."""
    app = QuartTrio("notifier")
    app.config["MAX_CONTENT_LENGTH"] = config.ingest.max_body_bytes
    meters = metrics if metrics is not None else Metrics()
    max_attempts = max_attempts_by_type(config)
    caches = tenant_caches or TenantCaches()
    catalogs = Catalogs(store.event_catalog)
    caches.register(catalogs, catalog=True)

    async def read_snapshot() -> MetricsSnapshot:
        return await store.metrics_snapshot(config.maintenance.retention_days)

    scrape = ScrapeReader(
        meters, read_snapshot,
        broker_queues(config.workers.enabled(), config.retry.tiers_seconds), read_queue_depths,
    )  # fmt: skip
    ctx = ApiContext(
        store=store, config=config, validators=validators, max_attempts=max_attempts,
        tenants=tenants_by_key_hash(store, caches), catalogs=catalogs,
        commit=GroupCommit(
            store_each(store, max_attempts), max_batch=config.ingest.max_batch_events,
            patience_seconds=GROUP_COMMIT_PATIENCE_SECONDS,
        ),
        rate_limiter=rate_limiter(config), unauthorized=unauthorized_limit(config), metrics=meters,
        ingested=meters.events_ingested.labels(source="http"),
        scrape=scrape,
        check_broker=check_broker,
        openapi=msgspec.json.encode(build_openapi(
            channel_types=validators, max_body_bytes=config.ingest.max_body_bytes,
            max_batch_events=config.ingest.max_batch_events, max_page=MAX_PAGE,
            default_page=DEFAULT_PAGE,
        )),
        tracing=tracing,
    )  # fmt: skip
    install(app, ctx)
    install_error_handlers(app)
    for group in ROUTE_GROUPS:
        app.register_blueprint(group.routes)
    install_console(app, config, store)
    install_metrics(app, MetricsEndpoint(
        metrics=meters, scrape=scrape,
        token=metrics_token(config.ingest, os.environ if environ is None else environ),
        served_here=not config.ingest.metrics_bind,
        readiness=CachedReadiness(functools.partial(ready, ctx)),
    ))  # fmt: skip
    return app


async def ready(ctx: ApiContext) -> bool:
    """Trio-flavoured. What ``/readyz`` would answer now, as a bool."""
    return (await health.check_readiness(ctx)).ready
