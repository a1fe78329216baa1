-- 0007: the console's server-side sessions and the fleet's count of failed sign-ins.
-- The console's sessions (notifier/console/session.py): one row per signed-in browser, keyed by
-- the SHA-256 of the random session id its cookie holds (the id itself is never stored), with
-- the tenant and the hash of the API key it signed in with. Signing out deletes the row; a
-- tenant's key replaced or the tenant disabled deletes its rows (the trigger below), and a
-- session is only read while its tenant still has that key and is enabled. Maintenance deletes
-- rows past `expires_at` (migrations/0007).
CREATE TABLE IF NOT EXISTS console_sessions (
    id_hash       text PRIMARY KEY,
    tenant_id     uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    api_key_hash  text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS console_sessions_tenant_idx ON console_sessions (tenant_id);
CREATE INDEX IF NOT EXISTS console_sessions_expires_idx ON console_sessions (expires_at);

CREATE OR REPLACE FUNCTION notifier_end_console_sessions() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM console_sessions WHERE tenant_id = NEW.id;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS tenants_end_console_sessions ON tenants;
CREATE TRIGGER tenants_end_console_sessions AFTER UPDATE OF api_key_hash, enabled ON tenants
    FOR EACH ROW
    WHEN (OLD.api_key_hash IS DISTINCT FROM NEW.api_key_hash OR (OLD.enabled AND NOT NEW.enabled))
    EXECUTE FUNCTION notifier_end_console_sessions();

-- Failed console sign-ins per client address, shared by the fleet: after 5 free failures each
-- further attempt from the address waits 1 s, doubling up to 60 s, counted from the last one;
-- an address quiet for 15 minutes starts again from nothing, and maintenance deletes its row.
-- A success deletes it.
CREATE TABLE IF NOT EXISTS console_signin_failures (
    address         text PRIMARY KEY,
    failures        integer NOT NULL,
    last_failed_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS console_signin_failures_last_idx
    ON console_signin_failures (last_failed_at);
