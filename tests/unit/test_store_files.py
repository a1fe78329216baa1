"""The SQL files the store loads: the schema at the top of the repository is the one shipped,
named queries come from every ``queries*.sql`` file, each name once, and the rules the schema's
functions hold (the worker message, the pattern rule, the channel state) are spelled there only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from notifier.store.base import SCHEMA_PATH, Q, load_queries

ROOT = Path(__file__).resolve().parents[2]


def test_the_repository_schema_is_the_shipped_schema() -> None:
    assert (ROOT / "schema.sql").read_text() == SCHEMA_PATH.read_text()


def test_queries_are_loaded_from_every_queries_file(tmp_path: Path) -> None:
    (tmp_path / "queries.sql").write_text("-- name: a\nSELECT 1;\n-- name: b\nSELECT 2;\n")
    (tmp_path / "queries_more.sql").write_text("-- a comment\n-- name: c\nSELECT\n  3;\n")
    (tmp_path / "other.sql").write_text("-- name: d\nSELECT 4;\n")
    assert load_queries(tmp_path) == {"a": "SELECT 1;", "b": "SELECT 2;", "c": "SELECT\n  3;"}


def test_a_query_name_defined_twice_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "queries.sql").write_text("-- name: a\nSELECT 1;\n")
    (tmp_path / "queries_more.sql").write_text("-- name: a\nSELECT 2;\n")
    with pytest.raises(ValueError, match="query 'a' is defined twice"):
        load_queries(tmp_path)


def _code(query: str) -> str:
    """The query without its comments."""
    return re.sub(r"--.*", "", query)


@pytest.mark.parametrize("name", sorted(Q))
def test_queries_use_the_schema_functions_for_the_shared_rules(name: str) -> None:
    code = _code(Q[name])
    if "INSERT INTO outbox" in code:  # every outbox body is the one worker message
        assert "notifier_worker_message(" in code
        assert "jsonb_build_object('delivery_id'" not in code.replace("\n", "").replace(" ", "")
    assert "'.*'" not in code, "the pattern rule is notifier_type_matches"
    assert "'deleted'" not in code, "the channel state is notifier_channel_state"
