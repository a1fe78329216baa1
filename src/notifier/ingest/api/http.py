"""The request and answer pieces every route group uses: ``ApiError`` (raised anywhere in a
handler, answered by ``errors``), JSON answers in the one error-body shape, and the reading of
a JSON body and of query parameters."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec
from quart import Response, request

from notifier.errors import NotifierError
from notifier.ingest import jsonguard
from notifier.ingest.views import ErrorBody, ErrorDetail
from notifier.validation import locate

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


def error_body(code: str, message: str) -> bytes:
    """The one error-body shape, ``{"error": {"code": ..., "message": ...}}``, encoded."""
    return msgspec.json.encode(ErrorBody(error=ErrorDetail(code=code, message=message)))


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        error_body(code, message), status=status, headers=dict(headers or {}),
        content_type="application/json",
    )  # fmt: skip


# msgspec's words for a float where an integer goes, and the path it gives (fields and indexes).
_INT_GOT_FLOAT = re.compile(r"Expected `int(?: \| null)?`, got `float`")
_AT = re.compile(r" - at `\$((?:\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]+\])*)`$")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[([0-9]+)\]")


def decode_body(data: bytes, kind: type[B]) -> B:
    """``data`` as ``kind``, through the guard (depth, numbers, duplicates, NUL, surrogates).

    An integer field takes a number with a zero fraction (``229.0``), as JSON Schema (and so the
    OpenAPI document) counts it an integer: such a body is decoded a second time, each such
    number made an integer where the model refused it as a float."""
    try:
        return jsonguard.decode(data, kind)
    except jsonguard.BodyRefused as exc:
        if exc.status != 422 or not _INT_GOT_FLOAT.search(exc.message):
            raise ApiError(exc.status, exc.code, exc.message) from exc
        refused = exc
    tree = msgspec.json.decode(data)  # the guard passed it: JSON within the limits
    while True:
        try:
            return msgspec.convert(tree, kind)
        except msgspec.ValidationError as error:
            if not _make_integer(tree, str(error)):
                path, text = locate(error)
                raise ApiError(422, "validation_error", f"{path or 'body'}: {text}") from refused


def _make_integer(tree: Any, message: str) -> bool:
    """Turn the float ``message`` (msgspec's) says should be an integer into one, if it is a
    whole number; False if it is not (or the message says something else)."""
    at = _AT.search(message)
    if not _INT_GOT_FLOAT.match(message) or at is None:
        return False
    steps = [name or int(index) for name, index in _STEP.findall(at[1])]
    if not steps:
        return False
    parent = tree
    for step in steps[:-1]:
        parent = parent[step]
    value = parent[steps[-1]]
    if not (isinstance(value, float) and value.is_integer()):
        return False
    parent[steps[-1]] = int(value)
    return True


def check_json_type(content_type: str) -> None:
    """415 unless ``content_type`` (the request's ``Content-Type``, "" without one) says JSON."""
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise ApiError(415, "unsupported_media_type", "Content-Type must be application/json")


async def read_body(kind: type[B]) -> B:
    """The request's JSON body as ``kind``; 415 unless it says it is JSON."""
    check_json_type(request.headers.get("Content-Type", ""))
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
