"""Schema states as an operator reads them, tenant names and times the CLI takes, and how long a
rotated key or a disabled tenant is still admitted by a process that had looked it up (virtual
time)."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing

from notifier.cli import _tenant_name, _utc_time
from notifier.ingest.tenants import TENANT_CACHE_SECONDS, TenantCache
from notifier.store.versions import LATEST, MIGRATIONS, SchemaState

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_migrations_are_the_top_level_ones() -> None:
    assert [f"{m.version:04d}_{m.name}.sql" for m in MIGRATIONS] == sorted(
        p.name for p in (ROOT / "migrations").glob("*.sql")
    )
    assert LATEST == len(MIGRATIONS) >= 2
    assert "enabled" in MIGRATIONS[1].sql


@pytest.mark.parametrize(
    ("applied", "status", "says"),
    [
        (set(), "missing", "no schema version"),
        ({1}, "behind", "missing 2"),
        ({1, 2}, "current", "(current)"),
        ({1, 2, 3}, "ahead", "newer than this code's 2"),
    ],
)
def test_schema_states(applied: set[int], status: str, says: str) -> None:
    state = SchemaState(frozenset(applied), latest=2)
    assert state.status == status
    assert says in state.describe()
    assert ("notifier migrate" in state.describe()) == (status in ("missing", "behind"))


@pytest.mark.parametrize("name", ["a", "acme", "Acme-1_a.b", "x" * 100])
def test_valid_tenant_names(name: str) -> None:
    assert _tenant_name(name) == name


@pytest.mark.parametrize("name", ["", "a b", "x" * 101, "ünï", "a/b", "a\nb", "'; DROP"])
def test_invalid_tenant_names(name: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid tenant name"):
        _tenant_name(name)


async def test_a_rotated_key_is_refused_within_the_cache_bound(
    mock_clock: trio.testing.MockClock,
) -> None:
    tenant = uuid.uuid4()
    keys = {"old-hash": tenant}

    async def lookup(hashes: Sequence[str]) -> dict[str, uuid.UUID]:
        return {h: keys[h] for h in hashes if h in keys}

    cache = TenantCache(lookup)
    assert await cache.resolve_one("old-hash") == tenant
    keys = {"new-hash": tenant}  # rotate-key: the old hash is gone from the store
    assert await cache.resolve_one("new-hash") == tenant  # the new key works at once
    await trio.sleep(TENANT_CACHE_SECONDS - 0.01)
    assert await cache.resolve_one("old-hash") == tenant  # still cached, within the bound
    await trio.sleep(0.01)
    assert await cache.resolve_one("old-hash") is None
    assert TENANT_CACHE_SECONDS <= 5


@pytest.mark.parametrize(
    ("value", "utc"),
    [
        ("2026-01-02", "2026-01-02T00:00:00+00:00"),  # a date: its midnight, UTC
        ("2026-01-02T10:30", "2026-01-02T10:30:00+00:00"),  # no offset: UTC
        ("2026-01-02T10:30:00Z", "2026-01-02T10:30:00+00:00"),
        ("2026-01-02T01:00:00+01:00", "2026-01-02T00:00:00+00:00"),  # an offset: converted
        ("2026-01-02 10:30:00.5", "2026-01-02T10:30:00.500000+00:00"),
    ],
)
def test_expunge_before_takes_an_iso_date_or_time_in_utc(value: str, utc: str) -> None:
    assert _utc_time(value).isoformat() == utc


@pytest.mark.parametrize(
    "value",
    ["", "yesterday", "2026-02-30", "02/01/2026", "2026-01-02T24:01", "0001-01-01T00:00+01:00"],
)
def test_expunge_before_refuses_what_is_not_an_iso_date_or_time(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _utc_time(value)
