"""The app-wide answers, in one place: every error a handler raises (or the framework, or the
store) becomes ``{"error": {"code", "message"}}`` with its status, and every request's body is
read to its end (or the connection closed) before the answer goes."""

from __future__ import annotations

import logging

from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from notifier.errors import StoreUnavailable, UnstorableText
from notifier.ingest.api.http import ApiError, error_response
from notifier.ingest.events import refusal
from notifier.store.errors import IdempotencyConflict, UnknownChannels

log = logging.getLogger("notifier.ingest")

RETRY_AFTER_SECONDS = 5


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


async def on_api_error(exc: ApiError) -> Response:
    return error_response(exc.status, exc.code, exc.message, exc.headers)


async def on_http_error(exc: HTTPException) -> Response:
    code = (exc.name or "error").lower().replace(" ", "_")
    response = error_response(exc.code or 500, code, exc.description or exc.name or "error")
    if exc.code == 405 and exc.valid_methods:  # type: ignore[attr-defined]
        response.headers["Allow"] = ", ".join(exc.valid_methods)  # type: ignore[attr-defined]
    return response


async def on_store_unavailable(exc: StoreUnavailable) -> Response:
    log.warning("answering 503: %s", exc)
    return error_response(
        503, "unavailable", "the database is unavailable or did not answer in time; try again",
        {"Retry-After": str(RETRY_AFTER_SECONDS)},
    )  # fmt: skip


async def on_unstorable_text(exc: UnstorableText) -> Response:
    return error_response(
        422, "validation_error",
        "text must not contain the NUL character (\\u0000): Postgres cannot store it",
    )  # fmt: skip


async def on_idempotency_conflict(exc: IdempotencyConflict) -> Response:
    return error_response(409, *refusal(exc))


async def on_unknown_channels(exc: UnknownChannels) -> Response:
    return error_response(422, *refusal(exc))


async def on_exception(exc: Exception) -> Response:
    log.error("request failed", exc_info=exc)
    return error_response(500, "internal_error", "internal error")


def install_error_handlers(app: Quart) -> None:
    app.after_request(finish_reading_the_body)
    app.register_error_handler(ApiError, on_api_error)
    app.register_error_handler(HTTPException, on_http_error)
    app.register_error_handler(StoreUnavailable, on_store_unavailable)
    app.register_error_handler(UnstorableText, on_unstorable_text)
    app.register_error_handler(IdempotencyConflict, on_idempotency_conflict)
    app.register_error_handler(UnknownChannels, on_unknown_channels)
    app.register_error_handler(Exception, on_exception)
