"""Pagination of the listing routes: the ``limit`` parameter and the opaque cursor (a row's
time and id) that says where the next page starts. The bulk replay's cursor is the same."""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

from quart import request

from notifier.ingest.api.http import ApiError

T = TypeVar("T")
DEFAULT_PAGE = 50
MAX_PAGE = 500


def encode_cursor(at: datetime, row_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(f"{at.isoformat()}|{row_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The position ``cursor`` holds; 422 ``invalid_cursor`` if it is not one of ours."""
    try:
        at, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError("the API's cursors carry the offset of their time")
        # Postgres gets it in UTC: 0001-01-01T00:00+14:00 would overflow there.
        return when.astimezone(UTC), uuid.UUID(row_id)
    except (ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise ApiError(422, "invalid_cursor", "cursor is not valid") from exc


# An integer as a query parameter: ASCII digits, few (int() refuses '²' and strings of over 4300
# digits with ValueError), and as JSON Schema counts integers, also with a zero fraction (229.0).
_WHOLE_NUMBER = re.compile(r"([0-9]{1,6})(?:\.0{1,6})?")


def limit_arg() -> int:
    """The request's ``limit`` (``DEFAULT_PAGE`` if not given), 1 to ``MAX_PAGE``."""
    value = request.args.get("limit", str(DEFAULT_PAGE))
    match = _WHOLE_NUMBER.fullmatch(value)
    if match is None or not 1 <= int(match[1]) <= MAX_PAGE:
        raise ApiError(422, "invalid_parameter", f"limit must be an integer from 1 to {MAX_PAGE}")
    return int(match[1])


def cursor_arg() -> tuple[datetime, uuid.UUID] | None:
    """The position of the request's ``cursor``, None for the first page."""
    cursor = request.args.get("cursor")
    return decode_cursor(cursor) if cursor else None


def split_page(
    rows: Sequence[T], limit: int, position: Callable[[T], tuple[datetime, uuid.UUID]]
) -> tuple[Sequence[T], str | None]:
    """The page of ``rows`` (read with ``limit + 1``, to learn whether more follow) and the
    cursor of the next page: None if this one is the last."""
    page = rows[:limit]
    return page, encode_cursor(*position(page[-1])) if len(rows) > limit else None
