"""What the route groups share, held by the app rather than by a closure: the store, the config,
the channel-config validators, the tenant cache, the group commit of single events, the rate
limiter, metrics and the prebuilt OpenAPI document. ``create_app`` builds one ``ApiContext`` per
app; a handler reads it with ``api_context()``."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import cast

from prometheus_client import Counter
from quart import Quart, current_app

from notifier.adapters.base import ChannelValidator
from notifier.config import Config
from notifier.errors import StoreError
from notifier.ingest.events import Outcome, Pair
from notifier.ingest.groupcommit import GroupCommit
from notifier.ingest.tenants import TenantCache, TenantCaches
from notifier.ingest.unauthorized import UnauthorizedLimit
from notifier.metrics import Metrics
from notifier.metrics_scrape import ScrapeReader
from notifier.store.api import ApiStore
from notifier.tracing import NO_TRACING, Tracing

_EXTENSION = "notifier.api"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ApiContext:
    store: ApiStore
    config: Config
    validators: Mapping[str, ChannelValidator]  # by channel type: the enabled types
    max_attempts: Mapping[str, int]  # per event type, for ingest
    tenants: TenantCache  # API key hash → tenant id
    # Single events of concurrent requests, stored together (``ingest.events.store_each``).
    commit: GroupCommit[Pair, Outcome | StoreError]
    rate_limiter: IngestLimit | None  # per tenant, shared by the fleet; None: no limit
    unauthorized: UnauthorizedLimit | None  # 401s per client address; None: no limit
    metrics: Metrics
    ingested: Counter  # events stored from the HTTP API
    scrape: ScrapeReader
    check_broker: Callable[[], Awaitable[None]] | None
    openapi: bytes  # the document served at /openapi.json
    tracing: Tracing = NO_TRACING  # the ingest span of POST /v1/events and /batch


def tenants_by_key_hash(store: ApiStore, caches: TenantCaches) -> TenantCache:
    """The cache of tenant ids by API key hash, looked up in ``store``, one of ``caches`` (the
    process's: forgotten when a tenant changes). It remembers the keys that match no tenant
    (``TenantCache``: by their hash, for seconds): anyone may send any key here, and the same
    wrong key again must not cost a query each time."""

    async def lookup(digests: Sequence[str]) -> dict[str, uuid.UUID]:
        found: dict[str, uuid.UUID] = {}
        for digest in digests:
            tenant_id = await store.tenant_by_key_hash(digest)
            if tenant_id is not None:
                found[digest] = tenant_id
        return found

    return caches.cache(lookup, remember_unknown=True)


@dataclasses.dataclass(frozen=True)
class IngestLimit:
    """The per-API-key limit of ingested events: a refilling bucket of ``capacity`` events,
    ``rate`` back per second, one per tenant, kept in the store (``notifier.ratelimit``) so
    that it holds for every ingest process together."""

    capacity: int
    rate: float

    @staticmethod
    def key(tenant_id: uuid.UUID) -> str:
        return f"ingest:{tenant_id}"


def rate_limiter(config: Config) -> IngestLimit | None:
    """The per-tenant limit of ingested events, if ``[ingest]`` sets one. Without one, an
    ingest costs no statement more."""
    limits = config.ingest
    if limits.rate_limit_per_second <= 0:
        return None
    return IngestLimit(limits.rate_limit_burst, limits.rate_limit_per_second)


def unauthorized_limit(config: Config) -> UnauthorizedLimit | None:
    """The limit of 401s per client address, unless ``[ingest]`` turns it off."""
    limits = config.ingest
    if limits.unauthorized_per_address_per_second <= 0:
        return None
    return UnauthorizedLimit(limits.unauthorized_per_address_per_second, limits.unauthorized_burst)


def install(app: Quart, context: ApiContext) -> None:
    app.extensions[_EXTENSION] = context


def api_context() -> ApiContext:
    """The context of the app answering the current request."""
    return cast(ApiContext, current_app.extensions[_EXTENSION])


def context_of(app: Quart) -> ApiContext | None:
    """The context ``create_app`` installed in ``app``; None in an app without one (the app of
    ``ingest.metrics_bind``)."""
    return cast(ApiContext | None, app.extensions.get(_EXTENSION))
