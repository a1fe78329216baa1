-- The console's sessions and the fleet's count of failed sign-ins (store/console_sessions.py).
-- Times are Postgres's, so that every process of the fleet counts on one clock.

-- name: console_session_create
-- A session of tenant $2, signed in with the key whose hash is $3, lasting $4 seconds; $1 is
-- the SHA-256 of its id.
INSERT INTO console_sessions (id_hash, tenant_id, api_key_hash, expires_at)
VALUES ($1, $2, $3, now() + $4::double precision * interval '1 second');

-- name: console_session_touch
-- The session $1 (an id's hash), if it has not expired and its tenant still has that key and is
-- enabled; its last_seen_at moved to now.
UPDATE console_sessions s SET last_seen_at = now()
FROM tenants t
WHERE s.id_hash = $1 AND s.expires_at > now()
  AND t.id = s.tenant_id AND t.api_key_hash = s.api_key_hash AND t.enabled
RETURNING s.tenant_id, s.api_key_hash;

-- name: console_session_end
DELETE FROM console_sessions WHERE id_hash = $1;

-- name: console_signin_failures
-- Address $1's failures in a row and the seconds since the last one, unless it has been quiet
-- for $2 seconds (then it starts again from nothing).
SELECT failures, extract(epoch FROM now() - last_failed_at)::double precision AS quiet_seconds
FROM console_signin_failures
WHERE address = $1 AND last_failed_at > now() - $2::double precision * interval '1 second';

-- name: console_signin_failed
-- One more failure of address $1; a row quiet for $2 seconds counts from one again.
INSERT INTO console_signin_failures AS f (address, failures) VALUES ($1, 1)
ON CONFLICT (address) DO UPDATE
SET failures = CASE WHEN f.last_failed_at > now() - $2::double precision * interval '1 second'
                    THEN f.failures + 1 ELSE 1 END,
    last_failed_at = now();

-- name: console_signin_succeeded
DELETE FROM console_signin_failures WHERE address = $1;

-- name: console_sessions_cleanup
-- Expired sessions, a batch of at most $1.
DELETE FROM console_sessions
WHERE id_hash IN (
    SELECT id_hash FROM console_sessions WHERE expires_at <= now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
RETURNING id_hash;

-- name: console_signin_failures_cleanup
-- Addresses quiet for $2 seconds (their count is forgotten), a batch of at most $1.
DELETE FROM console_signin_failures
WHERE address IN (
    SELECT address FROM console_signin_failures
    WHERE last_failed_at <= now() - $2::double precision * interval '1 second'
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
RETURNING address;
