-- Named queries of the maintenance loop: reconciler, retention, outbox hygiene
-- (store/maintenance.py). Each block starts with `-- name: NAME`; the SQL functions they call
-- (notifier_*) are in schema.sql.

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
    RETURNING d.id, d.channel_type, d.event_id, d.channel_id, d.attempt, d.created_at,
              d.fifo_seq, d AS delivery
),
queued AS (
    INSERT INTO outbox (delivery_id, routing_key, body, traceparent)
    -- a FIFO delivery's message wakes its channel's line up (README "Ordered delivery (FIFO)")
    SELECT u.id, u.channel_type || CASE WHEN u.fifo_seq IS NULL THEN '' ELSE '.fifo' END,
           notifier_worker_message(u.delivery, e, coalesce(c.config, '{}'::jsonb), u.attempt + 1),
           e.traceparent
    FROM upd u
    JOIN events e ON e.id = u.event_id AND e.created_at = u.created_at
    LEFT JOIN channels c ON c.id = u.channel_id
)
SELECT id FROM upd;

-- name: partitions_ensure
-- The history's partitions of the days $1 to $2 (UTC) that are not there yet (schema.sql).
SELECT notifier_partitions_ensure($1::date, $2::date);

-- name: partitions_due
-- The days of history whose range ended more than $1 days ago, oldest first.
SELECT suffix, from_time, to_time FROM notifier_history_partitions()
WHERE to_time <= now() - $1::integer * interval '1 day';

-- name: partition_drop
-- Drop one day of history unless a delivery of it is unfinished (schema.sql).
SELECT notifier_partition_drop($1::text);

-- name: event_keys_cleanup
-- Up to $2 idempotency keys of events older than $1 days that are gone (their day dropped): a
-- key is kept as long as its event. Each probe is of one partition (by id and created_at).
DELETE FROM event_keys
WHERE (tenant_id, idempotency_key) IN (
    SELECT k.tenant_id, k.idempotency_key FROM event_keys k
    WHERE k.created_at < now() - $1::integer * interval '1 day'
      AND NOT EXISTS (SELECT 1 FROM events e
                      WHERE e.id = k.event_id AND e.created_at = k.created_at)
    ORDER BY k.created_at
    LIMIT $2
    FOR UPDATE OF k SKIP LOCKED
)
RETURNING event_id;

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
