"""The HTTP API (DESIGN §6) as a quart-trio app. Handlers validate, call the store, answer.

Nothing here starts background work: a request writes its rows and returns.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from notifier.adapters.base import (
    Adapter,
    ChecksDestination,
    InvalidChannelConfig,
    UpdatesConfig,
    public_config,
)
from notifier.adapters.ratelimit import KeyedLimiter, RefillingBucket
from notifier.config import Config
from notifier.errors import StoreUnavailable, UnstorableText
from notifier.ingest import jsonguard
from notifier.ingest.events import max_attempts_by_type, new_event
from notifier.ingest.models import (
    BatchIn,
    ChannelIn,
    ChannelPatch,
    EventIn,
    NoFields,
    ReplayIn,
)
from notifier.ingest.openapi import build_openapi
from notifier.ingest.readiness import CHECK_SECONDS, Check, run_checks
from notifier.ingest.views import (
    AttemptView,
    ChannelHealth,
    ChannelPage,
    ChannelView,
    DeliveryDetail,
    DeliveryPage,
    DeliveryRef,
    DeliveryView,
    ErrorBody,
    ErrorDetail,
    EventBatch,
    EventDetail,
    EventView,
    Health,
    Readiness,
    ReplayResult,
)
from notifier.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from notifier.metrics import Metrics, ReadQueueDepths, ScrapeReader, broker_queues
from notifier.store.pg import (
    ConfigChanged,
    IdempotencyConflict,
    NotFound,
    NotReplayable,
    Store,
    UnknownChannels,
)
from notifier.store.rows import (
    DELIVERY_STATUSES,
    Channel,
    ChannelChanges,
    Delivery,
    Event,
    NewEvent,
)
from notifier.validation import locate

log = logging.getLogger("notifier.ingest")

B = TypeVar("B")
TENANT_CACHE_SECONDS = 30.0
RETRY_AFTER_SECONDS = 5
DEFAULT_PAGE = 50
MAX_PAGE = 500
# Reads of a channel a PATCH of its config makes the new config from, at most: each further one
# follows a concurrent change of the config between the read and the write.
PATCH_CONFIG_TRIES = 5


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})


def hash_api_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        msgspec.json.encode(data), status=status, headers=dict(headers or {}),
        content_type="application/json",
    )  # fmt: skip


def _error(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    return _json(ErrorBody(error=ErrorDetail(code=code, message=message)), status, headers)


def _encode_cursor(at: datetime, row_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(f"{at.isoformat()}|{row_id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        at, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError("the API's cursors carry the offset of their time")
        # Postgres gets it in UTC: 0001-01-01T00:00+14:00 would overflow there.
        return when.astimezone(UTC), uuid.UUID(row_id)
    except (ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise ApiError(422, "invalid_cursor", "cursor is not valid") from exc


def _utc(field: str, value: datetime | None) -> datetime | None:
    """``value`` in UTC, as Postgres compares it; 422 naming ``field`` if UTC cannot hold it
    (``0001-01-01T00:00:00+14:00``)."""
    try:
        return None if value is None else value.astimezone(UTC)
    except OverflowError as exc:
        raise ApiError(422, "validation_error", f"{field}: out of range in UTC") from exc


def _channel_view(
    channel: Channel, adapter: Adapter | None, *, reveal: bool = False
) -> ChannelView:
    return ChannelView(
        id=channel.id,
        type=channel.type,
        name=channel.name,
        config=channel.config if reveal else public_config(adapter, channel.config),
        recipient=channel.recipient,
        event_types=channel.event_types,
        enabled=channel.enabled,
        disabled_reason=channel.disabled_reason,
        disabled_at=channel.disabled_at,
        health=ChannelHealth(
            consecutive_failures=channel.consecutive_failures,
            failing_since=channel.failing_since,
            last_success_at=channel.last_success_at,
        ),
        max_attempts=channel.max_attempts,
        created_at=channel.created_at,
        updated_at=channel.updated_at,
    )


def _event_view(event: Event, *, with_payload: bool = False) -> EventView:
    """The event; with its payload and idempotency key (``EventDetail``) when asked."""
    view = EventView(
        id=event.id, type=event.type, recipient=event.recipient, created_at=event.created_at,
        deliveries=[
            DeliveryRef(id=d.id, channel_id=d.channel_id, channel_type=d.channel_type,
                        status=d.status)
            for d in event.deliveries
        ],
    )  # fmt: skip
    if not with_payload:
        return view
    return EventDetail(
        **msgspec.structs.asdict(view), payload=event.payload,
        idempotency_key=event.idempotency_key,
    )  # fmt: skip


def _delivery_view(d: Delivery) -> DeliveryView:
    """The delivery; with its attempts (``DeliveryDetail``) when the store read them."""
    view = DeliveryView(
        id=d.id, event_id=d.event_id, channel_id=d.channel_id, channel_type=d.channel_type,
        status=d.status, attempt=d.attempt, max_attempts=d.max_attempts,
        last_error=d.last_error, next_attempt_at=d.next_attempt_at,
        delivered_at=d.delivered_at, created_at=d.created_at,
    )  # fmt: skip
    if d.attempts is None:
        return view
    attempts = [
        AttemptView(attempt=a.attempt, outcome=a.outcome, status_code=a.status_code,
                    duration_ms=a.duration_ms, error=a.error, started_at=a.started_at)
        for a in d.attempts
    ]  # fmt: skip
    return DeliveryDetail(**msgspec.structs.asdict(view), attempts=attempts)


def _uuid_arg(name: str) -> uuid.UUID | None:
    value = request.args.get(name)
    if value is None:
        return None
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise ApiError(422, "invalid_parameter", f"{name} must be a UUID") from exc


def _limit_arg() -> int:
    value = request.args.get("limit", str(DEFAULT_PAGE))
    # ASCII digits, and few: int() refuses '²' and strings of over 4300 digits with ValueError.
    if not (value.isascii() and value.isdigit() and len(value) <= 6) or not (
        1 <= int(value) <= MAX_PAGE
    ):
        raise ApiError(422, "invalid_parameter", f"limit must be an integer from 1 to {MAX_PAGE}")
    return int(value)


def _validation_message(exc: msgspec.ValidationError) -> str:
    path, text = locate(exc)
    return f"{path or 'body'}: {text}"


def create_app(
    store: Store,
    config: Config,
    adapters: Mapping[str, Adapter],
    *,
    check_broker: Callable[[], Awaitable[None]] | None = None,
    metrics: Metrics | None = None,
    read_queue_depths: ReadQueueDepths | None = None,
) -> QuartTrio:
    """Build the app. ``check_broker`` raises when RabbitMQ is unreachable (for ``/readyz``).
    ``/metrics`` serves ``metrics`` (the process's; a fresh one by default) and the broker's queue
    depths read with ``read_queue_depths`` (left out without it)."""
    app = QuartTrio("notifier")
    app.config["MAX_CONTENT_LENGTH"] = config.ingest.max_body_bytes
    max_attempts = max_attempts_by_type(config)
    tenants: dict[str, tuple[uuid.UUID, float]] = {}
    meters = metrics if metrics is not None else Metrics()
    ingested = meters.events_ingested.labels(source="http")
    scrape = ScrapeReader(
        meters, store.metrics_snapshot,
        broker_queues(config.workers.enabled(), config.retry.tiers_seconds), read_queue_depths,
    )  # fmt: skip

    async def tenant() -> uuid.UUID:
        given = request.headers.getlist("Authorization")
        if len(given) > 1:
            # Which one counts would be up to whatever reads the headers first (a proxy in
            # front may pick the other): refuse rather than guess.
            raise ApiError(400, "invalid_authorization", "more than one Authorization header")
        auth = given[0] if given else ""
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(401, "unauthorized", "missing bearer API key")
        digest = hash_api_key(key.strip())
        cached = tenants.get(digest)
        if cached and cached[1] > trio.current_time():
            return cached[0]
        tenant_id = await store.tenant_by_key_hash(digest)
        if tenant_id is None:
            raise ApiError(401, "unauthorized", "invalid API key")
        tenants[digest] = (tenant_id, trio.current_time() + TENANT_CACHE_SECONDS)
        return tenant_id

    async def body(kind: type[B]) -> B:
        ctype = request.headers.get("Content-Type", "")
        if ctype.split(";")[0].strip().lower() != "application/json":
            raise ApiError(415, "unsupported_media_type", "Content-Type must be application/json")
        data = await request.get_data(cache=False)
        assert isinstance(data, bytes)
        try:
            return jsonguard.decode(data, kind)  # depth, numbers, duplicates, NUL, surrogates
        except jsonguard.BodyRefused as exc:
            raise ApiError(exc.status, exc.code, exc.message) from exc

    def adapter_for(channel_type: str) -> Adapter:
        adapter = adapters.get(channel_type)
        if adapter is None:
            enabled = ", ".join(sorted(adapters)) or "none"
            raise ApiError(
                422, "validation_error",
                f"type: channel type {channel_type!r} is not enabled (enabled: {enabled})",
            )  # fmt: skip
        return adapter

    async def prepare(
        adapter: Adapter, cfg: dict[str, Any], stored: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Validate a channel config; ``stored`` is the current one on PATCH (secret rotation)."""
        try:
            if stored is not None and isinstance(adapter, UpdatesConfig):
                prepared = adapter.prepare_config_update(cfg, stored)
            else:
                prepared = adapter.prepare_config(cfg)
            if isinstance(adapter, ChecksDestination):
                await adapter.check_destination(prepared)
            return prepared
        except InvalidChannelConfig as exc:
            raise ApiError(422, "validation_error", str(exc)) from exc

    @app.after_request
    async def finish_reading_the_body(response: Response) -> Response:
        """Read what is left of the request body before answering (an error such as 401, 404
        or 405 answers without reading it), so the connection can carry the next request. A
        body over ``max_body_bytes`` (or too slow to come) is not read: the answer closes the
        connection instead."""
        try:
            await request.get_data(cache=False)
        except (RequestEntityTooLarge, RequestTimeout):
            response.headers["Connection"] = "close"
        return response

    @app.errorhandler(ApiError)
    async def on_api_error(exc: ApiError) -> Response:
        return _error(exc.status, exc.code, exc.message, exc.headers)

    @app.errorhandler(HTTPException)
    async def on_http_error(exc: HTTPException) -> Response:
        code = (exc.name or "error").lower().replace(" ", "_")
        response = _error(exc.code or 500, code, exc.description or exc.name or "error")
        if exc.code == 405 and exc.valid_methods:  # type: ignore[attr-defined]
            response.headers["Allow"] = ", ".join(exc.valid_methods)  # type: ignore[attr-defined]
        return response

    @app.errorhandler(StoreUnavailable)
    async def on_store_unavailable(exc: StoreUnavailable) -> Response:
        log.warning("answering 503: %s", exc)
        return _error(
            503, "unavailable", "the database is unavailable or did not answer in time; try again",
            {"Retry-After": str(RETRY_AFTER_SECONDS)},
        )  # fmt: skip

    @app.errorhandler(UnstorableText)
    async def on_unstorable_text(exc: UnstorableText) -> Response:
        return _error(
            422, "validation_error",
            "text must not contain the NUL character (\\u0000): Postgres cannot store it",
        )  # fmt: skip

    @app.errorhandler(Exception)
    async def on_exception(exc: Exception) -> Response:
        log.error("request failed", exc_info=exc)
        return _error(500, "internal_error", "internal error")

    # -- health -------------------------------------------------------------------------------

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json(Health(status="ok"))

    @app.get("/readyz")
    async def readyz() -> Response:
        """Postgres and RabbitMQ checked at once; an answer within about a second whatever
        they do (a stalled dependency is unavailable, not a probe that never returns)."""
        probes: dict[str, Check] = {"database": functools.partial(store.ping, CHECK_SECONDS)}
        if check_broker is not None:
            probes["broker"] = check_broker
        checks = await run_checks(probes)
        ready = all(v == "ok" for v in checks.values())
        return _json(Readiness(status="ready" if ready else "unavailable", checks=checks),
                     200 if ready else 503)  # fmt: skip

    openapi = msgspec.json.encode(
        build_openapi(
            channel_types=adapters, max_body_bytes=config.ingest.max_body_bytes,
            max_batch_events=config.ingest.max_batch_events, max_page=MAX_PAGE,
            default_page=DEFAULT_PAGE,
        )
    )  # fmt: skip

    @app.get("/openapi.json")
    async def openapi_document() -> Response:
        return Response(openapi, content_type="application/json")

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        # No API key, like the health routes: keep the port internal.
        await scrape.refresh()
        return Response(meters.render(), content_type=METRICS_CONTENT_TYPE)

    # -- channels -----------------------------------------------------------------------------

    @app.post("/v1/channels")
    async def create_channel() -> Response:
        tenant_id = await tenant()
        data = await body(ChannelIn)
        adapter = adapter_for(data.type)
        channel = await store.create_channel(
            tenant_id, type=data.type, name=data.name, config=await prepare(adapter, data.config),
            recipient=data.recipient, event_types=data.event_types, enabled=data.enabled,
            max_attempts=data.max_attempts,
        )  # fmt: skip
        return _json(_channel_view(channel, adapter, reveal=True), 201)

    @app.get("/v1/channels")
    async def list_channels() -> Response:
        tenant_id = await tenant()
        limit = _limit_arg()
        cursor = request.args.get("cursor")
        rows = await store.list_channels(
            tenant_id, type=request.args.get("type"), recipient=request.args.get("recipient"),
            after=_decode_cursor(cursor) if cursor else None, limit=limit + 1,
        )  # fmt: skip
        page, more = rows[:limit], len(rows) > limit
        return _json(ChannelPage(
            items=[_channel_view(c, adapters.get(c.type)) for c in page],
            next_cursor=_encode_cursor(page[-1].created_at, page[-1].id) if more else None,
        ))  # fmt: skip

    @app.get("/v1/channels/<uuid:channel_id>")
    async def get_channel(channel_id: uuid.UUID) -> Response:
        channel = await store.get_channel(await tenant(), channel_id)
        if channel is None:
            raise ApiError(404, "not_found", "channel not found")
        return _json(_channel_view(channel, adapters.get(channel.type)))

    @app.patch("/v1/channels/<uuid:channel_id>")
    async def patch_channel(channel_id: uuid.UUID) -> Response:
        """Change only the fields the body names: a concurrent change of the others (another
        PATCH, the worker disabling the channel) stays. A new config is made from the stored
        one (its secrets carried over, a rotation started); if the stored one changes before
        the write, it is made again from the new one."""
        tenant_id = await tenant()
        patch = await body(ChannelPatch)
        named = {k: v for k, v in msgspec.structs.asdict(patch).items() if v is not msgspec.UNSET}
        for _ in range(PATCH_CONFIG_TRIES):
            channel = await store.get_channel(tenant_id, channel_id)
            if channel is None:
                raise ApiError(404, "not_found", "channel not found")
            changes = dict(named)
            if "config" in changes:
                changes["config"] = await patched_config(channel, changes["config"])
            try:
                updated = await store.update_channel(
                    tenant_id, channel_id, ChannelChanges(**changes),
                    config_read=channel.config if "config" in changes else None,
                )  # fmt: skip
            except ConfigChanged:
                continue
            if updated is None:
                raise ApiError(404, "not_found", "channel not found")
            return _json(_channel_view(updated, adapters.get(updated.type)))
        raise ApiError(
            409, "conflict", "the channel's config kept changing while this PATCH was made; "
            "send it again",
        )  # fmt: skip

    async def patched_config(channel: Channel, config: dict[str, Any]) -> dict[str, Any]:
        """The config a PATCH gives ``channel``: validated against its type, its stored
        secrets kept unless replaced."""
        adapter = adapter_for(channel.type)
        new_config = dict(config)
        for key in adapter.secret_fields:  # secrets are kept unless replaced
            if key not in new_config and key in channel.config:
                new_config[key] = channel.config[key]
        return await prepare(adapter, new_config, channel.config)

    @app.delete("/v1/channels/<uuid:channel_id>")
    async def delete_channel(channel_id: uuid.UUID) -> Response:
        if not await store.delete_channel(await tenant(), channel_id):
            raise ApiError(404, "not_found", "channel not found")
        return Response(b"", status=204)

    # -- events -------------------------------------------------------------------------------

    limits = config.ingest
    rate_limiter: KeyedLimiter[uuid.UUID] | None = None
    if limits.rate_limit_per_second > 0:
        rate_limiter = KeyedLimiter(
            lambda: RefillingBucket(limits.rate_limit_burst, limits.rate_limit_per_second)
        )

    def admit(tenant_id: uuid.UUID, count: int) -> None:
        """Spend ``count`` events of the key's rate limit, or answer 429 writing nothing."""
        if rate_limiter is None:
            return
        now = trio.current_time()
        count = min(count, limits.rate_limit_burst)
        wait = rate_limiter.wait(tenant_id, now, count)
        if wait > 0:
            raise ApiError(
                429, "rate_limited",
                f"over {limits.rate_limit_per_second:g} events per second for this API key; "
                f"retry in {math.ceil(wait)} s", {"Retry-After": str(math.ceil(wait))},
            )  # fmt: skip
        rate_limiter.take(tenant_id, now, count)

    async def ingest(tenant_id: uuid.UUID, events: list[NewEvent]) -> list[Any]:
        admit(tenant_id, len(events))
        try:
            results = await store.ingest(tenant_id, events, max_attempts)
        except IdempotencyConflict as exc:
            raise ApiError(409, "idempotency_conflict", str(exc)) from exc
        except UnknownChannels as exc:
            raise ApiError(422, "validation_error", f"channel_ids: {exc}") from exc
        ingested.inc(sum(1 for r in results if r.created))
        return results

    @app.post("/v1/events")
    async def post_event() -> Response:
        tenant_id = await tenant()
        data = await body(EventIn)
        key = data.idempotency_key
        header_key = request.headers.get("Idempotency-Key")
        if header_key is not None:
            if not 1 <= len(header_key) <= 255:
                raise ApiError(422, "validation_error", "Idempotency-Key: 1 to 255 characters")
            if key is not None and key != header_key:
                raise ApiError(
                    422, "validation_error",
                    "idempotency_key: differs from the Idempotency-Key header",
                )  # fmt: skip
            key = header_key
        (result,) = await ingest(tenant_id, [new_event(data, key)])
        return _json(_event_view(result.event), 202 if result.created else 200)

    @app.post("/v1/events/batch")
    async def post_batch() -> Response:
        tenant_id = await tenant()
        data = await body(BatchIn)
        if len(data.events) > config.ingest.max_batch_events:
            raise ApiError(
                422, "validation_error",
                f"events: at most {config.ingest.max_batch_events} events per batch",
            )  # fmt: skip
        results = await ingest(tenant_id, [new_event(e, e.idempotency_key) for e in data.events])
        status = 202 if any(r.created for r in results) else 200
        return _json(EventBatch(events=[_event_view(r.event) for r in results]), status)

    @app.get("/v1/events/<uuid:event_id>")
    async def get_event(event_id: uuid.UUID) -> Response:
        event = await store.get_event(await tenant(), event_id)
        if event is None:
            raise ApiError(404, "not_found", "event not found")
        return _json(_event_view(event, with_payload=True))

    # -- deliveries ---------------------------------------------------------------------------

    @app.get("/v1/deliveries")
    async def list_deliveries() -> Response:
        tenant_id = await tenant()
        status = request.args.get("status")
        if status is not None and status not in DELIVERY_STATUSES:
            raise ApiError(
                422, "invalid_parameter", f"status must be one of {', '.join(DELIVERY_STATUSES)}"
            )
        limit = _limit_arg()
        cursor = request.args.get("cursor")
        rows = await store.list_deliveries(
            tenant_id, status=status, channel_id=_uuid_arg("channel_id"),
            event_id=_uuid_arg("event_id"), before=_decode_cursor(cursor) if cursor else None,
            limit=limit + 1,
        )  # fmt: skip
        page, more = rows[:limit], len(rows) > limit
        return _json(DeliveryPage(
            items=[_delivery_view(d) for d in page],
            next_cursor=_encode_cursor(page[-1].created_at, page[-1].id) if more else None,
        ))  # fmt: skip

    @app.get("/v1/deliveries/<uuid:delivery_id>")
    async def get_delivery(delivery_id: uuid.UUID) -> Response:
        delivery = await store.get_delivery(await tenant(), delivery_id)
        if delivery is None:
            raise ApiError(404, "not_found", "delivery not found")
        return _json(_delivery_view(delivery))

    # -- replay -------------------------------------------------------------------------------

    @app.post("/v1/deliveries/<uuid:delivery_id>/retry")
    async def replay_delivery(delivery_id: uuid.UUID) -> Response:
        tenant_id = await tenant()
        data = await request.get_data(cache=False)
        assert isinstance(data, bytes)
        if data.strip():  # no body, or an empty object
            try:
                jsonguard.decode(data, NoFields)
            except jsonguard.BodyRefused as exc:
                raise ApiError(exc.status, exc.code, exc.message) from exc
        try:
            await store.replay_delivery(tenant_id, delivery_id)
        except NotFound as exc:
            raise ApiError(404, "not_found", "delivery not found") from exc
        except NotReplayable as exc:
            raise ApiError(409, "not_replayable", str(exc)) from exc
        delivery = await store.get_delivery(tenant_id, delivery_id)
        if delivery is None:  # deleted by retention in between
            raise ApiError(404, "not_found", "delivery not found")
        return _json(_delivery_view(delivery), 202)

    @app.post("/v1/deliveries/retry")
    async def replay_deliveries() -> Response:
        tenant_id = await tenant()
        data = await body(ReplayIn)
        page = await store.replay_deliveries(
            tenant_id, status=data.status, channel_id=data.channel_id, event_type=data.event_type,
            created_after=_utc("created_after", data.created_after),
            created_before=_utc("created_before", data.created_before),
            after=_decode_cursor(data.cursor) if data.cursor is not None else None,
            limit=data.limit,
        )  # fmt: skip
        return _json(ReplayResult(
            queued=page.queued, more=page.more,
            next_cursor=_encode_cursor(*page.next) if page.next else None,
        ), 202)  # fmt: skip

    return app
