-- Named queries of the store. Each block starts with `-- name: NAME`.

-- name: tenant_create
INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, $2, $3)
RETURNING id, name;

-- name: tenant_by_key_hash
SELECT id FROM tenants WHERE api_key_hash = $1;

-- name: channel_insert
INSERT INTO channels (id, tenant_id, type, name, config, recipient, event_types, enabled, max_attempts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING *;

-- name: channel_get
SELECT * FROM channels WHERE tenant_id = $1 AND id = $2;

-- name: channel_list
SELECT * FROM channels
WHERE tenant_id = $1
  AND ($2::text IS NULL OR type = $2)
  AND ($3::text IS NULL OR recipient = $3)
  AND ($4::timestamptz IS NULL OR (created_at, id) > ($4, $5::uuid))
ORDER BY created_at, id
LIMIT $6;

-- name: channel_update
-- Change only the fields named in $3; the others keep what is stored now, so a concurrent change
-- of them (another PATCH, the worker disabling the channel) is never written over. A new config
-- ($5) is made from the stored one (secrets carried over, a rotation's previous secret): it is
-- written only if the config is still $10, the one it was made from; otherwise no row comes back.
UPDATE channels SET
    name = CASE WHEN 'name' = ANY($3::text[]) THEN $4 ELSE name END,
    config = CASE WHEN 'config' = ANY($3::text[]) THEN $5 ELSE config END,
    recipient = CASE WHEN 'recipient' = ANY($3::text[]) THEN $6 ELSE recipient END,
    event_types = CASE WHEN 'event_types' = ANY($3::text[]) THEN $7 ELSE event_types END,
    max_attempts = CASE WHEN 'max_attempts' = ANY($3::text[]) THEN $9 ELSE max_attempts END,
    enabled = CASE WHEN 'enabled' = ANY($3::text[]) THEN $8 ELSE enabled END,
    disabled_reason = CASE WHEN NOT ('enabled' = ANY($3::text[])) THEN disabled_reason
                           WHEN $8 THEN NULL WHEN enabled THEN 'disabled through the API'
                           ELSE disabled_reason END,
    disabled_at = CASE WHEN NOT ('enabled' = ANY($3::text[])) THEN disabled_at
                       WHEN $8 THEN NULL WHEN enabled THEN now() ELSE disabled_at END,
    -- enabling a disabled channel starts its health afresh
    consecutive_failures = CASE WHEN 'enabled' = ANY($3::text[]) AND $8 AND NOT enabled THEN 0
                                ELSE consecutive_failures END,
    failing_since = CASE WHEN 'enabled' = ANY($3::text[]) AND $8 AND NOT enabled THEN NULL
                         ELSE failing_since END,
    updated_at = now()
WHERE tenant_id = $1 AND id = $2 AND ($10::jsonb IS NULL OR config = $10::jsonb)
RETURNING *;

-- name: channel_delete
DELETE FROM channels WHERE tenant_id = $1 AND id = $2 RETURNING id;

-- name: channels_owned
SELECT id FROM channels WHERE tenant_id = $1 AND id = ANY($2::uuid[]);

-- name: insert_events
-- One round trip for a whole batch: the events, their fan-out deliveries and the outbox rows
-- carrying each delivery's WorkerMessage (see notifier/messages.py). $2 is a JSON array of
-- {id, type, recipient, payload, idempotency_key, request_hash, channel_ids}; $3 maps a channel
-- type to its default max_attempts. Events whose idempotency key already exists are skipped
-- (ON CONFLICT DO NOTHING) and come back absent from the result. Events are inserted in key
-- order, not in the order given: an insert whose key a concurrent transaction has just inserted
-- waits for that one to finish, so two batches carrying the same keys in different orders would
-- each wait for the other (a deadlock) — taking the keys in one order for all, they cannot.
WITH input AS (
    SELECT * FROM jsonb_to_recordset($2::jsonb) AS x(
        id uuid, type text, recipient text, payload jsonb, idempotency_key text,
        request_hash text, channel_ids uuid[], ord integer)
),
ev AS (
    INSERT INTO events (id, tenant_id, type, recipient, payload, idempotency_key, request_hash)
    SELECT id, $1, type, recipient, payload, idempotency_key, request_hash FROM input
    ORDER BY idempotency_key COLLATE "C", ord
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id, type, recipient, payload, created_at
),
targets AS (
    SELECT gen_random_uuid() AS delivery_id, ev.id AS event_id, c.id AS channel_id,
           c.type AS channel_type, c.config,
           coalesce(c.max_attempts, ($3::jsonb ->> c.type)::integer, 5) AS max_attempts
    FROM ev
    JOIN input i ON i.id = ev.id
    JOIN channels c ON c.tenant_id = $1 AND c.enabled AND (
        CASE WHEN i.channel_ids IS NOT NULL THEN c.id = ANY (i.channel_ids)
        ELSE c.recipient IS NOT DISTINCT FROM ev.recipient
             AND EXISTS (
                 SELECT 1 FROM unnest(c.event_types) AS p
                 WHERE p = '*' OR p = ev.type
                    OR (right(p, 2) = '.*' AND starts_with(ev.type, left(p, -1))))
        END)
),
dl AS (
    INSERT INTO deliveries (id, event_id, channel_id, tenant_id, channel_type, max_attempts)
    SELECT delivery_id, event_id, channel_id, $1, channel_type, max_attempts FROM targets
),
ob AS (
    INSERT INTO outbox (delivery_id, routing_key, body)
    SELECT t.delivery_id, t.channel_type, convert_to(jsonb_build_object(
               'delivery_id', t.delivery_id, 'event_id', ev.id, 'tenant_id', $1::uuid,
               'channel_id', t.channel_id, 'channel_type', t.channel_type,
               'channel_config', t.config, 'event_type', ev.type, 'recipient', ev.recipient,
               'payload', ev.payload, 'created_at', ev.created_at,
               'attempt', 1, 'max_attempts', t.max_attempts)::text, 'UTF8')
    FROM targets t JOIN ev ON ev.id = t.event_id
)
SELECT ev.id, ev.type, ev.recipient, ev.payload, ev.created_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'id', t.delivery_id, 'channel_id', t.channel_id,
                     'channel_type', t.channel_type, 'status', 'PENDING')
                     ORDER BY t.channel_id)
                 FROM targets t WHERE t.event_id = ev.id), '[]'::jsonb) AS deliveries
FROM ev;

-- name: events_by_keys
SELECT e.id, e.type, e.recipient, e.payload, e.idempotency_key, e.request_hash, e.created_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'id', d.id, 'channel_id', d.channel_id,
                     'channel_type', d.channel_type, 'status', d.status) ORDER BY d.channel_id)
                 FROM deliveries d WHERE d.event_id = e.id), '[]'::jsonb) AS deliveries
FROM events e
WHERE e.tenant_id = $1 AND e.idempotency_key = ANY($2::text[]);

-- name: event_get
SELECT e.id, e.type, e.recipient, e.payload, e.idempotency_key, e.created_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'id', d.id, 'channel_id', d.channel_id,
                     'channel_type', d.channel_type, 'status', d.status) ORDER BY d.channel_id)
                 FROM deliveries d WHERE d.event_id = e.id), '[]'::jsonb) AS deliveries
FROM events e
WHERE e.tenant_id = $1 AND e.id = $2;

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
SELECT attempt, outcome, status_code, duration_ms, error, started_at
FROM delivery_attempts WHERE delivery_id = $1 ORDER BY id;

-- name: delivery_states
-- With the state of the delivery's channel: a delivery is not attempted while its channel is
-- disabled or deleted.
SELECT d.id, d.status, d.attempt,
       CASE WHEN c.id IS NULL THEN 'deleted' WHEN c.enabled THEN 'enabled' ELSE 'disabled' END
           AS channel_state,
       c.disabled_reason
FROM deliveries d LEFT JOIN channels c ON c.id = d.channel_id
WHERE d.id = ANY($1::uuid[]);


-- name: attempt_record_batch
-- Settle attempts (one row of each array per attempt): move each delivery forward (never out of
-- DELIVERED or DEAD, never back to an older attempt) and write its attempt row, in one
-- statement. A NULL status (a rate-limited attempt) keeps the delivery's status, attempt and
-- last error and only moves next_attempt_at. Returns, per input row, whether its delivery moved.
--
-- Channel health in the same statement: per channel, a success resets the count of consecutive
-- failures, and each failed attempt ('retry' or 'dead') after the batch's last success adds to
-- it. A channel is disabled when an attempt says its destination is gone (disable_channel, the
-- error as the reason) or when it has been failing without a success for longer than $12
-- seconds (0 = never). Channel rows are locked in id order, so concurrent batches cannot
-- deadlock on them.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::integer[], $3::text[], $4::text[], $5::timestamptz[],
                         $6::integer[], $7::integer[], $8::text[], $9::text[], $10::timestamptz[],
                         $11::boolean[])
        AS r(delivery_id, attempt, status, outcome, started_at, duration_ms, status_code, error,
             response_excerpt, next_attempt_at, disable_channel)
),
counted AS (
    SELECT d.channel_id, r.outcome, r.started_at, r.error, r.disable_channel,
           max(r.started_at) FILTER (WHERE r.outcome = 'delivered')
               OVER (PARTITION BY d.channel_id) AS last_success
    FROM input r JOIN deliveries d ON d.id = r.delivery_id
    WHERE r.outcome IN ('delivered', 'retry', 'dead')
),
per_channel AS (
    SELECT channel_id,
           max(last_success) AS last_success,
           count(*) FILTER (WHERE outcome <> 'delivered'
                            AND (last_success IS NULL OR started_at > last_success)) AS failures,
           min(started_at) FILTER (WHERE outcome <> 'delivered'
                            AND (last_success IS NULL OR started_at > last_success))
               AS first_failure,
           bool_or(disable_channel) AS gone,
           max(error) FILTER (WHERE disable_channel) AS gone_reason
    FROM counted GROUP BY channel_id
),
health AS (
    SELECT c.id,
           CASE WHEN p.last_success IS NULL THEN c.consecutive_failures + p.failures
                ELSE p.failures END AS failures,
           CASE WHEN p.failures = 0 AND p.last_success IS NOT NULL THEN NULL
                WHEN p.last_success IS NULL THEN coalesce(c.failing_since, p.first_failure)
                ELSE p.first_failure END AS failing_since,
           greatest(c.last_success_at, p.last_success) AS last_success_at,
           p.gone, p.gone_reason
    FROM channels c JOIN per_channel p ON p.channel_id = c.id
    ORDER BY c.id
    FOR UPDATE OF c
),
verdict AS (
    SELECT h.*,
           CASE WHEN h.gone THEN h.gone_reason
                WHEN $12::float8 > 0 AND h.failing_since IS NOT NULL
                     AND h.failing_since < now() - $12::float8 * interval '1 second'
                THEN format('failing without a success since %s (%s consecutive failures)',
                            to_char(h.failing_since AT TIME ZONE 'UTC',
                                    'YYYY-MM-DD"T"HH24:MI:SS"Z"'), h.failures)
           END AS disable_reason
    FROM health h
),
channel_upd AS (
    UPDATE channels c SET
        consecutive_failures = v.failures,
        failing_since = v.failing_since,
        last_success_at = v.last_success_at,
        enabled = c.enabled AND v.disable_reason IS NULL,
        disabled_reason = CASE WHEN c.enabled AND v.disable_reason IS NOT NULL
                               THEN v.disable_reason ELSE c.disabled_reason END,
        disabled_at = CASE WHEN c.enabled AND v.disable_reason IS NOT NULL
                           THEN now() ELSE c.disabled_at END,
        updated_at = CASE WHEN c.enabled AND v.disable_reason IS NOT NULL
                          THEN now() ELSE c.updated_at END
    FROM verdict v
    WHERE c.id = v.id
),
upd AS (
    UPDATE deliveries d SET
        status = coalesce(r.status, d.status),
        attempt = CASE WHEN r.status IS NULL THEN d.attempt ELSE r.attempt END,
        last_error = CASE WHEN r.status IS NULL THEN d.last_error ELSE r.error END,
        next_attempt_at = r.next_attempt_at,
        delivered_at = CASE WHEN r.status = 'DELIVERED' THEN now() ELSE d.delivered_at END,
        updated_at = now()
    FROM input r
    WHERE d.id = r.delivery_id AND d.status NOT IN ('DELIVERED', 'DEAD') AND d.attempt <= r.attempt
    RETURNING d.id
),
ins AS (
    INSERT INTO delivery_attempts
        (delivery_id, attempt, started_at, duration_ms, outcome, status_code, error, response_excerpt)
    SELECT r.delivery_id, r.attempt, r.started_at, r.duration_ms, r.outcome, r.status_code, r.error,
           r.response_excerpt
    FROM input r
    WHERE EXISTS (SELECT 1 FROM deliveries WHERE id = r.delivery_id)
)
SELECT r.delivery_id, EXISTS (SELECT 1 FROM upd WHERE upd.id = r.delivery_id) AS moved FROM input r;

-- name: outbox_claim
-- Fresh rows in id order plus refused rows whose wait is over, locked so that concurrent relays
-- skip them. No id cursor: rows from transactions that commit out of order are never skipped.
WITH fresh AS (
    SELECT id, delivery_id, routing_key, body, created_at FROM outbox
    WHERE publish_failures = 0
    ORDER BY id LIMIT $1
    FOR UPDATE SKIP LOCKED
),
due AS (
    SELECT id, delivery_id, routing_key, body, created_at FROM outbox
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
