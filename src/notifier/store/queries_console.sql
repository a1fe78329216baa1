-- The console's reads (notifier/console): deliveries found by what the API's list has no
-- parameter for, counted, and summed per hour. Every query names the tenant.

-- name: console_deliveries
-- Tenant $1's deliveries, newest first, with their event's type: status $2, channel $3, event
-- types matching pattern $4 (notifier_type_matches), created in [$5, $6), before ($7, $8) in
-- (created_at, id) order (the page's cursor); at most $9.
SELECT d.id, d.event_id, d.channel_id, d.channel_type, d.status, d.attempt, d.max_attempts,
       d.last_error, d.next_attempt_at, d.delivered_at, d.created_at, e.type AS event_type
FROM deliveries d
JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at
WHERE d.tenant_id = $1
  AND ($2::text IS NULL OR d.status = $2)
  AND ($3::uuid IS NULL OR d.channel_id = $3)
  AND ($4::text IS NULL OR notifier_type_matches($4, e.type))
  AND ($5::timestamptz IS NULL OR d.created_at >= $5)
  AND ($6::timestamptz IS NULL OR d.created_at < $6)
  AND ($7::timestamptz IS NULL OR (d.created_at, d.id) < ($7, $8::uuid))
ORDER BY d.created_at DESC, d.id DESC
LIMIT $9;

-- name: console_count
-- How many of tenant $1's deliveries the filters of console_deliveries ($2 to $6) match; with
-- $7, only those of enabled channels whose event's payload is there (what the bulk replay,
-- query replay, takes).
SELECT count(*)
FROM deliveries d
JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at
WHERE d.tenant_id = $1
  AND ($2::text IS NULL OR d.status = $2)
  AND ($3::uuid IS NULL OR d.channel_id = $3)
  AND ($4::text IS NULL OR notifier_type_matches($4, e.type))
  AND ($5::timestamptz IS NULL OR d.created_at >= $5)
  AND ($6::timestamptz IS NULL OR d.created_at < $6)
  AND (NOT $7::boolean
       OR e.payload_expunged_at IS NULL
          AND EXISTS (SELECT 1 FROM channels c WHERE c.id = d.channel_id AND c.enabled));

-- name: console_hourly
-- Tenant $1's deliveries created in the day up to $2, per status and per whole hours before $2
-- (0: the last 60 minutes).
SELECT floor(extract(epoch FROM ($2::timestamptz - created_at)) / 3600)::integer AS hours_ago,
       status, count(*)::integer AS count
FROM deliveries
WHERE tenant_id = $1 AND created_at > $2::timestamptz - interval '1 day' AND created_at <= $2
GROUP BY 1, 2;
