"""The request and answer pieces every route group uses: ``ApiError`` (raised anywhere in a
handler, answered by ``errors``), JSON answers in the one error-body shape, and the reading of
a JSON body and of query parameters."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec
from quart import Response, request

from notifier.errors import NotifierError
from notifier.ingest import jsonguard
from notifier.ingest.views import ErrorBody, ErrorDetail

B = TypeVar("B")


class ApiError(NotifierError):
    """An answer other than success: ``status`` with ``{"error": {"code", "message"}}``."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        msgspec.json.encode(data), status=status, headers=dict(headers or {}),
        content_type="application/json",
    )  # fmt: skip


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    return json_response(ErrorBody(error=ErrorDetail(code=code, message=message)), status, headers)


def decode_body(data: bytes, kind: type[B]) -> B:
    """``data`` as ``kind``, through the guard (depth, numbers, duplicates, NUL, surrogates)."""
    try:
        return jsonguard.decode(data, kind)
    except jsonguard.BodyRefused as exc:
        raise ApiError(exc.status, exc.code, exc.message) from exc


async def read_body(kind: type[B]) -> B:
    """The request's JSON body as ``kind``; 415 unless it says it is JSON."""
    ctype = request.headers.get("Content-Type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise ApiError(415, "unsupported_media_type", "Content-Type must be application/json")
    data = await request.get_data(cache=False)
    assert isinstance(data, bytes)
    return decode_body(data, kind)


def uuid_arg(name: str) -> uuid.UUID | None:
    value = request.args.get(name)
    if value is None:
        return None
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise ApiError(422, "invalid_parameter", f"{name} must be a UUID") from exc


def in_utc(field: str, value: datetime | None) -> datetime | None:
    """``value`` in UTC, as Postgres compares it; 422 naming ``field`` if UTC cannot hold it
    (``0001-01-01T00:00:00+14:00``)."""
    try:
        return None if value is None else value.astimezone(UTC)
    except OverflowError as exc:
        raise ApiError(422, "validation_error", f"{field}: out of range in UTC") from exc
