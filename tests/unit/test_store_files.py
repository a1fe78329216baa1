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


# What a statement can leave on a pooled connection for its next user: a session setting, a
# session-level advisory lock, a LISTEN. The pool sends no reset query (store/pool.py), so none
# of these may appear in the store's SQL; LISTEN runs on a connection of its own (the outbox
# doorbell's, the tenants' changes').
_OWN_CONNECTION = {"outbox.py", "listen.py"}
_SESSION_SET = re.compile(r"SET\s+(?!LOCAL\b)", re.IGNORECASE)  # at a statement's start
_SESSION_LOCK_OR_LISTEN = re.compile(
    r"\bpg_advisory_(?:un)?lock(?:_shared)?\s*\(|\bLISTEN\b", re.IGNORECASE
)


def _statements(path: Path) -> list[str]:
    """The statements of a SQL file, or of the string literals of a module, comments left out."""
    text = path.read_text()
    if path.suffix == ".py":
        text = ";".join(re.findall(r'"([^"\n]*)"', text))
    text = re.sub(r"--[^\n]*", "", text)
    return [part.strip() for part in text.split(";") if part.strip()]


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(SCHEMA_PATH.parent.glob("*")) if p.suffix in (".sql", ".py")],
    ids=lambda p: p.name,
)
def test_the_store_leaves_no_session_state_on_a_pooled_connection(path: Path) -> None:
    found = [
        statement for statement in _statements(path)
        if _SESSION_SET.match(statement)
        or (_SESSION_LOCK_OR_LISTEN.search(statement) and path.name not in _OWN_CONNECTION)
    ]  # fmt: skip
    assert found == []


def test_the_session_state_rule_sees_a_session_set_and_lock(tmp_path: Path) -> None:
    leaky = tmp_path / "queries_leaky.sql"
    leaky.write_text(
        "-- name: a\nUPDATE t\nSET a = 1;\n-- name: b\nSET LOCAL x = 1;\n"
        "-- name: c\nSET statement_timeout = 0;\n-- name: d\nSELECT pg_advisory_lock(1);\n"
    )
    statements = _statements(leaky)
    assert [s for s in statements if _SESSION_SET.match(s)] == ["SET statement_timeout = 0"]
    assert [s for s in statements if _SESSION_LOCK_OR_LISTEN.search(s)] == [
        "SELECT pg_advisory_lock(1)"
    ]
