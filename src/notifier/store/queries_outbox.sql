-- Named queries of the relay's outbox (store/outbox.py). Each block starts with `-- name: NAME`;
-- the SQL functions they call (notifier_*) are in schema.sql.

-- name: outbox_claim
-- Fresh rows in id order plus refused rows whose wait is over, locked so that concurrent relays
-- skip them. No id cursor: rows from transactions that commit out of order are never skipped.
WITH fresh AS (
    SELECT id, delivery_id, routing_key, body, created_at, traceparent FROM outbox
    WHERE publish_failures = 0
    ORDER BY id LIMIT $1
    FOR UPDATE SKIP LOCKED
),
due AS (
    SELECT id, delivery_id, routing_key, body, created_at, traceparent FROM outbox
    WHERE publish_failures > 0 AND available_at <= now()
    ORDER BY available_at LIMIT $1
    FOR UPDATE SKIP LOCKED
)
SELECT * FROM fresh UNION ALL SELECT * FROM due
LIMIT $1;

-- name: outbox_delete
DELETE FROM outbox WHERE id = ANY($1::bigint[]);

-- name: outbox_refused
-- Rows the broker refused: try again after a growing wait (1 s, 2 s, 4 s ... capped at 5 min).
UPDATE outbox SET
    publish_failures = publish_failures + 1,
    available_at = now() + least(300, power(2, publish_failures)) * interval '1 second',
    last_error = r.error
FROM unnest($1::bigint[], $2::text[]) AS r(id, error)
WHERE outbox.id = r.id;

-- name: outbox_depth
SELECT count(*) FROM outbox;
