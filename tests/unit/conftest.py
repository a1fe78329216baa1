"""Unit-test fixtures."""

from __future__ import annotations

import pytest
import trio.testing

from tests.unit.console_browser import browser  # noqa: F401  (the console's tests)


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    """Virtual time for a test that asks for it (pytest-trio runs the test on this clock): a
    ``trio.sleep`` in such a test takes no real time, and time jumps whenever every task waits."""
    return trio.testing.MockClock(autojump_threshold=0)
