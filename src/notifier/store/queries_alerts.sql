-- Named queries of the failure alerts (store/alerts.py). Each block starts with `-- name: NAME`.

-- name: dead_history
-- A dead delivery's alert (notifier/alerts): its channel's name (NULL once the channel is
-- deleted) and its latest $4 attempts, newest first, in one statement; always one row at least
-- (the attempt columns NULL when none is found). An attempt row lives in the partition of the
-- day its delivery was created, however many days later it was made: $2 is that creation time
-- (the delivery's message says), so only that partition is read, through
-- delivery_attempts_delivery_idx, backwards and at most $4 rows. NULL $2: every partition is
-- probed (the caller's second try when the day was wrong), still at most $4 rows.
SELECT c.name AS channel_name, a.attempt, a.started_at, a.outcome, a.status_code,
       a.duration_ms, a.error
FROM (SELECT $3::uuid AS channel_id) AS one
LEFT JOIN channels c ON c.id = one.channel_id
LEFT JOIN LATERAL (
    SELECT id, attempt, started_at, outcome, status_code, duration_ms, error
    FROM delivery_attempts
    WHERE delivery_id = $1::uuid
      AND delivery_created_at >= coalesce($2::timestamptz, '-infinity')
      AND delivery_created_at <= coalesce($2::timestamptz, 'infinity')
    ORDER BY id DESC
    LIMIT $4::integer
) a ON true
ORDER BY a.id DESC;
