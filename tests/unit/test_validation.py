"""``locate``: msgspec's validation messages turned into ``path: problem``, naming the whole key."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import pytest

from notifier.validation import allowed_values, key_error, locate


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    mode: Literal["fast", "slow"] = "fast"
    size: Annotated[int, msgspec.Meta(ge=2)] | Literal["auto"] = "auto"
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for i, name in enumerate(self.names):
            if not name:
                raise key_error(f"names[{i}]", "must not be empty")


class Outer(msgspec.Struct, forbid_unknown_fields=True):
    inner: Inner | None = None
    many: list[Inner] = []
    by_name: dict[str, Inner] = {}


def problem(data: object) -> tuple[str, str]:
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.convert(data, Outer)
    return locate(info.value, Outer)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # a struct's own check about one of its keys is told at that key, however deep
        ({"inner": {"names": ["a", ""]}}, ("inner.names[1]", "must not be empty")),
        ({"many": [{}, {"names": [""]}]}, ("many[1].names[0]", "must not be empty")),
        # a value outside a Literal lists the allowed ones, in the order declared
        ({"inner": {"mode": "warp"}}, ("inner.mode", 'expected one of "fast", "slow", got "warp"')),
        ({"by_name": {"x": {"mode": "warp"}}},
         ("by_name[...].mode", 'expected one of "fast", "slow", got "warp"')),
        ({"inner": {"size": "big"}},
         ("inner.size", 'expected an integer >= 2 or "auto", got "big"')),
        # other problems keep msgspec's words
        ({"inner": {"mode": 1}}, ("inner.mode", "Expected `str`, got `int`")),
        ({"inner": {"speed": 1}}, ("inner.speed", "unknown key")),
    ],
)  # fmt: skip
def test_the_problem_is_told_at_the_whole_key(data: object, expected: tuple[str, str]) -> None:
    assert problem(data) == expected


def test_without_the_model_an_enum_problem_keeps_msgspecs_words() -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.convert({"inner": {"mode": "warp"}}, Outer)
    assert locate(info.value) == ("inner.mode", "Invalid enum value 'warp'")


def test_no_allowed_values_where_no_literal_applies() -> None:
    assert allowed_values(Outer, "inner.names[0]") is None
    assert allowed_values(Outer, "nowhere.at.all") is None
