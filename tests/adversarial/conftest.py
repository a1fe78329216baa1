"""The adversarial suite: what hostile clients, sloppy clients and racing requests send.

Each module takes one class of input (HTTP/2 frame sequences, racing writes, header and pattern
tables with control and non-ASCII characters) and holds the service to the same rules as the
rest of the suite: a clear 4xx with a JSON error body, nothing written for bad input, no 500, no
crashed process and no secret in a log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

# The real services, one database (from a migrated template) and one vhost per test.
from tests.integration.conftest import (  # noqa: F401
    broker_url,
    config,
    database_url,
    pg_template,
    vhost,
)


@pytest.fixture(autouse=True)
def _no_error_line(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Whatever a test of this suite sends, nothing in the process logs at ERROR or above: an
    unhandled request (a 500), a crashed component or a handler panic would."""
    caplog.set_level(logging.WARNING)
    yield
    errors = [
        f"{r.name}: {r.getMessage()}"
        for when in ("setup", "call", "teardown")
        for r in caplog.get_records(when)
        if r.levelno >= logging.ERROR
    ]
    assert errors == [], errors
