"""The console's sessions and failed sign-ins on the real Postgres (migrations/0007): a session
read only while it lasts and its tenant keeps that key and is enabled, the failures counted on
Postgres's clock and forgotten after a quiet while, and maintenance deleting what has ended."""

from __future__ import annotations

from notifier.ingest.tenants import hash_api_key
from notifier.store import open_store
from notifier.store.console_sessions import SIGNIN_FORGET_AFTER_SECONDS, SignedIn
from tests.integration.conftest import create_tenant, scalar, sql

FORGET = SIGNIN_FORGET_AFTER_SECONDS


async def test_a_session_lasts_while_its_tenant_keeps_the_key(database_url: str) -> None:
    key = await create_tenant(database_url)
    key_hash = hash_api_key(key)
    tenant = await scalar(database_url, "SELECT id FROM tenants WHERE api_key_hash = $1", key_hash)
    async with open_store(database_url) as store:
        await store.create_console_session("s1", tenant, key_hash, max_age_seconds=60)
        await store.create_console_session("s2", tenant, key_hash, max_age_seconds=60)
        assert await store.console_session("s1") == SignedIn(tenant, key_hash)
        assert await store.console_session("nope") is None
        await store.end_console_session("s1")
        assert await store.console_session("s1") is None
        assert await store.console_session("s2") is not None
        # an expired session is not read, and maintenance deletes it
        await sql(database_url, "UPDATE console_sessions SET expires_at = now()")
        assert await store.console_session("s2") is None
        assert await store.clean_console(limit=10) == 1
        assert await scalar(database_url, "SELECT count(*) FROM console_sessions") == 0
        # renaming the tenant ends nothing; a new key does
        await store.create_console_session("s3", tenant, key_hash, max_age_seconds=60)
        await sql(database_url, "UPDATE tenants SET name = 'renamed' WHERE id = $1", tenant)
        assert await store.console_session("s3") is not None
        await sql(database_url, "UPDATE tenants SET api_key_hash = 'new' WHERE id = $1", tenant)
        assert await scalar(database_url, "SELECT count(*) FROM console_sessions") == 0
        # a session of a deleted tenant goes with it
        await sql(database_url, "UPDATE tenants SET api_key_hash = $2 WHERE id = $1", tenant,
                  key_hash)  # fmt: skip
        await store.create_console_session("s4", tenant, key_hash, max_age_seconds=60)
        await sql(database_url, "DELETE FROM tenants WHERE id = $1", tenant)
        assert await scalar(database_url, "SELECT count(*) FROM console_sessions") == 0
        assert await store.console_session("s4") is None


async def test_failed_sign_ins_are_counted_per_address_and_forgotten(database_url: str) -> None:
    async with open_store(database_url) as store:
        assert await store.signin_failures("a", forget_after_seconds=FORGET) is None
        for _ in range(3):
            await store.signin_failed("a", forget_after_seconds=FORGET)
        await store.signin_failed("b", forget_after_seconds=FORGET)
        failures = await store.signin_failures("a", forget_after_seconds=FORGET)
        assert failures is not None
        assert failures.count == 3
        assert 0 <= failures.quiet_seconds < 5
        # quiet for the while: forgotten, and a new failure counts from one
        await sql(database_url, "UPDATE console_signin_failures SET last_failed_at = "
                                "now() - interval '16 minutes' WHERE address = 'a'")  # fmt: skip
        assert await store.signin_failures("a", forget_after_seconds=FORGET) is None
        assert await store.clean_console(limit=10) == 1  # a's row; b's stays
        await store.signin_failed("a", forget_after_seconds=FORGET)
        failures = await store.signin_failures("a", forget_after_seconds=FORGET)
        assert failures is not None
        assert failures.count == 1
        await store.signin_succeeded("b")
        assert await store.signin_failures("b", forget_after_seconds=FORGET) is None
