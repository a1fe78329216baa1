"""The ingest server's connection keys: defaults, and refusals that name the key."""

from __future__ import annotations

from typing import Any

import pytest

from notifier.config import parse_config
from notifier.errors import ConfigError


def refusal(ingest: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config({"ingest": ingest}, env={})
    return str(info.value)


def test_the_defaults() -> None:
    ingest = parse_config({}, env={}).ingest
    assert ingest.write_timeout_seconds == 30.0
    assert ingest.max_connections == "auto"
    assert ingest.max_connections_per_address == 256


def test_given_values_are_kept() -> None:
    ingest = parse_config({"ingest": {
        "write_timeout_seconds": 2.5, "max_connections": 100, "max_connections_per_address": 0,
    }}, env={}).ingest  # fmt: skip
    assert (ingest.write_timeout_seconds, ingest.max_connections) == (2.5, 100)
    assert ingest.max_connections_per_address == 0  # no limit per address


@pytest.mark.parametrize(
    ("ingest", "key"),
    [
        ({"write_timeout_seconds": 0}, "write_timeout_seconds"),  # a write needs some time
        ({"write_timeout_seconds": -1}, "write_timeout_seconds"),
        ({"write_timeout_seconds": float("inf")}, "write_timeout_seconds"),  # never bounded
        ({"max_connections": 0}, "max_connections"),  # no connection at all
        ({"max_connections": "lots"}, "max_connections"),  # a number or "auto"
        ({"max_connections_per_address": -1}, "max_connections_per_address"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key(ingest: dict[str, Any], key: str) -> None:
    assert refusal(ingest).startswith(f"ingest.{key}: ")
