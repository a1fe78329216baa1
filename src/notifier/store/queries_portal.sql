-- The customer portal (store/portal.py, notifier/console/portal): portal links, kept by their
-- token's SHA-256, their sessions, and the portal's reads, every one constrained in SQL to the
-- tenant AND the link's scope: the channels labelled with its customer ($2), or its channel ids
-- ($3). Times are Postgres's, so that every process of the fleet counts on one clock.

-- name: portal_unknown_channels
-- Those of channel ids $2 that are not tenant $1's.
SELECT given.channel_id FROM unnest($2::uuid[]) AS given (channel_id)
WHERE NOT EXISTS (SELECT 1 FROM channels c WHERE c.tenant_id = $1 AND c.id = given.channel_id);

-- name: portal_link_create
INSERT INTO portal_links (id, tenant_id, token_hash, customer, channel_ids, expires_at)
VALUES ($1, $2, $3, $4, $5, now() + $6::double precision * interval '1 second')
RETURNING *, 'active' AS state;

-- name: portal_link_list
-- Tenant $1's links, newest first, before ($2, $3) in (created_at, id) order; at most $4.
SELECT *, CASE WHEN revoked_at IS NOT NULL THEN 'revoked'
               WHEN expires_at <= now() THEN 'expired' ELSE 'active' END AS state
FROM portal_links
WHERE tenant_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $4;

-- name: portal_link_revoke
-- Revoke tenant $1's link $2 (a revoked one stays as it was) and end its sessions.
WITH revoked AS (
    UPDATE portal_links SET revoked_at = coalesce(revoked_at, now())
    WHERE tenant_id = $1 AND id = $2
    RETURNING *
), ended AS (
    DELETE FROM portal_sessions WHERE link_id IN (SELECT id FROM revoked)
)
SELECT *, 'revoked' AS state FROM revoked;

-- name: portal_link_by_token
-- The link of token hash $1, whichever its state, if its tenant is enabled.
SELECT l.*, CASE WHEN l.revoked_at IS NOT NULL THEN 'revoked'
                 WHEN l.expires_at <= now() THEN 'expired' ELSE 'active' END AS state
FROM portal_links l JOIN tenants t ON t.id = l.tenant_id AND t.enabled
WHERE l.token_hash = $1;

-- name: portal_session_create
-- A session $1 (an id's hash) of link $2, ending when the link does or after $3 seconds; the
-- link keeps its newest $4 sessions, this one included: older ones end (the deletion reads the
-- rows as they were before this insert, so it keeps the newest $4 - 1 of them).
WITH made AS (
    INSERT INTO portal_sessions (id_hash, link_id, expires_at)
    SELECT $1, l.id, least(l.expires_at, now() + $3::double precision * interval '1 second')
    FROM portal_links l
    WHERE l.id = $2 AND l.revoked_at IS NULL AND l.expires_at > now()
    RETURNING expires_at
),
ended AS (
    DELETE FROM portal_sessions
    WHERE EXISTS (SELECT 1 FROM made) AND id_hash IN (
        SELECT id_hash FROM portal_sessions WHERE link_id = $2
        ORDER BY created_at DESC, id_hash DESC
        OFFSET greatest($4::integer - 1, 0)
    )
)
SELECT expires_at FROM made;

-- name: portal_session_touch
-- The session $1 with its link's scope, while neither it nor its link has expired, its link is
-- not revoked and its tenant is enabled; its last_seen_at moved to now.
UPDATE portal_sessions s SET last_seen_at = now()
FROM portal_links l, tenants t
WHERE s.id_hash = $1 AND s.expires_at > now()
  AND l.id = s.link_id AND l.revoked_at IS NULL AND l.expires_at > now()
  AND t.id = l.tenant_id AND t.enabled
RETURNING l.id AS link_id, l.tenant_id, l.customer, l.channel_ids, s.expires_at;

-- name: portal_session_end
DELETE FROM portal_sessions WHERE id_hash = $1;

-- name: portal_sessions_cleanup
-- Sessions past their end, a batch of at most $1.
DELETE FROM portal_sessions
WHERE id_hash IN (
    SELECT id_hash FROM portal_sessions WHERE expires_at <= now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
RETURNING id_hash;

-- name: portal_links_cleanup
-- Links that expired or were revoked more than $2 days ago, a batch of at most $1 (their
-- sessions go with them).
DELETE FROM portal_links
WHERE id IN (
    SELECT id FROM portal_links
    WHERE least(expires_at, coalesce(revoked_at, expires_at))
          <= now() - $2::double precision * interval '1 day'
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
RETURNING id;

-- name: portal_channels
-- Tenant $1's channels in the scope ($2 customer, or $3 channel ids), oldest first; at most $4.
SELECT * FROM channels c
WHERE c.tenant_id = $1 AND (c.customer = $2::text OR c.id = ANY($3::uuid[]))
ORDER BY c.created_at, c.id
LIMIT $4;

-- name: portal_channel
-- Tenant $1's channel $4, if it is in the scope ($2, $3).
SELECT * FROM channels c
WHERE c.tenant_id = $1 AND c.id = $4 AND (c.customer = $2::text OR c.id = ANY($3::uuid[]));

-- name: portal_deliveries
-- Tenant $1's deliveries to channels in the scope ($2, $3), newest first, with their event's type:
-- status $4, channel $5, before ($6, $7) in (created_at, id) order; at most $8.
SELECT d.id, d.event_id, d.channel_id, d.channel_type, d.status, d.attempt, d.max_attempts,
       d.last_error, d.next_attempt_at, d.delivered_at, d.created_at, e.type AS event_type
FROM deliveries d
JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at
WHERE d.tenant_id = $1
  AND d.channel_id IN (SELECT c.id FROM channels c
                       WHERE c.tenant_id = $1 AND (c.customer = $2::text OR c.id = ANY($3::uuid[])))
  AND ($4::text IS NULL OR d.status = $4)
  AND ($5::uuid IS NULL OR d.channel_id = $5)
  AND ($6::timestamptz IS NULL OR (d.created_at, d.id) < ($6, $7::uuid))
ORDER BY d.created_at DESC, d.id DESC
LIMIT $8;

-- name: portal_delivery_in_scope
-- Whether tenant $1's delivery $4 goes to a channel in the scope ($2, $3).
SELECT EXISTS (
    SELECT 1 FROM deliveries d JOIN channels c ON c.id = d.channel_id AND c.tenant_id = $1
    WHERE d.tenant_id = $1 AND d.id = $4 AND (c.customer = $2::text OR c.id = ANY($3::uuid[]))
);
