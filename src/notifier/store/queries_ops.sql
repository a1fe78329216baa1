-- Named queries of the operations features: replay, the reconciler, retention, outbox hygiene.

-- name: replay_check
-- One delivery of a tenant, with the state of its channel, locked for the replay that follows.
SELECT d.status,
       CASE WHEN c.id IS NULL THEN 'deleted' WHEN c.enabled THEN 'enabled' ELSE 'disabled' END
           AS channel_state
FROM deliveries d LEFT JOIN channels c ON c.id = d.channel_id
WHERE d.tenant_id = $1 AND d.id = $2
FOR UPDATE OF d;

-- name: replay
-- Enqueue finished deliveries of tenant $1 again, through the outbox: status $2 (DEAD or
-- DELIVERED), optionally only delivery $3, channel $4, event types matching pattern $5 (exact,
-- 'prefix.*' or '*'), created in [$6, $7), coming after ($10, $11) in (created_at, id) order (a
-- bulk replay's cursor); at most $8, oldest first. Only deliveries whose
-- channel exists and is enabled are taken. Each gets a fresh attempt budget (attempt 0, the
-- message asks for attempt 1), the channel's current config, and a 'replayed' attempt row
-- (numbered with the attempts it had made) so the log shows the replay. Returns their ids and
-- creation times.
WITH picked AS (
    SELECT d.id, d.attempt, c.config
    FROM deliveries d
    JOIN channels c ON c.id = d.channel_id AND c.enabled
    JOIN events e ON e.id = d.event_id
    WHERE d.tenant_id = $1 AND d.status = $2
      AND ($3::uuid IS NULL OR d.id = $3)
      AND ($4::uuid IS NULL OR d.channel_id = $4)
      AND ($5::text IS NULL OR $5 = '*' OR e.type = $5
           OR (right($5, 2) = '.*' AND starts_with(e.type, left($5, -1))))
      AND ($6::timestamptz IS NULL OR d.created_at >= $6)
      AND ($7::timestamptz IS NULL OR d.created_at < $7)
      AND ($10::timestamptz IS NULL OR (d.created_at, d.id) > ($10, $11::uuid))
    ORDER BY d.created_at, d.id
    LIMIT $8
    FOR UPDATE OF d SKIP LOCKED
),
upd AS (
    UPDATE deliveries d SET
        status = 'PENDING', attempt = 0, last_error = NULL, next_attempt_at = NULL,
        delivered_at = NULL, updated_at = now()
    FROM picked p
    WHERE d.id = p.id
    RETURNING d.id, d.created_at, d.channel_type, d.event_id, d AS delivery
),
logged AS (
    INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, error)
    SELECT p.id, p.attempt, now(), 0, 'replayed', $9
    FROM picked p
),
queued AS (
    INSERT INTO outbox (delivery_id, routing_key, body)
    SELECT u.id, u.channel_type, notifier_worker_message(u.delivery, e, p.config, 1)
    FROM upd u JOIN picked p ON p.id = u.id JOIN events e ON e.id = u.event_id
)
SELECT id, created_at FROM upd;

-- name: replay_more
-- Whether deliveries matching the replay's filter are left after ($7, $8) in (created_at, id)
-- order (the same filter as `replay`).
SELECT EXISTS (
    SELECT 1
    FROM deliveries d
    JOIN channels c ON c.id = d.channel_id AND c.enabled
    JOIN events e ON e.id = d.event_id
    WHERE d.tenant_id = $1 AND d.status = $2
      AND ($3::uuid IS NULL OR d.channel_id = $3)
      AND ($4::text IS NULL OR $4 = '*' OR e.type = $4
           OR (right($4, 2) = '.*' AND starts_with(e.type, left($4, -1))))
      AND ($5::timestamptz IS NULL OR d.created_at >= $5)
      AND ($6::timestamptz IS NULL OR d.created_at < $6)
      AND ($7::timestamptz IS NULL OR (d.created_at, d.id) > ($7, $8::uuid))
);

-- name: reconcile
-- Deliveries stuck unfinished: PENDING or RETRYING, due more than $1 seconds ago (a PENDING one
-- is due when it was last changed, a RETRYING one at next_attempt_at), with no outbox row.
-- Their message was lost between the outbox and a worker (a deleted queue, a broker that lost
-- its data, a message dead-lettered by the delivery limit): Postgres is the source of truth, so
-- enqueue the next attempt again, with the channel's current config (an empty one for a
-- deleted channel: the worker ends such a delivery DEAD without trying). At most $2 per call.
WITH stuck AS (
    SELECT d.id
    FROM deliveries d
    WHERE d.status IN ('PENDING', 'RETRYING')
      AND coalesce(d.next_attempt_at, d.updated_at) < now() - $1::float8 * interval '1 second'
      AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)
    ORDER BY d.updated_at
    LIMIT $2
    FOR UPDATE OF d SKIP LOCKED
),
upd AS (
    UPDATE deliveries d SET next_attempt_at = now(), updated_at = now()
    FROM stuck s
    WHERE d.id = s.id
    RETURNING d.id, d.channel_type, d.event_id, d.channel_id, d.attempt, d AS delivery
),
queued AS (
    INSERT INTO outbox (delivery_id, routing_key, body)
    SELECT u.id, u.channel_type,
           notifier_worker_message(u.delivery, e, coalesce(c.config, '{}'::jsonb), u.attempt + 1)
    FROM upd u JOIN events e ON e.id = u.event_id LEFT JOIN channels c ON c.id = u.channel_id
)
SELECT id FROM upd;

-- name: retention
-- Delete up to $2 events older than $1 days whose deliveries are all finished (their
-- deliveries and attempts go with them, by cascade). An event with an unfinished delivery is
-- kept, however old: nothing accepted is dropped before it is delivered or dead.
DELETE FROM events
WHERE id IN (
    SELECT e.id FROM events e
    WHERE e.created_at < now() - $1::integer * interval '1 day'
      AND NOT EXISTS (SELECT 1 FROM deliveries d
                      WHERE d.event_id = e.id AND d.status IN ('PENDING', 'RETRYING'))
    ORDER BY e.created_at
    LIMIT $2
    FOR UPDATE OF e SKIP LOCKED
)
RETURNING id;

-- name: outbox_hygiene
-- Outbox rows that can no longer do anything: their delivery is gone (retention) or finished,
-- and they are older than a minute (so a row being written with its delivery is never
-- touched). Locked rows (a relay publishing them) are skipped.
DELETE FROM outbox
WHERE id IN (
    SELECT o.id FROM outbox o
    LEFT JOIN deliveries d ON d.id = o.delivery_id
    WHERE o.created_at < now() - interval '1 minute'
      AND (d.id IS NULL OR d.status IN ('DELIVERED', 'DEAD'))
    LIMIT $1
    FOR UPDATE OF o SKIP LOCKED
)
RETURNING id;

-- name: outbox_refused_count
-- Rows the broker keeps refusing (e.g. a channel type no worker group declares): worth a look.
SELECT count(*) FROM outbox WHERE publish_failures >= $1;
