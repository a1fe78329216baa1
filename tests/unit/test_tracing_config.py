"""``[tracing]``: off by default, its keys parsed, bad values refused naming the key (without
repeating the endpoint), the endpoint overridable from the environment."""

from __future__ import annotations

from typing import Any

import pytest

from notifier.config import TracingConfig, parse_config
from notifier.errors import ConfigError


def refusal(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, env={})
    return str(info.value)


def test_tracing_is_off_by_default() -> None:
    tracing = parse_config({}, env={}).tracing
    assert tracing == TracingConfig()
    assert tracing.enabled is False
    assert tracing.otlp_endpoint == ""
    assert tracing.service_name == "notifier"
    assert tracing.sample_ratio == 1.0
    assert tracing.export_interval_seconds == 5.0
    assert tracing.export_timeout_seconds == 10.0


def test_given_tracing_keys_are_kept() -> None:
    data = {
        "tracing": {
            "otlp_endpoint": "http://127.0.0.1:4318/",
            "service_name": "notifier-eu",
            "sample_ratio": 0.25,
            "export_interval_seconds": 0.5,
            "export_timeout_seconds": 2,
        }
    }
    tracing = parse_config(data, env={}).tracing
    assert tracing.enabled is True
    assert tracing.service_name == "notifier-eu"
    assert tracing.sample_ratio == 0.25
    assert tracing.export_interval_seconds == 0.5
    assert tracing.export_timeout_seconds == 2.0
    assert tracing.traces_url() == "http://127.0.0.1:4318/v1/traces"


def test_the_environment_sets_the_endpoint() -> None:
    env = {"NOTIFIER_OTLP_ENDPOINT": "https://collector.internal:4318"}
    config = parse_config({"tracing": {"otlp_endpoint": "http://file:4318"}}, env=env)
    assert config.tracing.otlp_endpoint == "https://collector.internal:4318"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("otlp_endpoint", "grpc://127.0.0.1:4317"),
        ("otlp_endpoint", "127.0.0.1:4318"),
        ("otlp_endpoint", "http://"),
        ("otlp_endpoint", "http://host:99999"),
        ("otlp_endpoint", "http://host:4318/?token=x"),
        ("otlp_endpoint", 4318),
        ("service_name", " "),
        ("sample_ratio", 1.5),
        ("sample_ratio", -0.1),
        ("sample_ratio", "all"),
        ("export_interval_seconds", 0),
        ("export_timeout_seconds", 0),
        ("export_timeout_seconds", 600),
    ],
)
def test_a_bad_tracing_value_is_refused_naming_its_key(key: str, value: object) -> None:
    message = refusal({"tracing": {key: value}})
    assert message.startswith(f"tracing.{key}: "), message


def test_a_refused_endpoint_is_not_repeated() -> None:
    message = refusal({"tracing": {"otlp_endpoint": "ftp://user:s3cret@collector:4318"}})
    assert "s3cret" not in message


def test_an_unknown_tracing_key_is_refused() -> None:
    assert refusal({"tracing": {"endpoint": "x"}}) == "tracing.endpoint: unknown key"
