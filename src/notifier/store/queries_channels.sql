-- Named queries of a tenant's channels (store/channels.py). Each block starts with
-- `-- name: NAME`; the SQL functions they call (notifier_*) are in schema.sql.

-- name: channel_insert
-- $11 is the payload filter (NULL: none), $12 the jsonpath it compiles to (notifier.filters),
-- $13 the customer label (NULL: none), $14 the ordering ('none' or 'fifo').
INSERT INTO channels (id, tenant_id, type, name, config, recipient, event_types, enabled, max_attempts,
                      rate_limit_per_second, filter, filter_path, customer, ordering)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonpath, $13, $14)
RETURNING *;

-- name: channel_get
SELECT * FROM channels WHERE tenant_id = $1 AND id = $2;

-- name: channel_list
SELECT * FROM channels
WHERE tenant_id = $1
  AND ($2::text IS NULL OR type = $2)
  AND ($3::text IS NULL OR recipient = $3)
  AND ($4::timestamptz IS NULL OR (created_at, id) > ($4, $5::uuid))
  AND ($7::text IS NULL OR customer = $7)
ORDER BY created_at, id
LIMIT $6;

-- name: channel_update
-- Change only the fields named in $3; the others keep what is stored now, so a concurrent change
-- of them (another PATCH, the worker disabling the channel) is never written over. A new config
-- ($5) is made from the stored one (secrets carried over, a rotation's previous secret): it is
-- written only if the config is still $10, the one it was made from; otherwise no row comes back.
-- A new filter ($12) comes with its jsonpath ($13); $14 is the customer label, $15 the ordering.
UPDATE channels SET
    name = CASE WHEN 'name' = ANY($3::text[]) THEN $4 ELSE name END,
    config = CASE WHEN 'config' = ANY($3::text[]) THEN $5 ELSE config END,
    recipient = CASE WHEN 'recipient' = ANY($3::text[]) THEN $6 ELSE recipient END,
    event_types = CASE WHEN 'event_types' = ANY($3::text[]) THEN $7 ELSE event_types END,
    max_attempts = CASE WHEN 'max_attempts' = ANY($3::text[]) THEN $9 ELSE max_attempts END,
    rate_limit_per_second = CASE WHEN 'rate_limit_per_second' = ANY($3::text[]) THEN $11::float8
                                 ELSE rate_limit_per_second END,
    enabled = CASE WHEN 'enabled' = ANY($3::text[]) THEN $8 ELSE enabled END,
    -- a filter and its jsonpath change together ($12, $13; both NULL clear it)
    filter = CASE WHEN 'filter' = ANY($3::text[]) THEN $12::jsonb ELSE filter END,
    filter_path = CASE WHEN 'filter' = ANY($3::text[]) THEN $13::jsonpath ELSE filter_path END,
    customer = CASE WHEN 'customer' = ANY($3::text[]) THEN $14::text ELSE customer END,
    -- a new ordering applies to the events accepted after it (README "Ordered delivery (FIFO)")
    ordering = CASE WHEN 'ordering' = ANY($3::text[]) THEN $15 ELSE ordering END,
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

-- name: fifo_lines
-- The lines of a tenant's FIFO channels $2 (README "Ordered delivery (FIFO)"): per channel with
-- unfinished deliveries, how many, the age of the oldest (since its event was accepted), and
-- whether one is retrying; from deliveries_fifo_idx.
SELECT channel_id, count(*) AS backlog,
       extract(epoch FROM now() - min(created_at))::float8 AS lag_seconds,
       bool_or(status = 'RETRYING') AS retrying
FROM deliveries
WHERE tenant_id = $1 AND channel_id = ANY($2::uuid[]) AND fifo_seq IS NOT NULL
  AND status IN ('PENDING', 'RETRYING')
GROUP BY channel_id;
