-- Named queries of the workers: delivery states and settled attempts (store/attempts.py). Each
-- block starts with `-- name: NAME`; the SQL functions they call (notifier_*) are in schema.sql.

-- name: delivery_states
-- With the state of the delivery's channel: a delivery is not attempted while its channel is
-- disabled or deleted; and the channel's rate limit, kept in a shared bucket. `replayed_at`: the
-- number of the delivery's latest replay (`replay` in queries_deliveries.sql; a replay's row
-- from before the numbers kept increasing has a note in `error` and does not count), 0 for
-- none: the backoff starts again after it. One probe of delivery_attempts_replays_idx, which
-- holds the replays alone. [$2, $3]: when the deliveries were created (their messages say), so
-- only the partitions of those days are read, when the statement is planned or as it starts;
-- NULL: from the beginning, to the end of time.
SELECT d.id, d.status, d.attempt, notifier_channel_state(c) AS channel_state,
       c.disabled_reason, c.rate_limit_per_second,
       coalesce((SELECT max(a.attempt) FROM delivery_attempts a
                 WHERE a.delivery_id = d.id AND a.delivery_created_at = d.created_at
                   AND a.delivery_created_at >= coalesce($2::timestamptz, '-infinity')
                   AND a.delivery_created_at <= coalesce($3::timestamptz, 'infinity')
                   AND a.outcome = 'replayed' AND a.error IS NULL),
                0) AS replayed_at
FROM deliveries d LEFT JOIN channels c ON c.id = d.channel_id
WHERE d.id = ANY($1::uuid[])
  AND d.created_at >= coalesce($2::timestamptz, '-infinity')
  AND d.created_at <= coalesce($3::timestamptz, 'infinity');

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
--
-- $15, $16: each attempt's trace and span ids (README, Tracing), NULL when not traced.
--
-- [$13, $14]: when the deliveries were created (their messages say), so only the partitions of
-- those days are read (as in delivery_states). Returns, per input row, whether its delivery was
-- found there too.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::integer[], $3::text[], $4::text[], $5::timestamptz[],
                         $6::integer[], $7::integer[], $8::text[], $9::text[], $10::timestamptz[],
                         $11::boolean[], $15::text[], $16::text[])
        AS r(delivery_id, attempt, status, outcome, started_at, duration_ms, status_code, error,
             response_excerpt, next_attempt_at, disable_channel, trace_id, span_id)
),
counted AS (
    SELECT d.channel_id, r.outcome, r.started_at, r.error, r.disable_channel,
           max(r.started_at) FILTER (WHERE r.outcome = 'delivered')
               OVER (PARTITION BY d.channel_id) AS last_success
    FROM input r JOIN deliveries d ON d.id = r.delivery_id
    WHERE r.outcome IN ('delivered', 'retry', 'dead')
      AND d.created_at BETWEEN coalesce($13::timestamptz, '-infinity')
                     AND coalesce($14::timestamptz, 'infinity')
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
      AND d.created_at BETWEEN coalesce($13::timestamptz, '-infinity')
                     AND coalesce($14::timestamptz, 'infinity')
    RETURNING d.id
),
ins AS (
    INSERT INTO delivery_attempts
        (delivery_id, attempt, started_at, duration_ms, outcome, status_code, error, response_excerpt,
         delivery_created_at, trace_id, span_id)
    SELECT r.delivery_id, r.attempt, r.started_at, r.duration_ms, r.outcome, r.status_code, r.error,
           r.response_excerpt, d.created_at, r.trace_id, r.span_id
    FROM input r JOIN deliveries d ON d.id = r.delivery_id
    WHERE d.created_at BETWEEN coalesce($13::timestamptz, '-infinity')
                     AND coalesce($14::timestamptz, 'infinity')
    RETURNING delivery_id
)
SELECT r.delivery_id, EXISTS (SELECT 1 FROM upd WHERE upd.id = r.delivery_id) AS moved,
       EXISTS (SELECT 1 FROM ins WHERE ins.delivery_id = r.delivery_id) AS found
FROM input r;

-- name: fifo_head
-- The head of a FIFO channel's line (README "Ordered delivery (FIFO)"): its unfinished delivery
-- with the lowest number, as the worker message of its next attempt (with the channel's current
-- config; an empty one for a deleted channel, which the worker ends DEAD without trying), and
-- the seconds until it is due on Postgres's clock (0: due). One probe of deliveries_fifo_idx per
-- day's partition.
SELECT d.id, d.created_at, d.fifo_seq,
       greatest(0, extract(epoch FROM d.next_attempt_at - now()))::float8 AS wait_seconds,
       notifier_worker_message(d, e, coalesce(c.config, '{}'::jsonb), d.attempt + 1) AS body,
       e.traceparent
FROM deliveries d
JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at
LEFT JOIN channels c ON c.id = d.channel_id
WHERE d.channel_id = $1 AND d.fifo_seq IS NOT NULL AND d.status IN ('PENDING', 'RETRYING')
ORDER BY d.fifo_seq
LIMIT 1;
