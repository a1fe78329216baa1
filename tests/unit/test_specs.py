"""The channel-type registry: one spec per ``[workers.<type>]`` table, validators built without
any secret, and the same secret fields and config struct wherever they are read."""

from __future__ import annotations

import typing

import pytest

from notifier.adapters.base import ChannelValidator, InvalidChannelConfig
from notifier.adapters.specs import SPECS, build_validators
from notifier.config import WorkersConfig, parse_config
from notifier.ingest.openapi import build_openapi

ALL_TYPES = {name: {} for name in WorkersConfig.__struct_fields__}


def test_every_workers_table_has_a_spec_of_its_settings_type() -> None:
    hints = typing.get_type_hints(WorkersConfig)
    assert set(SPECS) == set(hints)
    for channel_type, spec in SPECS.items():
        assert hints[channel_type] == spec.settings | None


def test_validators_are_built_from_the_config_alone() -> None:
    config = parse_config({"workers": {**ALL_TYPES, "email": {"smtp_username": "mailer"}}}, env={})
    validators = build_validators(config)  # no environment: no SMTP password, no bot token
    assert set(validators) == set(SPECS)
    for channel_type, validator in validators.items():
        assert isinstance(validator, ChannelValidator)
        assert validator.prepare_config(SPECS[channel_type].example)
    with pytest.raises(InvalidChannelConfig):
        validators["email"].prepare_config({"to": "nobody"})


def test_only_enabled_types_get_a_validator() -> None:
    config = parse_config({"workers": {"telegram": {}}}, env={})
    assert set(build_validators(config)) == {"telegram"}


def test_the_openapi_document_shows_each_specs_config_struct_and_example() -> None:
    doc = build_openapi(
        channel_types=list(SPECS), max_body_bytes=1024, max_batch_events=10, max_page=100,
        default_page=50,
    )  # fmt: skip
    schemas = doc["components"]["schemas"]
    for channel_type, spec in SPECS.items():
        variant = schemas[f"{channel_type.capitalize()}ChannelIn"]
        assert variant["properties"]["config"] == {
            "$ref": f"#/components/schemas/{spec.config.__name__}"
        }
