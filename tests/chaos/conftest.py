"""Fixtures of the fault-injection suite."""

from __future__ import annotations

import pytest
import trio.testing


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    """Virtual time for a test that asks for it (pytest-trio runs the test on this clock): a
    ``trio.sleep`` takes no real time, and time jumps whenever every task waits."""
    return trio.testing.MockClock(autojump_threshold=0)


# The real services, one database (from a migrated template) and one vhost per test.
from tests.integration.conftest import (  # noqa: E402, F401
    broker_url,
    database_url,
    pg_template,
    vhost,
)
