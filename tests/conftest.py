"""Shared test set-up: no NOTIFIER_* variable from the environment leaks into a test."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _scrub_notifier_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("NOTIFIER_"):
            monkeypatch.delenv(name)
