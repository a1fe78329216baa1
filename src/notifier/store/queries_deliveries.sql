-- Named queries of the API's deliveries and their replay (store/deliveries.py). Each block starts
-- with `-- name: NAME`; the SQL functions they call (notifier_*) are in schema.sql.

-- name: delivery_list
SELECT id, event_id, channel_id, channel_type, status, attempt, max_attempts, last_error,
       next_attempt_at, delivered_at, created_at
FROM deliveries
WHERE tenant_id = $1
  AND ($2::text IS NULL OR status = $2)
  AND ($3::uuid IS NULL OR channel_id = $3)
  AND ($4::uuid IS NULL OR event_id = $4)
  AND ($5::timestamptz IS NULL OR (created_at, id) < ($5, $6::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $7;

-- name: delivery_get
SELECT id, event_id, channel_id, channel_type, status, attempt, max_attempts, last_error,
       next_attempt_at, delivered_at, created_at
FROM deliveries
WHERE tenant_id = $1 AND id = $2;

-- name: delivery_attempts
SELECT attempt, outcome, status_code, duration_ms, error, response_excerpt, started_at, trace_id,
       span_id
FROM delivery_attempts WHERE delivery_id = $1 ORDER BY id;

-- name: replay_check
-- One delivery of a tenant, with the state of its channel and whether its event's payload was
-- expunged, locked for the replay that follows.
SELECT d.status, notifier_channel_state(c) AS channel_state,
       e.payload_expunged_at IS NOT NULL AS expunged
FROM deliveries d LEFT JOIN channels c ON c.id = d.channel_id
JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at
WHERE d.tenant_id = $1 AND d.id = $2
FOR UPDATE OF d;

-- name: replay
-- Enqueue finished deliveries of tenant $1 again, through the outbox: status $2 (DEAD or
-- DELIVERED), optionally only delivery $3, channel $4, event types matching pattern $5 (exact,
-- 'prefix.*' or '*'), created in [$6, $7), coming after ($9, $10) in (created_at, id) order (a
-- bulk replay's cursor); at most $8, oldest first. Only deliveries whose channel exists and is
-- enabled, and whose event's payload was not expunged (the message would carry no payload),
-- are taken. Returns their ids and creation times.
--
-- Attempt numbers keep increasing across replays: the replay is an entry of the history of its
-- own, a 'replayed' attempt row numbered after every entry before it (no error: nothing failed),
-- and the message asks for the number after that. The delivery gets a fresh attempt budget
-- counted from the replay: its max_attempts (the highest number its attempts may reach) becomes
-- the replay's number plus its budget, which is its max_attempts less the number of the replay
-- before (a replay's row written before the numbers kept increasing carries a note in `error`,
-- and is not one). The message takes the channel's current config.
WITH picked AS (
    SELECT d.id, d.attempt, d.max_attempts, c.config, d.channel_id, d.created_at,
           c.ordering = 'fifo' AS fifo
    FROM deliveries d
    JOIN channels c ON c.id = d.channel_id AND c.enabled
    JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at
    WHERE d.tenant_id = $1 AND d.status = $2 AND e.payload_expunged_at IS NULL
      AND ($3::uuid IS NULL OR d.id = $3)
      AND ($4::uuid IS NULL OR d.channel_id = $4)
      AND ($5::text IS NULL OR notifier_type_matches($5, e.type))
      AND ($6::timestamptz IS NULL OR d.created_at >= $6)
      AND ($7::timestamptz IS NULL OR d.created_at < $7)
      AND ($9::timestamptz IS NULL OR (d.created_at, d.id) > ($9, $10::uuid))
    ORDER BY d.created_at, d.id
    LIMIT $8
    FOR UPDATE OF d SKIP LOCKED
),
numbered AS (
    SELECT p.id, p.config, h.entry,
           h.entry + greatest(p.max_attempts - h.last_replay, 1) AS max_attempts
    FROM picked p, LATERAL (
        SELECT greatest(p.attempt, coalesce(max(a.attempt), 0)) + 1 AS entry,
               coalesce(max(a.attempt) FILTER (WHERE a.outcome = 'replayed' AND a.error IS NULL),
                        0) AS last_replay
        FROM delivery_attempts a WHERE a.delivery_id = p.id
    ) h
),
-- A replay is accepted again: a delivery of a channel that is FIFO now takes a new number at the
-- end of its channel's line (README "Ordered delivery (FIFO)"), one of any other none.
fifo_taken AS (
    INSERT INTO fifo_counters AS f (channel_id, last_seq)
    SELECT channel_id, count(*) FROM picked WHERE fifo GROUP BY channel_id ORDER BY channel_id
    ON CONFLICT (channel_id) DO UPDATE SET last_seq = f.last_seq + excluded.last_seq
    RETURNING f.channel_id, f.last_seq
),
sequenced AS (
    SELECT p.id, p.fifo, CASE WHEN p.fifo THEN
        ft.last_seq - count(*) OVER w + row_number() OVER (w ORDER BY p.created_at, p.id)
    END AS fifo_seq
    FROM picked p LEFT JOIN fifo_taken ft ON ft.channel_id = p.channel_id
    WINDOW w AS (PARTITION BY p.channel_id)
),
upd AS (
    UPDATE deliveries d SET
        status = 'PENDING', attempt = n.entry, max_attempts = n.max_attempts, last_error = NULL,
        next_attempt_at = NULL, delivered_at = NULL, updated_at = now(), fifo_seq = sq.fifo_seq
    FROM numbered n JOIN sequenced sq ON sq.id = n.id
    WHERE d.id = n.id
    RETURNING d.id, d.created_at, d.channel_type, d.event_id, d.fifo_seq, d AS delivery
),
logged AS (
    INSERT INTO delivery_attempts
        (delivery_id, attempt, started_at, duration_ms, outcome, delivery_created_at)
    SELECT n.id, n.entry, now(), 0, 'replayed', u.created_at
    FROM numbered n JOIN upd u ON u.id = n.id
),
queued AS (
    INSERT INTO outbox (delivery_id, routing_key, body, traceparent)
    SELECT u.id, u.channel_type || CASE WHEN u.fifo_seq IS NULL THEN '' ELSE '.fifo' END,
           notifier_worker_message(u.delivery, e, n.config, n.entry + 1),
           e.traceparent
    FROM upd u JOIN numbered n ON n.id = u.id
    JOIN events e ON e.id = u.event_id AND e.created_at = u.created_at
)
SELECT id, created_at FROM upd;

-- name: replay_more
-- Whether deliveries matching the replay's filter are left after ($7, $8) in (created_at, id)
-- order (the same filter as `replay`).
SELECT EXISTS (
    SELECT 1
    FROM deliveries d
    JOIN channels c ON c.id = d.channel_id AND c.enabled
    JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at
    WHERE d.tenant_id = $1 AND d.status = $2 AND e.payload_expunged_at IS NULL
      AND ($3::uuid IS NULL OR d.channel_id = $3)
      AND ($4::text IS NULL OR notifier_type_matches($4, e.type))
      AND ($5::timestamptz IS NULL OR d.created_at >= $5)
      AND ($6::timestamptz IS NULL OR d.created_at < $6)
      AND ($7::timestamptz IS NULL OR (d.created_at, d.id) > ($7, $8::uuid))
);
