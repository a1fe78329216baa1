"""The app-wide answers, in one place: every error a handler raises (or the framework, or the
store) becomes ``{"error": {"code", "message"}}`` with its status, and every request's body is
read to its end (or the connection closed) before the answer goes."""

from __future__ import annotations

import logging
from collections.abc import Mapping

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


ErrorParts = tuple[int, str, str, Mapping[str, str]]  # status, code, message, headers


def http_error_parts(exc: HTTPException) -> ErrorParts:
    """The answer to one of werkzeug's errors (a 404, a 405, a 413 from the body's size...)."""
    code = (exc.name or "error").lower().replace(" ", "_")
    return exc.code or 500, code, exc.description or exc.name or "error", {}


def error_parts(exc: Exception) -> ErrorParts:
    """The answer to ``exc``, raised while answering a request: the quart app's error handlers
    and the lean ingest routes (``api.hot``) both answer through it. Anything unexpected is
    logged (and so reported to Sentry) and answered 500 without detail."""
    if isinstance(exc, ApiError):
        return exc.status, exc.code, exc.message, exc.headers
    if isinstance(exc, HTTPException):
        return http_error_parts(exc)
    if isinstance(exc, StoreUnavailable):
        log.warning("answering 503: %s", exc)
        return (
            503, "unavailable", "the database is unavailable or did not answer in time; try again",
            {"Retry-After": str(RETRY_AFTER_SECONDS)},
        )  # fmt: skip
    if isinstance(exc, UnstorableText):
        return (
            422, "validation_error",
            "text must not contain the NUL character (\\u0000): Postgres cannot store it", {},
        )  # fmt: skip
    if isinstance(exc, IdempotencyConflict):
        return 409, *refusal(exc), {}
    if isinstance(exc, UnknownChannels):
        return 422, *refusal(exc), {}
    log.error("request failed", exc_info=exc)
    return 500, "internal_error", "internal error", {}


async def on_error(exc: Exception) -> Response:
    return error_response(*error_parts(exc))


async def on_http_error(exc: HTTPException) -> Response:
    response = error_response(*http_error_parts(exc))
    if exc.code == 405 and exc.valid_methods:  # type: ignore[attr-defined]
        response.headers["Allow"] = ", ".join(exc.valid_methods)  # type: ignore[attr-defined]
    return response


def install_error_handlers(app: Quart) -> None:
    app.after_request(finish_reading_the_body)
    app.register_error_handler(HTTPException, on_http_error)
    # Each kind by name, as a blueprint's handler of a wider kind must not catch them first.
    for kind in (ApiError, StoreUnavailable, UnstorableText, IdempotencyConflict, UnknownChannels):
        app.register_error_handler(kind, on_error)
    app.register_error_handler(Exception, on_error)
