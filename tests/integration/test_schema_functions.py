"""The SQL functions of schema.sql against their Python counterparts, in a migrated database:
``notifier_worker_message`` builds exactly the fields of ``messages.WorkerMessage``, and
``notifier_type_matches`` agrees with ``notifier.testing.pattern_matches`` case by case, and
``notifier migrate`` adds the functions to a database made before them."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from notifier.messages import WorkerMessage, decode_message
from notifier.testing import pattern_matches
from tests.integration.conftest import make_pre_versions_database, scalar, sql
from tests.integration.test_cli import config_file, notifier
from tests.unit.test_fanout import PATTERN_CASES

TENANT = uuid.uuid4()
CHANNEL = uuid.uuid4()


async def worker_message(
    database_url: str, *, recipient: str | None, config: dict[str, Any], attempt: int
) -> tuple[bytes, dict[str, Any]]:
    """Store an event and a delivery of it, and build its message with the SQL function; return
    the body and the values each field must carry."""
    event_id, delivery_id = uuid.uuid4(), uuid.uuid4()
    payload = {"order": 7, "items": [{"sku": "a-1"}], "note": None, "é": "ü"}
    await sql(
        database_url,
        "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        TENANT, "acme", "0" * 64,
    )  # fmt: skip
    await sql(
        database_url,
        "INSERT INTO events (id, tenant_id, type, recipient, payload) VALUES ($1, $2, $3, $4, $5)",
        event_id, TENANT, "order.created", recipient, json.dumps(payload),
    )  # fmt: skip
    await sql(
        database_url,
        "INSERT INTO deliveries (id, event_id, channel_id, tenant_id, channel_type, max_attempts)"
        " VALUES ($1, $2, $3, $4, 'webhook', 9)",
        delivery_id, event_id, CHANNEL, TENANT,
    )  # fmt: skip
    rows = await sql(
        database_url,
        "SELECT notifier_worker_message(d, e, $2::jsonb, $3), e.created_at"
        " FROM deliveries d JOIN events e ON e.id = d.event_id WHERE d.id = $1",
        delivery_id, json.dumps(config), attempt,
    )  # fmt: skip
    body, created_at = rows[0]
    expected = {
        "delivery_id": delivery_id, "event_id": event_id, "tenant_id": TENANT,
        "channel_id": CHANNEL, "channel_type": "webhook", "channel_config": config,
        "event_type": "order.created", "recipient": recipient, "payload": payload,
        "created_at": created_at, "attempt": attempt, "max_attempts": 9,
    }  # fmt: skip
    return body, expected


@pytest.mark.parametrize("recipient", ["user-42", None])
async def test_the_sql_worker_message_decodes_with_the_python_type(
    database_url: str, recipient: str | None
) -> None:
    config = {"url": "https://example.com/hook", "secrets": ["whsec_x"], "headers": {}}
    body, expected = await worker_message(
        database_url, recipient=recipient, config=config, attempt=3
    )
    fields = set(WorkerMessage.__struct_fields__)
    # the same field names on both sides: a field added to one only fails here
    assert set(msgspec.json.decode(body)) == fields == set(expected)
    message = decode_message(body)
    assert {name: getattr(message, name) for name in fields} == expected
    assert message.created_at.tzinfo is not None


async def test_the_sql_pattern_rule_agrees_with_the_python_one(database_url: str) -> None:
    patterns = [p for p, _, _ in PATTERN_CASES]
    types = [t for _, t, _ in PATTERN_CASES]
    rows = await sql(
        database_url,
        "SELECT notifier_type_matches(p, t) FROM unnest($1::text[], $2::text[])"
        " WITH ORDINALITY AS x(p, t, n) ORDER BY n",
        patterns, types,
    )  # fmt: skip
    in_sql = [r[0] for r in rows]
    in_python = [pattern_matches(p, t) for p, t, _ in PATTERN_CASES]
    assert in_sql == in_python == [m for _, _, m in PATTERN_CASES]


async def test_the_channel_state_of_a_delivery(database_url: str) -> None:
    """enabled, disabled, or deleted (no channel row: the outer join's all-NULL row)."""
    await sql(
        database_url,
        "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, 'acme', $2)",
        TENANT,
        "1" * 64,
    )
    on, off = uuid.uuid4(), uuid.uuid4()
    for channel_id, enabled in ((on, True), (off, False)):
        await sql(
            database_url,
            "INSERT INTO channels (id, tenant_id, type, config, enabled)"
            " VALUES ($1, $2, 'webhook', '{}', $3)",
            channel_id, TENANT, enabled,
        )  # fmt: skip
    states = {
        channel_id: await scalar(
            database_url,
            "SELECT notifier_channel_state(c) FROM (SELECT $1::uuid AS id) AS d"
            " LEFT JOIN channels c ON c.id = d.id",
            channel_id,
        )
        for channel_id in (on, off, uuid.uuid4())
    }
    assert list(states.values()) == ["enabled", "disabled", "deleted"]


async def test_migrate_adds_the_functions_to_an_older_database(
    tmp_path: Path, database_url: str
) -> None:
    functions = ("notifier_type_matches", "notifier_channel_state", "notifier_worker_message")
    # a database of a release from before schema versions were recorded (0001's tables, with
    # their rows) and from before the functions: migrate applies 0001, idempotent, again
    await make_pre_versions_database(database_url)
    await sql(database_url, "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, 'a', 'h')",
              TENANT)  # fmt: skip
    for name in functions:
        await sql(database_url, f"DROP FUNCTION {name}")
    done = notifier("migrate", "--config", str(config_file(tmp_path, database_url)))
    assert done.returncode == 0, done.stderr
    found = await sql(
        database_url, "SELECT proname FROM pg_proc WHERE proname = ANY($1::text[])", functions
    )
    assert sorted(r[0] for r in found) == sorted(functions)
    assert await scalar(database_url, "SELECT notifier_type_matches('a.*', 'a.b')") is True
    assert await scalar(database_url, "SELECT count(*) FROM tenants") == 1
